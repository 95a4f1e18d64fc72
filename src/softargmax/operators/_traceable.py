r"""The normalized mappings as graphs of PyTorch operators, for exporters (:func:`normalized_graph`).

When ``torch.onnx.export`` or ``torch.jit.trace`` records a call (:func:`softargmax._utils.tracing.graph_mode`
is ``GRAPH``), the public functions compute here instead of in the autograd function and the
fused kernels: the rows along ``dim`` go to :func:`softargmax.solvers.traceable.solve_rows`
(sort-based closed forms for sparsemax and 1.5-entmax, a fixed number of Newton steps for
the rest).  Nothing reads a size or a value into Python, so the recorded graph keeps the
batch and sequence dimensions dynamic.  The same functions decompose the ``torch.library``
operators of an exported program (:func:`softargmax.export.decompositions`).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .._utils.checks import compute_dtype
from ..divergences import AlphaDivergence, Divergence
from ..solvers.traceable import solve_rows

__all__ = ["to_last", "normalized_graph"]


def to_last(t: Tensor, ndim: int, dim: int) -> Tensor:
    """A tensor broadcastable to an ``ndim``-dimensional input, with ``dim`` moved last (leading
    dimensions added by ``unsqueeze``, so no size is recorded as a constant)."""
    for _ in range(ndim - t.dim()):
        t = t.unsqueeze(0)
    return t if dim == ndim - 1 else t.movedim(dim, -1)


def normalized_graph(x: Tensor, q: Optional[Tensor], alpha: Optional[Tensor], divergence: Optional[Divergence],
                     temperature: float, dim: int) -> Tensor:
    """``NormalizedMapping``'s forward (same arguments, checked by the caller) as PyTorch operators."""
    dtype = compute_dtype(x.dtype)
    nd = x.dim()
    z = to_last(x, nd, dim).to(dtype)
    if temperature != 1.0:  # shift before scaling, as the eager path: x / β would round large scores
        m = z.amax(-1, keepdim=True)
        z = (z - torch.where(torch.isfinite(m), m, torch.zeros_like(m))) / temperature
    qz = None if q is None else to_last(q, nd, dim).to(dtype)
    if alpha is not None:  # one α per row: the α-divergence with a tensor parameter, solved in float64
        divergence = AlphaDivergence(to_last(alpha.detach(), nd, dim).to(torch.float64))
    p = solve_rows(z, divergence, qz)
    p = p if dim == nd - 1 else p.movedim(-1, dim)
    return p.to(x.dtype)
