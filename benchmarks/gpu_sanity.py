"""A short check that the GPU works before anything long runs on it (benchmarks/gpu_all.sh, second step).

    python benchmarks/gpu_sanity.py [--device cuda] [--json PATH]

Stage by stage, each printed with its time as soon as it ends: torch sees the device; a
float32 matrix product agrees with the CPU's; 1.5-entmax of a 64×1000 float32 batch goes
through the Triton kernels (the solver reports ``backend == "triton"``), its rows sum to 1
and it agrees with the CPU's answer within 1e-5; forward and backward of the fused
flash attention run.  ``--device cpu`` checks the same plumbing without a GPU (the kernels
then run in Triton's interpreter when ``TRITON_INTERPRET=1``, on a smaller batch).

Exit status: 0 when every stage passed; 3 when the device is not there (no CUDA; the GPU
steps after this one are pointless); 1 when a stage failed.  ``--json`` writes the stages
(name, seconds, ok, detail) and the versions.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

T0 = time.perf_counter()


def _import_torch(info, dev):
    import torch

    info.update(torch=torch.__version__, cuda=torch.version.cuda, python=sys.version.split()[0])
    return f"torch {torch.__version__} (CUDA {torch.version.cuda}), import at {time.perf_counter() - T0:.1f} s"


def _find_device(info, dev):
    import torch

    device = torch.device(dev)

    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("torch.cuda.is_available() is False")
        props = torch.cuda.get_device_properties(device)
        info.update(device=props.name, capability=f"{props.major}.{props.minor}")
        return (f"{props.name}, capability {props.major}.{props.minor}, {props.multi_processor_count} SMs, "
                f"{props.total_memory / 2**30:.0f} GiB")
    return "cpu"


def _matmul(info, dev):
    import torch

    device = torch.device(dev)

    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(512, 512, generator=gen), torch.randn(512, 512, generator=gen)
    ref = a.double() @ b.double()
    got = (a.to(device) @ b.to(device)).double().cpu()
    err = float((got - ref).norm() / ref.norm())
    if not err < 1e-2:  # tf32 is allowed; NaN fails
        raise AssertionError(f"relative error {err:.2e} against float64")
    return f"512x512 float32, relative error {err:.1e}"


def _entmax_kernel(info, dev):
    import torch

    device = torch.device(dev)

    import softargmax as sa
    from softargmax.backends.triton import rows as triton_rows
    from softargmax.divergences import get_divergence
    from softargmax.solvers.threshold import solve

    info.update(softargmax=sa.__version__, triton=_triton_version())
    if not triton_rows.available():
        raise RuntimeError("Triton is not importable: the GPU kernels would not run")
    interpret = device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"
    old = triton_rows.set_cpu_interpret(True) if interpret else None
    try:
        rows, k = (64, 1000) if device.type == "cuda" else (8, 300)  # the interpreter is slow
        x = torch.randn(rows, k, generator=torch.Generator().manual_seed(1)) * 2
        backend = solve(x.to(device), get_divergence("alpha", alpha=1.5)).backend
        p = sa.entmax15(x.to(device)).cpu()
    finally:
        if old is not None:
            triton_rows.set_cpu_interpret(old)
    ref = sa.entmax15(x.double()).float()
    err = float((p - ref).abs().max())
    sums = float((p.sum(-1) - 1).abs().max())
    if device.type == "cuda" and backend != "triton":
        raise AssertionError(f"the solver took the {backend!r} path, not the Triton kernels")
    if not (err < 1e-5 and sums < 1e-5):
        raise AssertionError(f"max |p - p_ref| = {err:.1e}, max |sum p - 1| = {sums:.1e}")
    return f"backend {backend}, triton {info['triton']}, max error {err:.1e}, max |sum-1| {sums:.1e}"


def _flash_attention(info, dev):
    import torch

    device = torch.device(dev)

    from softargmax.backends.triton import flash_attention as FA

    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        return "skipped on cpu without TRITON_INTERPRET=1"
    gen = torch.Generator().manual_seed(2)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shape = (1, 2, 64, 32) if device.type == "cuda" else (1, 1, 32, 16)
    q, k, v = (torch.randn(*shape, generator=gen).to(device, dtype).requires_grad_() for _ in range(3))
    out = FA.flash_attention(q, k, v, is_causal=True, mapping="entmax15")
    out.float().sum().backward()
    if not (torch.isfinite(out).all() and torch.isfinite(q.grad).all()):
        raise AssertionError("non-finite output or gradient")
    if device.type == "cuda":
        torch.cuda.synchronize()
    return f"{'x'.join(map(str, shape))} {str(dtype).replace('torch.', '')} causal, forward and backward finite"


#: (name, check, exit status when it fails: 3 stops the run as "no device"; None: the later stages still run)
STAGES = [("import torch", _import_torch, 1), ("device", _find_device, 3), ("matmul", _matmul, None),
          ("entmax15 kernel", _entmax_kernel, None), ("flash attention", _flash_attention, None)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--json", dest="json_path")
    args = ap.parse_args(argv)
    stages, info, status = [], {}, 0
    for name, check, fatal in STAGES:
        t = time.perf_counter()
        try:
            detail, ok = check(info, args.device), True
        except Exception as err:  # recorded; the next stages still run where they can
            detail, ok = f"{type(err).__name__}: {str(err)[:500]}", False
            if fatal != 3:
                traceback.print_exc()
        stages.append({"stage": name, "seconds": round(time.perf_counter() - t, 2), "ok": ok, "detail": detail})
        print(f"sanity {name:<22} {'ok  ' if ok else 'FAIL'} {stages[-1]['seconds']:6.2f} s  {detail}", flush=True)
        if not ok:
            status = fatal or 1
            if fatal is not None:
                break
    return _finish(args, stages, info, status)


def _triton_version():
    try:
        import triton

        return triton.__version__
    except ImportError:
        return None


def _finish(args, stages, info, status: int) -> int:
    print(f"sanity: {'passed' if status == 0 else 'FAILED'} in {time.perf_counter() - T0:.1f} s", flush=True)
    if args.json_path:
        os.makedirs(os.path.dirname(os.path.abspath(args.json_path)), exist_ok=True)
        with open(args.json_path, "w", encoding="utf-8") as f:
            json.dump({"status": status, "stages": stages, **info}, f, indent=1)
    return status


if __name__ == "__main__":
    sys.exit(main())
