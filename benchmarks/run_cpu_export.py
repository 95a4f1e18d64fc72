"""ONNX export of the operators: the largest difference from eager PyTorch in float32 and the
onnxruntime time per call beside eager PyTorch's (CPU, one thread).

    python benchmarks/run_cpu_export.py                  # writes benchmarks/results/cpu-export.json
    python benchmarks/run_cpu_export.py --quick          # two operators, no JSON

Each operator is exported once (``torch.onnx.export``, batch dimension dynamic, exported with a
batch of 4) and run in onnxruntime on inputs of other batch sizes with masked entries, ties and
an offset of 1e4.  Times are medians of interleaved repeats of ``--calls`` calls each, in the
CPU time of this process (the machine is shared: wall-clock medians measure waits for a core).
"""

import argparse
import math
import os
import statistics
import sys
import time
import warnings

import torch

import softargmax as sa
from softargmax.bench.timing import cpu_model, save, versions

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


class Attention(torch.nn.Module):
    def forward(self, x):
        return sa.attention(x, x, x, mapping="entmax", alpha=torch.tensor([1.2, 1.5, 1.7, 2.0]))


def operators(quick: bool):
    nn = sa.nn
    ops = {"sparsemax": nn.Sparsemax(), "entmax15": nn.Entmax15(), "entmax(1.3)": nn.Entmax(1.3),
           "f_softargmax(jensen_shannon)": nn.FSoftargmax("jensen_shannon"),
           "f_softargmax(reverse_kl, q)": nn.FSoftargmax("reverse_kl", q=torch.rand(64) + 0.5),
           "normmax(3)": nn.Normmax(3.0), "alpha_relu(1.5)": nn.AlphaReLU(1.5, 0.1),
           "attention(entmax, α per head)": Attention()}
    return dict(list(ops.items())[:2]) if quick else ops


def inputs(name, batch):
    g = torch.Generator().manual_seed(batch)
    if name.startswith("attention"):
        return torch.randn(batch, 4, 16, 64, generator=g)
    x = torch.randn(batch, 64, generator=g) * 3
    x[0, 5:20] = -math.inf
    x[1, :10] = x[1].max()
    x[2] += 1e4
    return x


def main(argv=None):
    import onnxruntime as ort

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    rows = []
    print(f"{'operator':<32} {'nodes':>6} {'max |ort - eager|':>18} {'eager':>10} {'onnxruntime':>12}")
    for name, model in operators(args.quick).items():
        model.eval()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prog = torch.onnx.export(model, (inputs(name, 4),), dynamic_shapes=({0: torch.export.Dim.DYNAMIC},),
                                     verbose=False)
        sess = ort.InferenceSession(prog.model_proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        feed = sess.get_inputs()[0].name
        err = 0.0
        for batch in (3, 32):
            x = inputs(name, batch)
            with torch.no_grad():
                ref = model(x)
            got = torch.from_numpy(sess.run(None, {feed: x.numpy()})[0])
            err = max(err, float((got - ref).abs().max()))
        x = inputs(name, 32)
        xn = x.numpy()
        thunks = {"eager": lambda: model(x), "onnxruntime": lambda: sess.run(None, {feed: xn})}
        samples = {k: [] for k in thunks}
        with torch.inference_mode():
            for _ in range(args.repeats):
                for k, fn in thunks.items():
                    t0 = time.process_time()
                    for _ in range(args.calls):
                        fn()
                    samples[k].append((time.process_time() - t0) / args.calls * 1e6)
        us = {k: statistics.median(v) for k, v in samples.items()}
        rows.append({"operator": name, "shape": list(x.shape), "onnx_nodes": len(prog.model_proto.graph.node),
                     "max_abs_error": err, "eager_us": us["eager"], "onnxruntime_us": us["onnxruntime"]})
        print(f"{name:<32} {rows[-1]['onnx_nodes']:>6} {err:>18.2e} {us['eager']:>8.1f}us {us['onnxruntime']:>10.1f}us",
              flush=True)
    result = {"benchmark": "cpu-export", "device": cpu_model(), "threads": 1, "onnxruntime": ort.__version__,
              "clock": "process CPU time, median of interleaved repeats", **versions(), "rows": rows}
    path = args.json or (None if args.quick else os.path.join(RESULTS, "cpu-export.json"))
    if path:
        save(result, path)
        print("wrote", path)


if __name__ == "__main__":
    sys.exit(main())
