-- tollgate: leaky-bucket meter, the mirror of src/algorithm/leaky_bucket.rs, which wraps a token
-- bucket: the token bucket's functions (token_bucket.lua, always included before this file) read
-- as a queue's level, under keys of its own.

-- The leaky-bucket meter for the dispatch (dispatch.lua): load, decide, apply, refund, rebase,
-- check (the token bucket's fused batch check, token_bucket_fast.lua, is the token bucket's alone).
local function lb_algorithm()
  return tb_load, tb_decide, tb_apply, tb_refund, tb_rebase, tb_check
end
