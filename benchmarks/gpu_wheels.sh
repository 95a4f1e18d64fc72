#!/usr/bin/env bash
# The peers that benchmarks/run_gpu.py compares with, as wheels for the GPU machine, into .whl/:
#
#   bash benchmarks/gpu_wheels.sh [--data FOLDER] [DIR]        (DIR default: .whl, which git ignores)
#
# AdaSplash, Liger-Kernel, Cut-Cross-Entropy and the reference entmax package, at the versions pinned
# below, for CPython 3.12 on x86-64 Linux (the GPU machine's Python), downloaded with `pip download
# --no-deps`.  Each wheel's requirements (Requires-Dist, extras left out) are checked against the
# packages the GPU machine's image already has (DEVICE_HAS below); one that is missing there is
# downloaded too, and so on for its own requirements.  torch, triton and the nvidia-* libraries are
# never carried: the machine's own are used.  The folder must stay well under the 64 MiB that
# travels with the working tree: the script fails above 48 MiB.  benchmarks/gpu_all.sh installs
# DIR/*.whl with `pip install --no-deps --target /tmp/site` and puts /tmp/site on PYTHONPATH after src.
# Override a version with e.g. PEERS="adasplash==0.2.2 entmax==1.3" bash benchmarks/gpu_wheels.sh.
#
# --data FOLDER also copies the experiments' datasets (the folder `softargmax reproduce --data-dir`
# takes, holding one folder per dataset; about 48 MB) into .gpu-data/ (git ignores it): the GPU machine
# has no network, and gpu_all.sh points the smoke runs at .gpu-data when it is there.  Wheels and data
# together must stay under 56 MiB.
set -euo pipefail

cd "$(dirname "$0")/.."
DATA=
if [ "${1:-}" = "--data" ]; then
    [ $# -ge 2 ] && [ -d "$2" ] || { echo "gpu_wheels.sh: --data needs the datasets folder, got '${2:-}'" >&2; exit 2; }
    DATA=$2
    shift 2
fi
DIR=${1:-.whl}
PEERS=${PEERS:-"adasplash==0.2.2 liger-kernel==0.8.5 cut-cross-entropy==25.1.1 entmax==1.3"}
PY=${PYTHON:-python3}
LIMIT_MIB=48

# The GPU machine image's Python packages (distribution names), as its image was seen to hold them.
DEVICE_HAS="
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch
build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage
cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops
equinox etils execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch
grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna imageio iniconfig
interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown
markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict
multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro
nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13
nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir
onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker
prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout
pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors
scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers
setuptools shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch
torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton
typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray
xxhash yarl zipp
"
NEVER="torch triton"  # always the machine's own (its CUDA build); nvidia-* likewise

mkdir -p "$DIR"
rm -f "$DIR"/*.whl  # two versions of one package would stop the install on the machine
download() {  # download REQUIREMENT...
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$DIR" "$@"
}

# shellcheck disable=SC2086
download $PEERS
while :; do
    # the requirements of every wheel in DIR that neither the machine nor DIR provides
    missing=$(DEVICE_HAS="$DEVICE_HAS $NEVER" "$PY" - "$DIR" << 'EOF'
import os, re, sys, zipfile

try:
    from packaging.requirements import Requirement
except ImportError:  # pip vendors it
    from pip._vendor.packaging.requirements import Requirement

#: the GPU machine: CPython 3.12 on x86-64 Linux (environment markers are evaluated for it)
TARGET = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
          "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
          "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}

def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()

folder = sys.argv[1]
have = {norm(n) for n in os.environ["DEVICE_HAS"].split()}
wheels = [f for f in os.listdir(folder) if f.endswith(".whl")]
have |= {norm(f.split("-")[0]) for f in wheels}
need = set()
for f in wheels:
    with zipfile.ZipFile(os.path.join(folder, f)) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        for line in z.read(meta).decode("utf-8", "replace").splitlines():
            if not line.startswith("Requires-Dist:"):
                continue
            req = Requirement(line.split(":", 1)[1].strip())
            if req.marker is not None and not req.marker.evaluate(TARGET):
                continue  # an extra's requirement, or one for another Python or platform
            name = norm(req.name)
            if name not in have and not name.startswith("nvidia-"):
                need.add(f"{req.name}{req.specifier}")  # with its version range
                print(f"{f}: needs {req}, which the GPU machine does not have", file=sys.stderr)
print(" ".join(sorted(need)))
EOF
)
    [ -n "$missing" ] || break
    # shellcheck disable=SC2086
    download $missing
done

total=$(du -cb "$DIR"/*.whl | tail -1 | cut -f1)
ls -l "$DIR"/*.whl
echo "$(ls "$DIR"/*.whl | wc -l) wheels, $((total / 1024)) KiB in $DIR"
if [ "$total" -gt $((LIMIT_MIB * 1024 * 1024)) ]; then
    echo "gpu_wheels.sh: $DIR holds more than $LIMIT_MIB MiB: it would not travel with the tree (64 MiB in all)" >&2
    exit 1
fi
if [ -n "$DATA" ]; then
    rm -rf .gpu-data
    mkdir -p .gpu-data
    cp -rL "$DATA"/. .gpu-data/
    data=$(du -sb .gpu-data | cut -f1)
    du -sh .gpu-data/*
    echo "datasets: $((data / 1024)) KiB in .gpu-data"
    if [ $((total + data)) -gt $((56 * 1024 * 1024)) ]; then
        echo "gpu_wheels.sh: wheels and data hold more than 56 MiB: with the tree they would pass the 64 MiB that travels" >&2
        exit 1
    fi
fi
