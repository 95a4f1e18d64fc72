r"""Export and deployment: what ONNX, ``torch.export`` and TorchScript record for the operators.

* ``torch.onnx.export(model, args)`` works with nothing more once :mod:`softargmax` is
  imported: while the exporter records the model, every operator computes with PyTorch's own
  operators (:mod:`softargmax.solvers.traceable`: sort-based closed forms for sparsemax and
  1.5-entmax, a fixed number of safeguarded Newton steps for the rest), which ONNX has.  Batch
  and sequence dimensions stay dynamic.
* ``torch.jit.trace`` records the same graphs, so a traced module holds only PyTorch's
  operators and runs wherever TorchScript runs (C++ included).
* ``torch.export.export`` and ``torch.compile`` record one ``torch.library`` operator per call
  (``softargmax::normalized``, ``softargmax::alpha_relu``, ``softargmax::normmax``), which runs
  the eager implementation (fused kernels included) and has an autograd formula; a program
  saved with ``torch.export.save`` loads where :mod:`softargmax` is imported.
  :func:`decompositions` replaces those operators by the graphs above, for runtimes without
  Python (and for ``torch.onnx.export`` of an already exported program).
* ``torch.jit.script`` compiles the activation modules of :mod:`softargmax.nn` into calls of
  the same ``torch.library`` operators (loadable where :mod:`softargmax` is imported); modules
  that it cannot compile raise an error that names ``torch.jit.trace`` and ``torch.export``.

Example:

>>> import torch, softargmax
>>> from torch.export import Dim, export
>>> model = torch.nn.Sequential(torch.nn.Linear(4, 6), softargmax.nn.Entmax15())
>>> program = export(model, (torch.randn(3, 4),), dynamic_shapes=({0: Dim.DYNAMIC},))
>>> aten_only = program.run_decompositions(softargmax.export.decompositions())
>>> x = torch.randn(5, 4)
>>> torch.allclose(aten_only.module()(x), model(x), atol=1e-6)
True
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

from ._library_ops import normalized_operator_divergence
from ._traceable import normalized_graph
from .alpha_relu import alpha_relu_graph
from .normmax import normmax_graph

__all__ = ["decompositions"]


def _normalized(x: Tensor, q: Optional[Tensor], alpha: Optional[Tensor], divergence: str, param: float,
                temperature: float, dim: int) -> Tensor:
    return normalized_graph(x, q, alpha, normalized_operator_divergence(divergence, param), temperature,
                            dim % x.dim())


def _alpha_relu(x: Tensor, alpha: float, tau: float) -> Tensor:
    return alpha_relu_graph(x, alpha, tau)


def _normmax(x: Tensor, alpha: Optional[Tensor], alpha_value: float, dim: int) -> Tensor:
    return normmax_graph(x, alpha_value if alpha is None else alpha, dim % x.dim())


def decompositions() -> dict:
    """A decomposition table for ``ExportedProgram.run_decompositions`` that replaces the
    library's ``torch.library`` operators by graphs of PyTorch's own operators.

    Returns:
        ``{operator overload: function}`` for ``softargmax::normalized``, ``softargmax::alpha_relu``
        and ``softargmax::normmax``, merged into ``torch.export.default_decompositions()`` (so
        the result also lowers PyTorch's operators to the core ATen set, as
        ``run_decompositions()`` does by default).

    The decomposed program computes what :func:`torch.onnx.export` records (module docstring),
    equal to the eager operators to float32 rounding, with no gradient formula of its own
    (for inference).  See the module docstring for an example.
    """
    table = torch.export.default_decompositions()
    ops = torch.ops.softargmax
    own: dict[object, Callable] = {
        ops.normalized.default: _normalized,
        ops.alpha_relu.default: _alpha_relu,
        ops.normmax.default: _normmax,
    }
    for op, fn in own.items():
        table[op] = fn
    return table
