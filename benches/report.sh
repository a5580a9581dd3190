#!/bin/sh
# Regenerates BENCHMARKS.md and docs/benchmarks/*.svg: runs every bench (each writes its section
# to target/bench-report/<name>.json), then the generator (examples/bench_report), which only
# copies what those files say. A bench that fails or is absent is listed as "not run", unless
# BENCHMARKS.md already holds its section: that section is kept as it was.
#
#   benches/report.sh               # every bench, from a clean results directory
#   benches/report.sh http redis    # only these benches; the others' results are kept
#
# Run from the repository root, on an otherwise idle machine; it takes a few minutes per bench.
set -u
cd "$(dirname "$0")/.." || exit 1
results="${CARGO_TARGET_DIR:-target}/bench-report"
if [ "$#" -eq 0 ]; then
    set -- memory service http shed redis failover hybrid
    rm -f "$results"/*.json
fi
failed=""
for bench in "$@"; do
    case "$bench" in
        redis | failover | hybrid) features="--features redis" ;;
        *) features="" ;;
    esac
    if [ ! -f "benches/$bench.rs" ]; then
        echo "report.sh: benches/$bench.rs does not exist: not run" >&2
        rm -f "$results/$bench.json"
        continue
    fi
    echo "report.sh: cargo bench $features --bench $bench" >&2
    # shellcheck disable=SC2086 # $features is one flag or none
    if ! cargo bench $features --bench "$bench"; then
        echo "report.sh: the $bench bench failed: not run" >&2
        rm -f "$results/$bench.json"
        failed="$failed $bench"
    fi
done
cargo run --release --example bench_report || exit 1
if [ -n "$failed" ]; then
    echo "report.sh: failed:$failed" >&2
    exit 1
fi
