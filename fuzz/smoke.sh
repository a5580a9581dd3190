#!/usr/bin/env bash
# A short cargo-fuzz run of every target in fuzz/ (FUZZ_SECONDS each, default 15), two targets at
# a time (libFuzzer uses one core per run), after a one-time build. Needs a nightly toolchain:
# without one it says why and exits 0. Installs cargo-fuzz if missing. A crash fails the script
# and leaves the input in fuzz/artifacts/<target>/; add it to fuzz/seeds/<target>/ once fixed, so
# the test suite replays it.
#
#   fuzz/smoke.sh          # build, then run every target
#   fuzz/smoke.sh build    # only build
#   fuzz/smoke.sh run      # run (builds first if the build is missing or stale)
set -euo pipefail
cd "$(dirname "$0")"

mode="${1:-all}"
case "$mode" in all | build | run) ;; *) echo "usage: fuzz/smoke.sh [build|run]" >&2; exit 2 ;; esac

printf '\n== fuzz smoke (%s) ==\n' "$mode"
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
  echo "fuzz smoke: skipped: no nightly toolchain (cargo fuzz needs one: rustup toolchain install nightly)"
  exit 0
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked
fi

# --sanitizer none: tollgate is `#![forbid(unsafe_code)]`, so what this run hunts is panics,
# arithmetic overflow (debug assertions are on), hangs and unbounded memory; without
# AddressSanitizer's instrumentation the build is shorter and each second runs more inputs.
# --codegen-units 16 (cargo fuzz's default is 1): the optimiser works on two cores; each input
# runs somewhat slower. `build` and `run` take the same flags, so the runs reuse the build.
flags=(--sanitizer none --codegen-units 16)

if [ "$mode" != run ]; then
  cargo +nightly fuzz build "${flags[@]}"
fi
[ "$mode" = build ] && exit 0

seconds="${FUZZ_SECONDS:-15}"
logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT

# Runs one target for $seconds; its output goes to $logs/<target>.log, its status to .status.
run_one() {
  local target="$1" status=0
  mkdir -p "corpus/$target"
  # corpus/ collects new inputs (git-ignored); seeds/ is the committed starting set.
  cargo +nightly fuzz run "${flags[@]}" "$target" "corpus/$target" "seeds/$target" -- \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    >"$logs/$target.log" 2>&1 || status=$?
  echo "$status" >"$logs/$target.status"
}

targets=()
for target in $(cargo +nightly fuzz list); do
  if [ "$target" = redis_state ] && ! command -v redis-server >/dev/null 2>&1; then
    echo "fuzz smoke: $target skipped: it needs redis-server on PATH"
    continue
  fi
  targets+=("$target")
done

running=0
for target in "${targets[@]}"; do
  if [ "$running" -ge 2 ]; then
    wait -n || true
    running=$((running - 1))
  fi
  echo "fuzz smoke: $target for ${seconds}s"
  run_one "$target" &
  running=$((running + 1))
done
wait || true

failed=0
for target in "${targets[@]}"; do
  if [ "$(cat "$logs/$target.status" 2>/dev/null || echo 1)" != 0 ]; then
    tail -n 40 "$logs/$target.log"
    echo "fuzz smoke: $target FAILED (the input is in fuzz/artifacts/$target/)"
    failed=1
  else
    echo "fuzz smoke: $target: $(grep -E '^stat::(number_of_executed_units|peak_rss_mb)' "$logs/$target.log" | tr -s ' ' | tr '\n' ' ')"
  fi
done
[ "$failed" = 0 ] || exit 1
echo "fuzz smoke: ok"
