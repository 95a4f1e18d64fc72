r"""Export and deployment: what ONNX, ``torch.export`` and TorchScript record for the operators.

* ``torch.onnx.export(model, args)`` works with nothing more once :mod:`softargmax` is
  imported: while the exporter records the model, every operator computes with PyTorch's own
  operators (:mod:`softargmax.solvers.traceable`: sort-based closed forms for sparsemax and
  1.5-entmax, a fixed number of safeguarded Newton steps for the rest), which ONNX has.  Batch
  and sequence dimensions stay dynamic.
* ``torch.jit.trace`` records the same graphs, so a traced module holds only PyTorch's
  operators and runs wherever TorchScript runs (C++ included).
* ``torch.export.export`` and ``torch.compile`` record one ``torch.library`` operator per call
  (``softargmax::normalized``, ``softargmax::alpha_relu``, ``softargmax::normmax``; on a GPU
  ``softargmax::decode_attention`` for :func:`softargmax.decode_attention`'s kernels), which runs
  the eager implementation (fused kernels included) and has an autograd formula (but
  ``decode_attention``, recorded only where no gradient is asked: with one, the materialized path is
  traced); a program
  saved with ``torch.export.save`` loads where :mod:`softargmax` is imported.
  :func:`decompositions` replaces those operators by the graphs above, for runtimes without
  Python (and for ``torch.onnx.export`` of an already exported program).
* ``torch.jit.script`` compiles the activation modules of :mod:`softargmax.nn` into calls of
  the same ``torch.library`` operators (loadable where :mod:`softargmax` is imported); modules
  that it cannot compile raise an error that names ``torch.jit.trace`` and ``torch.export``.

The example of :func:`decompositions` exports a model, decomposes it and checks the result;
the guide "Export and deployment" shows ONNX, TorchScript and the accuracy of each graph.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch import Tensor

from .._utils.tracing import recording_graph
from ._library_ops import normalized_operator_divergence
from ._traceable import normalized_graph
from .alpha_relu import alpha_relu_graph
from .decoding import reference_op
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


def _decode_attention(query: Tensor, key: Tensor, value: Tensor, end: Tensor, start: Tensor, mask: Optional[Tensor],
                      block_table: Optional[Tensor], alpha: Optional[Tensor], alpha_value: Optional[float],
                      scale: float, mapping: str, num_splits: Optional[int], window: Optional[int]) -> Tensor:
    with recording_graph():  # the mapping of the scores by its graph form, whatever else the table holds
        return reference_op(query, key, value, end, start, mask, block_table, alpha, alpha_value, scale, mapping,
                            num_splits, window)


def decompositions() -> dict[Any, Callable[..., Any]]:
    r"""A decomposition table that replaces the library's ``torch.library`` operators by PyTorch's own.

    For ``ExportedProgram.run_decompositions``: each of the library's operators becomes the graph
    that ``torch.onnx.export`` records for it,

    .. math::

        \texttt{normalized}:\ p_j = \frac{q_j\, g(z_j - \tau)}{\sum_i q_i\, g(z_i - \tau)},
        \qquad \texttt{alpha\_relu}:\ p = [(\alpha - 1) x - \tau]_+^{1/(\alpha-1)},
        \qquad \texttt{normmax}:\ p = \operatorname{normalize}\big(\operatorname{entmax}_{2 - 1/\alpha}
        (\tfrac{\alpha x}{\alpha - 1})^{1/\alpha}\big),

    and ``decode_attention`` (the kernels of a decoding step, recorded on a GPU) becomes its materialized path,
    :math:`o = \operatorname{mapping}(z)\, V` with the scores :math:`z` masked to each query's keys (its range, the
    causal and window bounds, ``attn_mask``; grouped heads, a paged cache gathered by its block table),

    with :math:`\tau` from the sort-based closed forms of sparsemax and 1.5-entmax or a fixed number
    of safeguarded Newton steps (:func:`softargmax.solvers.traceable.solve_rows`): equal to the eager
    operators to float32 rounding, with no gradient formula of its own (for inference), and runnable
    where Python and this library are not.  An operator that carries a user's generator (a
    :class:`~softargmax.divergences.CustomDivergence`, by a name of the process that holds it) decomposes in
    that process, into the graph of its functions.

    Returns:
        ``{operator overload: function}`` for ``softargmax::normalized``, ``softargmax::alpha_relu``,
        ``softargmax::normmax`` and ``softargmax::decode_attention``, merged into
        ``torch.export.default_decompositions()`` (so the result also lowers PyTorch's operators to the
        core ATen set, as ``run_decompositions()`` does by default).

    Examples:
        >>> import torch, softargmax as sa
        >>> from torch.export import Dim, export
        >>> _ = torch.manual_seed(0)
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 6), sa.nn.Entmax15())
        >>> program = export(model, (torch.randn(3, 4),), dynamic_shapes=({0: Dim.DYNAMIC},))
        >>> aten_only = program.run_decompositions(sa.export.decompositions())
        >>> ours = lambda p: [str(n.target) for n in p.graph.nodes if str(n.target).startswith("softargmax")]
        >>> ours(program), ours(aten_only)
        (['softargmax.normalized.default'], [])
        >>> x = torch.randn(5, 4)  # another batch size: the dimension stayed dynamic
        >>> torch.allclose(aten_only.module()(x), model(x), atol=1e-6)
        True

    References:
        André F. T. Martins and Ramón F. Astudillo, *From Softmax to Sparsemax: A Sparse Model of
        Attention and Multi-Label Classification*, ICML 2016, https://arxiv.org/abs/1602.02068

        Ben Peters, Vlad Niculae and André F. T. Martins, *Sparse Sequence-to-Sequence Models*, ACL
        2019, https://arxiv.org/abs/1905.05702

        Vincent Roulet, Tianlin Liu, Nino Vieillard, Michael E. Sander and Mathieu Blondel, *Loss
        Functions and Operators Generated by f-Divergences*, 2025, https://arxiv.org/abs/2501.18537
    """
    table = torch.export.default_decompositions()
    ops = torch.ops.softargmax
    own: dict[object, Callable[..., Tensor]] = {
        ops.normalized.default: _normalized,
        ops.alpha_relu.default: _alpha_relu,
        ops.normmax.default: _normmax,
        ops.decode_attention.default: _decode_attention,
    }
    for op, fn in own.items():
        table[op] = fn
    return table
