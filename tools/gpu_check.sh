#!/usr/bin/env bash
# The real-GPU check of GPU per line (docs/gpu.md): runs fixtures/gpu/torch_lines.py under
# scalene-rs on an NVIDIA GPU, with an unprofiled process (fixtures/gpu/torch_control.py)
# running matrix products on the same GPU during the program's CPU line, and prints each
# marked line's GPU share and memory peak against the bars:
#   MATMUL >= 85% of the program's GPU time, CPU <= 5% (despite the other process),
#   ALLOC's GPU memory peak >= 4096 MiB; and the asynchronous case (LAUNCH queues the
#   products, SYNC waits for them) with its measured split.
# When Scalene is importable (python3 -m scalene), `scalene run --gpu` profiles the same
# fixture beside ours. Needs PyTorch with CUDA; finishes in about 2 minutes.
# Usage: tools/gpu_check.sh [SCALENE_RS_BINARY] [OUTDIR]   (PYTHON=... picks the interpreter)
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-target/release/scalene-rs}
OUT=${2:-/tmp/scalene-rs-gpu-check}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
start=$(date +%s)
nvidia-smi -L || { echo "gpu_check: nvidia-smi found no GPU" >&2; exit 1; }
"$PY" -c 'import torch; assert torch.cuda.is_available(); print("torch", torch.__version__, torch.cuda.get_device_name())' \
    || { echo "gpu_check: PyTorch with CUDA is needed" >&2; exit 1; }

# run_case NAME CASE COMMAND...: the command with GPU_CASE=CASE; with CASE=lines, the
# control process runs beside it.
run_case() {
    local name=$1 case=$2 sync cpid=
    shift 2
    sync=$(mktemp -d)
    if [ "$case" = lines ]; then
        GPU_SYNC_DIR=$sync "$PY" fixtures/gpu/torch_control.py >"$OUT/$name.control" 2>&1 &
        cpid=$!
    fi
    local t0 rc
    t0=$(date +%s%N)
    SCALENE_RS_NVML_TRACE=$OUT/$name.nvml GPU_SYNC_DIR=$sync GPU_CASE=$case timeout 150 "$@" \
        >"$OUT/$name.out" 2>"$OUT/$name.err"
    rc=$?
    echo "$name: exit $rc in $(( ($(date +%s%N) - t0) / 1000000 )) ms" | tee -a "$OUT/summary.txt"
    touch "$sync/cpu_done"
    [ -n "$cpid" ] && wait "$cpid" && cat "$OUT/$name.control"
    rm -rf "$sync"
}

: >"$OUT/summary.txt"
run_case ours-full lines "$BIN" run -o "$OUT/ours-full.json" -- "$PY" fixtures/gpu/torch_lines.py
run_case ours-cpu lines "$BIN" run --cpu-only -o "$OUT/ours-cpu.json" -- "$PY" fixtures/gpu/torch_lines.py
run_case ours-async async "$BIN" run --cpu-only -o "$OUT/ours-async.json" -- "$PY" fixtures/gpu/torch_lines.py
# attach to the fixture started on its own, 1 s after its start (to its end).
sync=$(mktemp -d)
GPU_SYNC_DIR=$sync "$PY" fixtures/gpu/torch_lines.py >"$OUT/attach-target.out" 2>&1 &
tpid=$!
sleep 1
SCALENE_RS_NVML_TRACE=$OUT/ours-attach.nvml timeout 60 "$BIN" attach --cpu-only \
    -o "$OUT/ours-attach.json" "$tpid" >"$OUT/ours-attach.out" 2>"$OUT/ours-attach.err"
echo "ours-attach: exit $? (attached 1 s after the start, to its end)" | tee -a "$OUT/summary.txt"
wait "$tpid"; echo "attach target: exit $?" | tee -a "$OUT/summary.txt"
rm -rf "$sync"
# The terminal report of one run, as a user sees it.
COLUMNS=150 "$BIN" view "$OUT/ours-cpu.json" >"$OUT/ours-cpu.txt" 2>&1
if "$PY" -c 'import scalene' 2>/dev/null; then
    run_case scalene lines "$PY" -m scalene run --gpu -o "$OUT/scalene.json" fixtures/gpu/torch_lines.py
else
    echo "scalene: not installed, not compared" | tee -a "$OUT/summary.txt"
fi
"$PY" tools/gpu_check_report.py "$OUT" | tee -a "$OUT/summary.txt"
echo "gpu_check: $(( $(date +%s) - start )) s in all" | tee -a "$OUT/summary.txt"
