#!/usr/bin/env bash
# Runs every coverage-guided fuzz target in fuzz/ (docs/testing.md, "Fuzzing") for a
# bounded time each, on the stable toolchain: cargo-fuzz (libFuzzer) with no sanitizer
# (the sanitizers need nightly's -Zsanitizer; what the targets read is safe Rust, where an
# out-of-bounds access panics by itself), optimised, with debug assertions and overflow
# checks on.
#
#   tools/fuzz.sh [SECONDS_PER_TARGET [TARGET...]]     (default: 12 seconds, every target)
#   tools/fuzz.sh --total SECONDS [TARGET...]          (what is left after the build, shared;
#                                                       at least 3 s a target)
#
# Installs cargo-fuzz (pinned) under ~/.cache/scalene-rs/fuzz-tools once; builds into
# ~/.cache/scalene-rs/fuzz-target (SCALENE_RS_FUZZ_TARGET_DIR overrides); what a run
# finds goes to ~/.cache/scalene-rs/fuzz-corpus/TARGET (kept between runs: coverage grows
# run after run), never into the committed seeds (fuzz/corpus/TARGET) or the crashes fixed
# (fuzz/regressions/TARGET), which every run replays first.
# Fails when a target crashes (a panic, a hang past 10 s, more than 2 GiB), after running
# the others, naming each reproducer (fuzz/artifacts/TARGET/...) and how to replay it.
set -euo pipefail
cd "$(dirname "$0")/.."

total=
if [ "${1:-}" = --total ]; then
    total="$2"
    shift 2
    seconds=
else
    seconds="${1:-12}"
    shift || true
fi
all=(line_table ring proc_maps elf profile_json stack_walk unwind async_tasks)
if [ "$#" -gt 0 ]; then targets=("$@"); else targets=("${all[@]}"); fi

cache="${XDG_CACHE_HOME:-$HOME/.cache}/scalene-rs"
tools="$cache/fuzz-tools"
target_dir="${SCALENE_RS_FUZZ_TARGET_DIR:-$cache/fuzz-target}"
cargo_fuzz_version=0.13.2
export PATH="$tools/bin:$PATH"

start=$(date +%s)
if [ "$(cargo fuzz --version 2>/dev/null)" != "cargo-fuzz $cargo_fuzz_version" ]; then
    echo "fuzz: installing cargo-fuzz $cargo_fuzz_version into $tools"
    cargo install --locked --quiet --root "$tools" --version "$cargo_fuzz_version" cargo-fuzz
fi

flags=(--sanitizer none --release --debug-assertions --target-dir "$target_dir")
cargo fuzz build "${flags[@]}"
built=$(date +%s)
echo "fuzz: built in $((built - start)) s"
if [ -n "$total" ]; then
    # About 2 s a target go to starting it (cargo-fuzz's check of the build, loading the
    # corpora), outside libFuzzer's own time limit.
    seconds=$(( (total - (built - start)) / ${#targets[@]} - 2 ))
    [ "$seconds" -ge 3 ] || seconds=3
    echo "fuzz: $seconds s a target (of $total s in all)"
fi

failed=()
for t in "${targets[@]}"; do
    found="$cache/fuzz-corpus/$t"
    mkdir -p "$found" "fuzz/artifacts/$t" fuzz/logs
    dirs=("$found" "fuzz/corpus/$t")
    [ -d "fuzz/regressions/$t" ] && dirs+=("fuzz/regressions/$t")
    log="fuzz/logs/$t.log"
    if cargo fuzz run "${flags[@]}" "$t" "${dirs[@]}" -- \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
        -print_final_stats=1 >"$log" 2>&1; then
        execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
        rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
        cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
        echo "fuzz: $t: ok, ${execs:-?} runs in ${seconds} s (${rate:-?}/s), $cov"
    else
        echo "fuzz: $t: FAILED (log: $log)"
        # What failed and where the input is; not the input itself (cargo-fuzz prints it
        # whole, and an ELF file is megabytes of text).
        grep -E -A2 '^(thread .* panicked|==[0-9]+== ERROR)' "$log" | head -20 || true
        grep -E -A2 '^(artifact_prefix|Reproduce with:)' "$log" | grep -v '^--$' | head -8 || true
        failed+=("$t")
    fi
done
echo "fuzz: $(( $(date +%s) - start )) s in all"
if [ "${#failed[@]}" -gt 0 ]; then
    echo "fuzz: crashed: ${failed[*]}; each reproducer is under fuzz/artifacts/TARGET/ (crash-*," \
        "timeout-*, oom-*); replay one with: cargo fuzz run ${flags[*]} TARGET FILE" >&2
    exit 1
fi
