#!/usr/bin/env bash
# Runs every fuzz target (fuzz/README.md) for a bounded time over its committed corpus, and
# fails if any target finds a crash, a hang or a leak.
#
#   scripts/fuzz.sh                  every target, FLOTILLA_FUZZ_SECONDS (default 45) each
#   scripts/fuzz.sh selector window  only these
#
# New corpus entries go to a temporary directory (listed first, so libFuzzer writes there),
# never into fuzz/corpus: a CI run leaves the tree clean. The inputs under
# fuzz/regressions/<target>/ (ones that crashed a target once) are replayed too. A crash is saved under
# fuzz/artifacts/<target>/ and reproduced with `cargo +nightly fuzz run <target> <file>`.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

seconds="${FLOTILLA_FUZZ_SECONDS:-45}"
# One input taking longer than this is reported as a hang.
timeout="${FLOTILLA_FUZZ_TIMEOUT:-10}"
all_targets=(strategy_body run_body selector window version scenario)
if [ "$#" -gt 0 ]; then
    targets=("$@")
else
    targets=("${all_targets[@]}")
fi

if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo +nightly install cargo-fuzz --locked
fi

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

# Build once, so each target's time bound is spent fuzzing.
if [ "$#" -gt 0 ]; then
    for target in "${targets[@]}"; do
        cargo +nightly fuzz build "$target"
    done
else
    cargo +nightly fuzz build
fi

failed=()
for target in "${targets[@]}"; do
    echo "==> fuzz $target for ${seconds}s"
    mkdir -p "$scratch/$target" "fuzz/corpus/$target"
    inputs=("$scratch/$target" "fuzz/corpus/$target")
    # Inputs that once crashed a target are replayed every run.
    if [ -d "fuzz/regressions/$target" ]; then
        inputs+=("fuzz/regressions/$target")
    fi
    # libFuzzer prints a line per new input: keep it in a file, show the end.
    log="$scratch/$target.log"
    if cargo +nightly fuzz run "$target" "${inputs[@]}" -- \
        -max_total_time="$seconds" -rss_limit_mb=2048 -timeout="$timeout" -print_final_stats=1 \
        >"$log" 2>&1; then
        grep -E '^(Done|stat::number_of_executed_units)' "$log" || tail -3 "$log"
    else
        tail -60 "$log"
        failed+=("$target")
    fi
done

if [ "${#failed[@]}" -gt 0 ]; then
    echo "fuzzing found crashes in: ${failed[*]} (inputs under fuzz/artifacts/)" >&2
    exit 1
fi
echo "fuzzing found nothing in ${#targets[@]} target(s)"
