#!/usr/bin/env bash
# Everything that needs a GPU, in one command that ends by a deadline, with every output in one archive:
#
#   bash benchmarks/gpu_all.sh OUT [--budget SECONDS] [--steps LIST] [--cap STEP=SECONDS]... [--dry-run]
#                                  [--keep] [--translation-runs RUNS] [--translation-preset gpu|gpu-1call]
#                                  [--lm-runs RUNS] [--data-dir DIR] [--skip-tests] [--skip-bench]
#
# Steps, in order of value, each under `timeout` with at most the time left (OUT/gpu-all/logs/STEP.log):
#   wheels           .whl/*.whl (the peers, from benchmarks/gpu_wheels.sh) into /tmp/site, on PYTHONPATH after src
#   env              nvidia-smi, versions, the peers installed                       -> env.txt
#   sanity           benchmarks/gpu_sanity.py: CUDA, a matmul, one Triton kernel     -> sanity.json
#                    (no CUDA: the GPU steps after it are skipped)
#   bench-operators, bench-losses, bench-fused, bench-attention, bench-decode, bench-peers
#                    benchmarks/run_gpu.py --only SECTION, one process each          -> bench/gpu-SECTION.json
#                    (each JSON is rewritten after every case: a killed section keeps what it finished)
#   bench-jax        benchmarks/run_cpu_jax.py on the device JAX finds (XLA on the GPU where a CUDA jaxlib is
#                    installed): the JAX operators and losses against jax.nn.softmax and optax  -> bench/gpu-jax.json
#   compile-report   benchmarks/compile_report.py --quick: the kernels built for sm_90 with this machine's
#                    Triton (registers, spills, shared memory, barriers, CTAs per SM; needs no GPU)
#                                                                                    -> compile-report.json
#   tests            pytest -m gpu (the tests that run on CUDA), xdist               -> tests/junit-gpu.xml
#   tests-compile    tests/test_compile.py -m gpu: torch.compile(fullgraph=True), CUDA graphs,
#                    no host synchronization                                         -> tests/junit-compile.xml
#   smoke            every experiment's smoke preset with --device cuda, in parallel -> smoke/NAME/
#                    (datasets: --data-dir, else $SOFTARGMAX_DATA, else .gpu-data/ from gpu_wheels.sh --data)
#   translation-gpu  with --translation-runs "softmax:1 sparsemax:1" only: those runs of the translation gpu
#                    preset (a few minutes each, not measured yet), into reports/translation-gpu/ (or
#                    $TRANSLATION_OUT) beside its committed records, with --resume; --translation-preset gpu-1call
#                    trains the one-call preset instead (the four systems of one seed in one 9-minute command:
#                    --translation-runs "softmax:1 sparsemax:1 entmax15:1 alpha_relu:1"; estimated, not measured:
#                    docs/translation-gpu.md) into reports/translation-gpu-1call/.  The records this call wrote
#                    (the interleaved timing's records/speed/ too), results.json, report.md, the figures and the
#                    log come back, also when the deadline stops the step (dry run: the smoke preset, into
#                    OUT/translation-dry-run unless $TRANSLATION_OUT is set)                  -> translation-gpu/
#   lm-gpu           with --lm-runs all (every run of the lm gpu preset: Table 3's losses and the learned q, 3 seeds
#                    each, about 40 s a run on an H100, 10 minutes in all) or --lm-runs "kl:0 alpha1.5+q:1" (those
#                    runs): into reports/lm-gpu/ (or $LM_OUT), with --resume, beside its committed records; the
#                    new records, results.json, report.md, figures and the log come back (dry run: the smoke
#                    preset)                                                         -> lm-gpu/
#
# --budget S (default 540: a 10-minute command with a minute to spare) is the deadline for the whole
# run, packing included.  A step gets min(its cap, the time left less the minimum kept for the steps
# after it); one killed there is "killed (deadline)", one that ran past its own cap "killed (cap)",
# and one with no time left "skipped (deadline)".  --cap STEP=S changes a cap (smoke: each
# experiment's).  --steps a,b,... runs those steps only (bench and smoke name their groups).
# --dry-run runs every step on the CPU at smoke sizes (a few of the GPU tests; the default budget is
# then 300 s): the test suite checks the plumbing with it.  PYTHON names the interpreter (default
# python3), GPU_ALL_WORKERS the pytest-xdist workers (default 8 for the tests, 4 for tests-compile).
#
# At the end, on SIGTERM/SIGINT and when the deadline hits, OUT/gpu-all/ is packed into
# OUT/gpu-all.tar.gz (under 16 MiB: huge logs are cut to their head and tail) with OUT/summary.txt
# beside it (one line per step: status, exit code, seconds, limit), and OUT/gpu-all/ is removed
# unless --keep.  Exit status: 0 when every step selected ran and passed, else 1 (2: bad arguments).
set -uo pipefail

