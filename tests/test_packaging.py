"""The core imports nothing outside PyTorch and the standard library."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROBE = r"""
import sys
import torch  # the one dependency, and whatever it loads itself
before = set(sys.modules)
import softargmax, softargmax.nn, softargmax.losses, softargmax.attention, softargmax.losses.linear
import softargmax.operators.alpha_relu_tau, softargmax.analysis, softargmax.divergences, softargmax.solvers.threshold
x = torch.randn(4, 7)
softargmax.entmax15(x); softargmax.sparsemax(x); softargmax.entmax(x, 1.3)
softargmax.f_softargmax(x, "jensen_shannon"); softargmax.alpha_relu(x)
softargmax.entmax15_loss(x, torch.tensor([0, 1, 2, 3]))
new = {m.split(".")[0] for m in set(sys.modules) - before}
# also ours: the C row solver built as a CPython extension, and the standard library's sysconfig data (it finds
# Python's headers for that build)
ours = {softargmax.backends.cpu.rows._PY_MODULE}
stdlib = {m for m in new if m.startswith("_sysconfigdata_")}
print(" ".join(sorted(new - set(sys.stdlib_module_names) - stdlib - ours - {"softargmax", "torch"})))
"""


def test_core_imports_only_torch_and_the_standard_library():
    env = dict(os.environ, SOFTARGMAX_GPU_KERNELS="0")
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "", f"the core imported third-party modules: {proc.stdout.strip()}"


def test_lazy_submodules_are_listed_and_load():
    import softargmax as sa

    assert {"nn", "inspect"} <= set(dir(sa))
    assert sa.nn.Entmax15 is not None and callable(sa.inspect.alphas)
