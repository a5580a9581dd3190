#!/usr/bin/env bash
# A short cargo-fuzz run of every target in fuzz/ (FUZZ_SECONDS each, default 15: under 2 minutes
# of fuzzing in all, after a one-time build). Needs a nightly toolchain: without one it says why
# and exits 0. Installs cargo-fuzz if missing. A crash fails the script and leaves the input in
# fuzz/artifacts/<target>/; add it to fuzz/seeds/<target>/ once fixed, so the test suite replays it.
set -euo pipefail
cd "$(dirname "$0")"

printf '\n== fuzz smoke ==\n'
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
  echo "fuzz smoke: skipped: no nightly toolchain (cargo fuzz needs one: rustup toolchain install nightly)"
  exit 0
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked
fi
seconds="${FUZZ_SECONDS:-15}"
# No separate `cargo fuzz build`: `cargo fuzz run` builds with its own flags, so a build before it
# would be thrown away (43 s of a 2-core CI run).
for target in $(cargo +nightly fuzz list); do
  if [ "$target" = redis_state ] && ! command -v redis-server >/dev/null 2>&1; then
    echo "fuzz smoke: $target skipped: it needs redis-server on PATH"
    continue
  fi
  mkdir -p "corpus/$target"
  echo "fuzz smoke: $target for ${seconds}s"
  # corpus/ collects new inputs (git-ignored); seeds/ is the committed starting set.
  log="$(mktemp)"
  # --sanitizer none: tollgate is `#![forbid(unsafe_code)]`, so what this run hunts is panics,
  # arithmetic overflow (debug assertions are on), hangs and unbounded memory; without
  # AddressSanitizer's instrumentation the build is shorter and each second runs more inputs.
  if ! cargo +nightly fuzz run --sanitizer none "$target" "corpus/$target" "seeds/$target" -- \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 >"$log" 2>&1; then
    tail -n 40 "$log"
    rm -f "$log"
    echo "fuzz smoke: $target FAILED (the input is in fuzz/artifacts/$target/)"
    exit 1
  fi
  grep -E '^stat::(number_of_executed_units|peak_rss_mb)' "$log" || true
  rm -f "$log"
done
echo "fuzz smoke: ok"