usage() { sed -n '2,53p' "$0" | sed 's/^# \{0,1\}//'; }

if [ $# -lt 1 ] || [ "${1#-}" != "$1" ]; then
    usage
    [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ] && exit 0
    exit 2
fi
OUT=$1
shift
die() { echo "gpu_all.sh: $*" >&2; exit 2; }
is_seconds() { [[ "$1" =~ ^[0-9]+$ ]] && [ "$1" -gt 0 ]; }

ALL_STEPS=(wheels env sanity bench-operators bench-losses bench-fused bench-attention bench-decode bench-peers bench-jax
           compile-report tests tests-compile smoke translation-gpu lm-gpu)
declare -A CAP=([wheels]=60 [env]=30 [sanity]=45 [bench-operators]=100 [bench-losses]=45 [bench-fused]=45
                [bench-attention]=150 [bench-decode]=60 [bench-peers]=75 [bench-jax]=45 [compile-report]=60 [tests]=150 [tests-compile]=90 [smoke]=120
                [translation-gpu]=100000 [lm-gpu]=100000)
# the time kept back for a later step while an earlier one runs (a hang early on leaves it this much)
declare -A FLOOR=([tests]=90 [tests-compile]=45 [smoke]=30)
BUDGET=
DRY_RUN=0
KEEP=0
TRANSLATION_RUNS=
TRANSLATION_PRESET=gpu
LM_RUNS=
SKIP_TESTS=0
SKIP_BENCH=0
STEPS=
DATA_ARGS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --budget)
            [ $# -ge 2 ] || die "--budget needs a number of seconds"
            is_seconds "$2" && [ "$2" -ge 10 ] || die "--budget must be a whole number of seconds >= 10, got '$2'"
            BUDGET=$2; shift ;;
        --cap)
            [ $# -ge 2 ] || die "--cap needs STEP=SECONDS"
            name=${2%%=*}; secs=${2#*=}
            [ -n "${CAP[$name]+x}" ] || die "--cap: unknown step '$name' (steps: ${ALL_STEPS[*]})"
            is_seconds "$secs" || die "--cap $name: seconds must be a positive whole number, got '$secs'"
            CAP[$name]=$secs; shift ;;
        --steps)
            [ $# -ge 2 ] || die "--steps needs a comma-separated list"
            STEPS=$2; shift ;;
        --dry-run) DRY_RUN=1 ;;
        --keep) KEEP=1 ;;
        --translation-runs)
            [ $# -ge 2 ] || die "--translation-runs needs runs such as 'softmax:1 sparsemax:1'"
            TRANSLATION_RUNS=${2//,/ }; shift ;;
        --translation-preset)
            [ $# -ge 2 ] || die "--translation-preset needs gpu or gpu-1call"
            case "$2" in gpu|gpu-1call) ;; *) die "--translation-preset must be gpu or gpu-1call, got '$2'" ;; esac
            TRANSLATION_PRESET=$2; shift ;;
        --lm-runs)
            [ $# -ge 2 ] || die "--lm-runs needs 'all' or runs such as 'kl:0 alpha1.5+q:1'"
            LM_RUNS=${2//,/ }; shift ;;
        --skip-tests) SKIP_TESTS=1 ;;
        --skip-bench) SKIP_BENCH=1 ;;
        --data-dir)
            [ $# -ge 2 ] || die "--data-dir needs a folder"
            DATA_ARGS=(--data-dir "$2"); shift ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown option: $1 (see: bash benchmarks/gpu_all.sh --help)" ;;
    esac
    shift
done
[ -n "$BUDGET" ] || { [ "$DRY_RUN" -eq 1 ] && BUDGET=300 || BUDGET=540; }

# which steps run
declare -A SELECTED=()
if [ -n "$STEPS" ]; then
    IFS=, read -r -a wanted <<< "$STEPS"
    for s in "${wanted[@]}"; do
        case "$s" in
            bench) for b in bench-operators bench-losses bench-fused bench-attention bench-decode bench-peers bench-jax; do SELECTED[$b]=1; done ;;
            *) [ -n "${CAP[$s]+x}" ] || die "--steps: unknown step '$s' (steps: ${ALL_STEPS[*]}, bench)"
               SELECTED[$s]=1 ;;
        esac
    done
