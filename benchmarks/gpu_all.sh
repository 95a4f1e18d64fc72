#!/usr/bin/env bash
# Everything that needs a GPU, in one go, with every output under one folder:
#
#   bash benchmarks/gpu_all.sh OUT [--translation-gpu] [--data-dir DIR] [--skip-tests] [--skip-bench]
#
#   1. OUT/env.txt          nvidia-smi, torch / triton / softargmax versions
#   2. OUT/logs/tests.log   the test suite on a CUDA machine (the GPU tests run instead of skipping)
#   3. OUT/bench/           benchmarks/run_gpu.py (operators, losses, fused output layer, attention; then
#                           the installed peers) as JSON
#   4. OUT/smoke/NAME/      every experiment's smoke preset with --device cuda
#   5. OUT/translation-gpu/ with --translation-gpu only (long: about 15-20 min on one H100, estimated):
#                           softargmax reproduce translation --preset gpu --device cuda
#
# Every step logs to OUT/logs/STEP.log; a failed step does not stop the others.  OUT/summary.txt
# lists each step with its exit status and seconds; the script exits non-zero if any step failed.
set -uo pipefail

if [ $# -lt 1 ] || [ "${1#-}" != "$1" ]; then
    sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
OUT=$1
shift
TRANSLATION_GPU=0
SKIP_TESTS=0
SKIP_BENCH=0
DATA_ARGS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --translation-gpu) TRANSLATION_GPU=1 ;;
        --skip-tests) SKIP_TESTS=1 ;;
        --skip-bench) SKIP_BENCH=1 ;;
        --data-dir) DATA_ARGS=(--data-dir "$2"); shift ;;
        *) echo "unknown option: $1" >&2; exit 2 ;;
    esac
    shift
done

cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
mkdir -p "$OUT/logs"
OUT=$(cd "$OUT" && pwd)
: > "$OUT/summary.txt"
FAILED=0

step() {  # step NAME COMMAND...: run, log, record status and time
    local name=$1
    shift
    local t0=$SECONDS
    echo "== $name: $*" | tee -a "$OUT/logs/$name.log"
    "$@" >> "$OUT/logs/$name.log" 2>&1
    local rc=$?
    printf '%-40s rc=%d %6ds\n' "$name" "$rc" "$((SECONDS - t0))" | tee -a "$OUT/summary.txt"
    [ "$rc" -eq 0 ] || FAILED=1
}

{
    nvidia-smi || echo "nvidia-smi not available"
    $PY -c "import torch, softargmax; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else ''); print('softargmax', softargmax.__version__, softargmax.__file__)"
    $PY -c "import triton; print('triton', triton.__version__)" || true
} > "$OUT/env.txt" 2>&1

if [ "$SKIP_TESTS" -eq 0 ]; then
    step tests $PY -m pytest tests -q -p no:cacheprovider
fi
if [ "$SKIP_BENCH" -eq 0 ]; then
    mkdir -p "$OUT/bench"
    step bench-gpu $PY benchmarks/run_gpu.py --json "$OUT/bench/gpu.json"
    # AdaSplash, Liger-Kernel, Cut-Cross-Entropy where installed (carried as wheels): each is optional
    step bench-peers $PY benchmarks/run_gpu.py --only peers --json "$OUT/bench/gpu-peers.json"
fi
mkdir -p "$OUT/smoke"
for name in $($PY -c "from softargmax.experiments import EXPERIMENTS; print(' '.join(EXPERIMENTS))"); do
    step "smoke-$name" $PY -m softargmax reproduce "$name" --preset smoke --device cuda \
        --out "$OUT/smoke/$name" "${DATA_ARGS[@]}"
done
if [ "$TRANSLATION_GPU" -eq 1 ]; then
    step translation-gpu $PY -m softargmax reproduce translation --preset gpu --device cuda \
        --out "$OUT/translation-gpu" "${DATA_ARGS[@]}"
fi
cat "$OUT/summary.txt"
exit $FAILED