else
    for s in "${ALL_STEPS[@]}"; do SELECTED[$s]=1; done
    [ -n "$TRANSLATION_RUNS" ] || unset 'SELECTED[translation-gpu]'
    [ -n "$LM_RUNS" ] || unset 'SELECTED[lm-gpu]'
    if [ "$SKIP_TESTS" -eq 1 ]; then unset 'SELECTED[tests]' 'SELECTED[tests-compile]'; fi
    if [ "$SKIP_BENCH" -eq 1 ]; then
        for b in bench-operators bench-losses bench-fused bench-attention bench-decode bench-peers bench-jax; do unset "SELECTED[$b]"; done
    fi
fi

if [ -n "${SELECTED[translation-gpu]+x}" ] && [ -z "$TRANSLATION_RUNS" ]; then
    die "the translation-gpu step needs --translation-runs (e.g. 'softmax:1 sparsemax:1'; with --translation-preset gpu-1call 'softmax:1 sparsemax:1 entmax15:1 alpha_relu:1')"
fi

if [ -n "${SELECTED[lm-gpu]+x}" ] && [ -z "$LM_RUNS" ]; then
    die "the lm-gpu step needs --lm-runs (all, or runs such as 'kl:0 alpha1.5+q:1')"
fi

# paths given relative to the caller's folder stay so after the cd to the repository
mkdir -p "$OUT" || die "cannot create $OUT"
OUT=$(cd "$OUT" && pwd)
if [ ${#DATA_ARGS[@]} -gt 0 ] && [ -d "${DATA_ARGS[1]}" ]; then DATA_ARGS=(--data-dir "$(cd "${DATA_ARGS[1]}" && pwd)"); fi
if [ -n "${TRANSLATION_OUT:-}" ]; then mkdir -p "$TRANSLATION_OUT" && TRANSLATION_OUT=$(cd "$TRANSLATION_OUT" && pwd); fi
if [ -n "${LM_OUT:-}" ]; then mkdir -p "$LM_OUT" && LM_OUT=$(cd "$LM_OUT" && pwd); fi

cd "$(dirname "$0")/.."
REPO=$(pwd)
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif command -v python3 > /dev/null; then PY=python3
else PY=python; fi
WORK=$OUT/gpu-all
ARCHIVE=$OUT/gpu-all.tar.gz
rm -rf "$WORK" "$ARCHIVE" "$OUT/summary.txt"
mkdir -p "$WORK/logs" "$WORK/bench" "$WORK/tests" "$WORK/smoke"
SUMMARY=$WORK/summary.txt

START=$SECONDS
DEADLINE=$((START + BUDGET))
if [ "$BUDGET" -ge 120 ]; then RESERVE=10; else RESERVE=3; fi  # kept for packing
GRACE=5        # timeout's --kill-after: TERM, then KILL this much later
MIN_STEP=3     # a step with less time than this is skipped

if [ "$DRY_RUN" -eq 1 ]; then
    DEVICE=cpu
    SITE=$WORK/site
    BENCH_ARGS=(--device cpu --smoke)
    JAX_BENCH_ARGS=(--rows 4 --sizes 256 --rounds 2)
    XDIST=2
    XDIST_COMPILE=2
    # a few quick GPU tests; on the CPU the full `-m gpu` set runs the kernels in Triton's interpreter (minutes)
    TEST_PATHS=(tests/test_triton_rows.py tests/test_flash_attention.py tests/test_devices.py)
    TEST_FILTER=(-k "switch_off_takes_reference_path or uncovered_arguments or learned_alpha_attention_on_cuda")
    COMPILE_FILTER=(-k "gpu_compile_fullgraph")  # skipped without CUDA: the command line is what is checked
    REPORT_ARGS=(--quick --kernels 'row_kernels.alpha_relu*' --jobs 2)  # a few variants: the plumbing
    export TRITON_INTERPRET=1
else
    DEVICE=cuda
    SITE=/tmp/site
    BENCH_ARGS=()
    JAX_BENCH_ARGS=(--rows 64 --sizes 1024 32768 131072 --rounds 9)
    # 16 cores: 8 workers, each with its own CUDA context and Triton compiles; the on-disk Triton
    # cache is shared, so a kernel compiled by one worker is loaded, not rebuilt, by the others
    XDIST=8
    # 35 tests, 7 of them Inductor compiles (CPU-heavy, one compile thread each: see the step)
    XDIST_COMPILE=4
    TEST_PATHS=(tests)
    TEST_FILTER=()
    COMPILE_FILTER=()
    REPORT_ARGS=(--quick --jobs 8)
fi
if [ -n "${GPU_ALL_WORKERS:-}" ]; then
    [[ "$GPU_ALL_WORKERS" =~ ^[0-9]+$ ]] || die "GPU_ALL_WORKERS must be a whole number of workers, got '$GPU_ALL_WORKERS'"
    XDIST=$GPU_ALL_WORKERS
    XDIST_COMPILE=$GPU_ALL_WORKERS
fi
export PYTHONUNBUFFERED=1 MPLBACKEND=agg
# bench-attention: each implementation of each case stops after this many seconds (the peers,
# which run after ours over every case, their autotuning included); the JSON keeps what finished
export SOFTARGMAX_BENCH_IMPL_LIMIT_S=${SOFTARGMAX_BENCH_IMPL_LIMIT_S:-15}
export SOFTARGMAX_BENCH_PEER_LIMIT_S=${SOFTARGMAX_BENCH_PEER_LIMIT_S:-45}
# and its shorter list of shapes (6 cases up to L = 16384; "full": 14 cases up to 32768)
export SOFTARGMAX_BENCH_ATTENTION_SHAPES=${SOFTARGMAX_BENCH_ATTENTION_SHAPES:-quick}
# the JAX package too: the machine has jax, and the JAX test modules import softargmax_jax at collection
export PYTHONPATH=$REPO/src:$REPO/jax/src${PYTHONPATH:+:$PYTHONPATH}
# the datasets carried along by benchmarks/gpu_wheels.sh --data, unless a folder was named
if [ ${#DATA_ARGS[@]} -eq 0 ] && [ -z "${SOFTARGMAX_DATA:-}" ] && [ -d "$REPO/.gpu-data" ]; then
    export SOFTARGMAX_DATA=$REPO/.gpu-data
fi

# --- bookkeeping ------------------------------------------------------------------------------------
declare -A PID=() T0=() LIMIT=() WHY=()
RUNNING=()
FAILED=0
NO_CUDA=0
PACKED=0

record() {  # record NAME STATUS RC SECONDS LIMIT
    printf '%-26s %-20s %4s %7s %7s\n' "$1" "$2" "$3" "$4" "$5" | tee -a "$SUMMARY"
}

later_floor() {  # the time kept back for the selected steps after $1 (the floors are for 540 s: scaled)
    local name=$1 seen=0 total=0 s
    for s in "${ALL_STEPS[@]}"; do
        if [ "$seen" -eq 1 ] && [ -n "${SELECTED[$s]+x}" ]; then total=$((total + ${FLOOR[$s]:-0})); fi
        [ "$s" = "$name" ] && seen=1
    done
    echo $((total * BUDGET / 540))
}

launch() {  # launch NAME CAPNAME COMMAND...: start in the background under timeout
    local name=$1 capname=$2
    shift 2
    local avail=$((DEADLINE - RESERVE - SECONDS - GRACE - $(later_floor "$capname")))
    local cap=${CAP[$capname]}
    if [ "$avail" -lt "$MIN_STEP" ]; then
        record "$name" "skipped (deadline)" - 0 -
        FAILED=1
        return 1
    fi
    if [ "$cap" -le "$avail" ]; then LIMIT[$name]=$cap; WHY[$name]=cap; else LIMIT[$name]=$avail; WHY[$name]=deadline; fi
    echo "== $name (limit ${LIMIT[$name]} s, ${WHY[$name]}): $*" | tee -a "$WORK/logs/$name.log"
    T0[$name]=$SECONDS
    timeout -k "$GRACE" "${LIMIT[$name]}" "$@" >> "$WORK/logs/$name.log" 2>&1 < /dev/null &
    PID[$name]=$!
    RUNNING+=("$name")
}

collect() {  # wait for every launched step; record each as it ends
    while [ ${#RUNNING[@]} -gt 0 ]; do
        local still=() name
        for name in "${RUNNING[@]}"; do
            if kill -0 "${PID[$name]}" 2> /dev/null; then still+=("$name"); continue; fi
            wait "${PID[$name]}"
            finished "$name" $?
        done
        RUNNING=("${still[@]}")
        [ ${#RUNNING[@]} -eq 0 ] || sleep 1
    done
}

finished() {  # finished NAME RC
    local name=$1 rc=$2 status secs=$((SECONDS - ${T0[$1]}))
    if [ "$rc" -eq 0 ]; then status=ok
    elif { [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; } && [ "$secs" -ge "${LIMIT[$name]}" ]; then
        status="killed (${WHY[$name]})"; FAILED=1
    else status=failed; FAILED=1; fi
    echo "== $name: $status, exit status $rc after $secs s" >> "$WORK/logs/$name.log"
    record "$name" "$status" "$rc" "$secs" "${LIMIT[$name]}"
}

step() {  # step NAME COMMAND...: one step, in the foreground
    [ -n "${SELECTED[$1]+x}" ] || return 0
    if [ "$NO_CUDA" -eq 1 ] && [ "$1" != env ] && [ "$1" != wheels ] && [ "$1" != compile-report ]; then
        record "$1" "skipped (no CUDA)" - 0 -
        FAILED=1
        return 0
    fi
    launch "$1" "$1" "${@:2}" && collect
}

# --- packing: at the end, on a signal, at the deadline ----------------------------------------------
translation_back() {  # what the translation step wrote this call, into the archive (after the step, or when packing)
    [ -f "$WORK/.translation-start" ] && [ -d "${TRANSLATION_OUT:-}" ] || return 0
    mkdir -p "$WORK/translation-gpu/records"
    # the records keep their place under records/ (the interleaved timing is records/speed/interleaved.json)
    (cd "$TRANSLATION_OUT" && find records -name '*.json' -newer "$WORK/.translation-start" \
        -exec cp --parents {} "$WORK/translation-gpu/" \;) 2> /dev/null
    find "$TRANSLATION_OUT" -maxdepth 1 \( -name 'results.json' -o -name 'report.md' -o -name '*.png' \
        -o -name 'log.txt' \) -newer "$WORK/.translation-start" -exec cp {} "$WORK/translation-gpu/" \; 2> /dev/null
}

truncate_big_logs() {  # logs over 4 MiB keep their first 512 KiB and last 3 MiB
    local f size
    while IFS= read -r -d '' f; do
        size=$(stat -c %s "$f")
        if [ "$size" -gt $((4 * 1024 * 1024)) ]; then
            { head -c $((512 * 1024)) "$f"; printf '\n[... %d bytes cut by gpu_all.sh ...]\n' \
                  $((size - 3584 * 1024)); tail -c $((3 * 1024 * 1024)) "$f"; } > "$f.cut" && mv "$f.cut" "$f"
        fi
    done < <(find "$WORK" -type f \( -name '*.log' -o -name '*.txt' -o -name '*.out' \) -print0)
}

pack() {
    [ "$PACKED" -eq 0 ] || return 0
    PACKED=1
    trap '' TERM INT USR1  # packing is not interrupted
    kill "$WATCHDOG" 2> /dev/null
    translation_back  # a step stopped by a signal or the deadline: the records of the runs it finished
    local limit=$((16 * 1024 * 1024 - 65536)) size
    {
        echo "# total $((SECONDS - START)) s of a $BUDGET s budget; exit status $FAILED"
    } >> "$SUMMARY"
    truncate_big_logs
    # checkpoints and model weights stay out; results, reports, figures and logs go in
    tar -czf "$ARCHIVE" -C "$OUT" --exclude='*.pt' --exclude='*.bin' --exclude='*.safetensors' \
        --exclude='gpu-all/site' --exclude='__pycache__' gpu-all 2> /dev/null
    size=$(stat -c %s "$ARCHIVE" 2> /dev/null || echo 0)
    if [ "$size" -gt "$limit" ]; then  # too big: the logs, results and the smoke runs' results only
        echo "# archive of $size bytes too big: smoke outputs other than results.json and log.txt left out" >> "$SUMMARY"
        tar -czf "$ARCHIVE" -C "$OUT" --exclude='gpu-all/site' --exclude='__pycache__' \
            --exclude='gpu-all/smoke/*/*/*' --exclude='*.pt' --exclude='*.png' --exclude='*.pdf' --exclude='*.model' \
            gpu-all 2> /dev/null
        size=$(stat -c %s "$ARCHIVE" 2> /dev/null || echo 0)
    fi
    if [ "$size" -gt "$limit" ]; then
        echo "# still $size bytes: the summary, env, sanity, bench and test results only" >> "$SUMMARY"
        tar -czf "$ARCHIVE" -C "$OUT" gpu-all/summary.txt gpu-all/env.txt gpu-all/sanity.json gpu-all/bench \
            gpu-all/tests gpu-all/compile-report.json 2> /dev/null
    fi
    cp "$SUMMARY" "$OUT/summary.txt"
    [ "$KEEP" -eq 1 ] || rm -rf "$WORK"
    echo "packed $ARCHIVE ($(stat -c %s "$ARCHIVE" 2> /dev/null || echo '?') bytes); summary: $OUT/summary.txt"
}

on_signal() {  # stop the running steps, record them, pack, exit
    local sig=$1 name
    trap '' TERM INT USR1  # a second signal does not stop the packing
    echo "gpu_all.sh: $sig received: stopping ${RUNNING[*]:-nothing}" | tee -a "$SUMMARY"
    for name in "${RUNNING[@]}"; do kill -TERM "${PID[$name]}" 2> /dev/null; done
    sleep 2
    for name in "${RUNNING[@]}"; do
        kill -KILL -- "-${PID[$name]}" 2> /dev/null || kill -KILL "${PID[$name]}" 2> /dev/null
        wait "${PID[$name]}" 2> /dev/null
        record "$name" "killed ($sig)" - $((SECONDS - ${T0[$name]})) "${LIMIT[$name]}"
    done
    RUNNING=()
    FAILED=1
    pack
    exit 1
}
trap 'on_signal TERM' TERM
trap 'on_signal INT' INT
trap 'on_signal deadline' USR1
trap 'pack' EXIT
# the deadline even if something outside the steps hangs: USR1 to this script half the packing reserve early
( sleep $((BUDGET - RESERVE / 2)) & sp=$!; trap 'kill $sp 2> /dev/null; exit 0' TERM; wait $sp && kill -USR1 $$ ) &
WATCHDOG=$!

# --- the run ----------------------------------------------------------------------------------------
{
    echo "# gpu_all.sh: budget $BUDGET s, started $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $([ "$DRY_RUN" -eq 1 ] && echo 'dry run on the CPU' || echo 'device cuda')"
    printf '%-26s %-20s %4s %7s %7s\n' step status rc seconds limit
} | tee "$SUMMARY"

if [ -n "${SELECTED[wheels]+x}" ] && compgen -G "$REPO/.whl/*.whl" > /dev/null; then
    step wheels "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" "$REPO"/.whl/*.whl
    export PYTHONPATH=$PYTHONPATH:$SITE
fi

env_report() {
    echo "## date: $(date -u)"
    echo "## host: $(uname -a); $(nproc) cores"
    free -g 2> /dev/null | head -2
    echo "## nvidia-smi"
    timeout 20 nvidia-smi 2>&1 || echo "nvidia-smi not available"
    echo "## python: $PY ($(command -v "$PY"))"
    echo "## PYTHONPATH=$PYTHONPATH"
    "$PY" - << 'EOF'
import importlib.metadata as md, platform
import torch
print("python", platform.python_version())
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("device", p.name, f"capability {p.major}.{p.minor}", p.multi_processor_count, "SMs",
          round(p.total_memory / 2**30, 1), "GiB", "cudnn", torch.backends.cudnn.version())
for name in ("triton", "numpy", "pytest", "pytest-xdist", "pytest-timeout", "hypothesis", "transformers",
             "entmax", "adasplash", "liger-kernel", "cut-cross-entropy"):
    try:
        print(name, md.version(name))
    except md.PackageNotFoundError:
        print(name, "not installed")
import softargmax
print("softargmax", softargmax.__version__, softargmax.__file__)
EOF
}
if [ -n "${SELECTED[env]+x}" ]; then
    export -f env_report
    export PY
    launch env env bash -c env_report && collect
    cp "$WORK/logs/env.log" "$WORK/env.txt" 2> /dev/null
fi

if [ -n "${SELECTED[sanity]+x}" ]; then
    step sanity "$PY" benchmarks/gpu_sanity.py --device "$DEVICE" --json "$WORK/sanity.json"
    if [ -f "$WORK/sanity.json" ] && grep -q '"status": 3' "$WORK/sanity.json"; then
        NO_CUDA=1
        echo "# no CUDA device: the GPU steps are skipped" | tee -a "$SUMMARY"
    fi
fi

for section in operators losses fused attention decode peers; do
    step "bench-$section" "$PY" benchmarks/run_gpu.py --only "$section" "${BENCH_ARGS[@]}" \
        --json "$WORK/bench/gpu-$section.json"
done
step bench-jax "$PY" benchmarks/run_cpu_jax.py "${JAX_BENCH_ARGS[@]}" --json "$WORK/bench/gpu-jax.json"

# the compile report needs no GPU: it runs even where CUDA is missing
step compile-report "$PY" benchmarks/compile_report.py "${REPORT_ARGS[@]}" --json "$WORK/compile-report.json"

TIMEOUT_ARGS=()
if timeout 60 "$PY" -c "import pytest_timeout" 2> /dev/null; then TIMEOUT_ARGS=(--timeout 120); fi  # one hung test
step tests "$PY" -m pytest "${TEST_PATHS[@]}" -m gpu --ignore=tests/test_compile.py -p no:cacheprovider -q -rfEs \
    --continue-on-collection-errors \
    -n "$XDIST" "${TIMEOUT_ARGS[@]}" --junitxml="$WORK/tests/junit-gpu.xml" "${TEST_FILTER[@]}"
# Inductor compiles in each worker's own process (no pool of compile workers per test process)
step tests-compile env TORCHINDUCTOR_COMPILE_THREADS=1 "$PY" -m pytest tests/test_compile.py -m gpu \
    -p no:cacheprovider -q -rfEs -n "$XDIST_COMPILE" "${TIMEOUT_ARGS[@]}" --junitxml="$WORK/tests/junit-compile.xml" \
    "${COMPILE_FILTER[@]}"

if [ -n "${SELECTED[smoke]+x}" ]; then
    if [ "$NO_CUDA" -eq 1 ]; then
        record smoke "skipped (no CUDA)" - 0 -
        FAILED=1
    else
        names=$(timeout 60 "$PY" -c "from softargmax.experiments import EXPERIMENTS; print(' '.join(EXPERIMENTS))")
        if [ -z "$names" ]; then  # the experiments did not import: no smoke run, and the run has failed
            record smoke "failed (no experiments)" - 0 -
            FAILED=1
        fi
        for name in $names; do  # in parallel, one or two threads each: the models are tiny
            launch "smoke-$name" smoke env OMP_NUM_THREADS=2 "$PY" -m softargmax reproduce "$name" --preset smoke \
                --device "$DEVICE" --out "$WORK/smoke/$name" "${DATA_ARGS[@]}" || true
        done
        collect
    fi
fi

if [ -n "${SELECTED[translation-gpu]+x}" ]; then
    # into the committed folder: the call checks its records against them and estimates the time per run;
    # --resume: a machine reused for a second call still holds the first call's checkpoints (runs/, which git
    # ignores), and a call without it refuses to touch them (the checkpoints' fingerprints are checked).
    # Each preset has its own folder: the setups differ, and records of another setup are refused by name
    if [ "$DRY_RUN" -eq 1 ]; then
        TRANSLATION_RUN_PRESET=smoke
        TRANSLATION_OUT=${TRANSLATION_OUT:-$OUT/translation-dry-run}
    else
        TRANSLATION_RUN_PRESET=$TRANSLATION_PRESET
        if [ "$TRANSLATION_PRESET" = gpu ]; then TRANSLATION_OUT=${TRANSLATION_OUT:-$REPO/reports/translation-gpu}
        else TRANSLATION_OUT=${TRANSLATION_OUT:-$REPO/reports/translation-$TRANSLATION_PRESET}; fi
    fi
    mkdir -p "$TRANSLATION_OUT"
    touch "$WORK/.translation-start"
    # shellcheck disable=SC2086  # the runs are words
    step translation-gpu "$PY" -m softargmax reproduce translation --preset "$TRANSLATION_RUN_PRESET" \
        --device "$DEVICE" --out "$TRANSLATION_OUT" --runs $TRANSLATION_RUNS --resume "${DATA_ARGS[@]}"
    translation_back
fi

if [ -n "${SELECTED[lm-gpu]+x}" ]; then
    # like the translation runs: into the committed folder (its records are checked and merged), with --resume
    LM_OUT=${LM_OUT:-$REPO/reports/lm-gpu}
    if [ "$DRY_RUN" -eq 1 ]; then LM_PRESET=smoke; else LM_PRESET=gpu; fi
    if [ "$LM_RUNS" = all ]; then LM_SELECT=(); else read -r -a LM_SELECT <<< "--runs $LM_RUNS"; fi
    mkdir -p "$LM_OUT"
    touch "$WORK/.lm-start"
    step lm-gpu "$PY" -m softargmax reproduce lm --preset "$LM_PRESET" --device "$DEVICE" --out "$LM_OUT" \
        "${LM_SELECT[@]}" --resume "${DATA_ARGS[@]}"
    mkdir -p "$WORK/lm-gpu/records"
    find "$LM_OUT/records" -name '*.json' -newer "$WORK/.lm-start" -exec cp {} "$WORK/lm-gpu/records/" \; 2> /dev/null
    find "$LM_OUT" -maxdepth 1 \( -name '*.json' -o -name '*.md' -o -name '*.png' -o -name 'log.txt' \) \
        -newer "$WORK/.lm-start" -exec cp {} "$WORK/lm-gpu/" \; 2> /dev/null
fi

pack  # it ignores further signals itself
echo
cat "$OUT/summary.txt"
tar -xzOf "$ARCHIVE" gpu-all/logs/tests.log gpu-all/logs/tests-compile.log 2> /dev/null \
    | grep -E '^(FAILED|ERROR) ' | head -40
exit $FAILED
