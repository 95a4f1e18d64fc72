r"""The one dispatch point of the fast paths: the fused row solvers and the α-ReLU kernels.

* CUDA tensors (and CPU tensors under Triton's interpreter, for tests) go to the Triton
  kernels of :mod:`softargmax.backends.triton.rows`;
* other CPU tensors go to the C row solver of :mod:`softargmax.backends.cpu.rows`.

:func:`select` is the only function that decides whether a fast path applies; the
consumers (:func:`softargmax.solvers.threshold.solve`, the autograd functions, the losses,
α-ReLU) ask it and call the backend it names, or take the PyTorch path, which is the
reference and gives the same results.  Every backend returns the same
:class:`~softargmax.backends.solution.Solution`.
"""

from __future__ import annotations

from types import ModuleType
from typing import Optional, Union

from torch import Tensor

from ..divergences import Divergence
from .cpu import rows as _cpu_rows
from .kinds import INFINITE_F0_KINDS, kind_of
from .solution import Solution
from .tile_flags import TileFlags
from .triton import losses as _triton_losses
from .triton import rows as _triton_rows
from .triton import tile_gemms as _triton_tile_gemms

__all__ = ["select", "solve", "probabilities", "solve_alpha_rows", "alpha_relu_forward", "alpha_relu_backward",
           "loss_gradient", "softmax_loss_gradient", "alpha_relu_loss_gradient", "scale_loss_gradient", "solve_loss_gradient", "solves_half_rows", "kernel_device",
           "tile_backprop", "skips_tiles", "TileFlags"]

#: the kinds of a dense generator whose candidates-only calls take the C solver on the CPU (their candidates are
#: the full rows on either path): those with ``f(0) = +∞``, and ``None`` (no fused kind: no backend covers it)
_FULL_ROW_CANDIDATES = frozenset({None, *INFINITE_F0_KINDS})


def select(x: Tensor, div: Optional[Divergence] = None, *, q: Optional[Tensor] = None,
           alpha_rows: Optional[Tensor] = None, alpha_relu: Optional[float] = None,
           relu_tau: Union[float, Tensor] = 0.0, candidates_only: bool = False, exact_tau: bool = False,
           row_sums: bool = False) -> Optional[ModuleType]:
    """The backend module whose kernels cover this call, or ``None`` (the PyTorch path).

    Exactly one of ``div`` (a normalized mapping with ``q``), ``alpha_rows`` (α-entmax
    with one α per row, ``[R, 1]``) or ``alpha_relu`` (α of α-ReLU, with its τ ``relu_tau``) names
    the operator.  ``x`` is the ``[R, k]`` rows to solve (or α-ReLU's input).
    ``candidates_only``: the caller computes with the candidates only (the Fenchel–Young
    loss values, normmax's normalization); on CPU the pruned PyTorch solution of a sparse generator is
    cheaper for those than the C solver's dense rows, so no fast path is taken there (the dense generators
    with ``f(0) = +∞``, reverse KL, Jeffrey and reverse χ², take it: their candidates are the full
    rows on either path), unless ``row_sums``: the
    caller needs ``p`` and the loss values' row sums alone (:meth:`~softargmax.backends.solution.Solution.inner`,
    :meth:`~softargmax.backends.solution.Solution.f_sum`, or ``Solution.omega_star``), which the C solver
    computes in double with ``p`` for α-entmax, Jensen–Shannon and squared Hellinger
    (:func:`softargmax.backends.cpu.rows.computes_row_sums`).  ``exact_tau``:
    the caller uses ``τ`` itself (the value of :func:`~softargmax.f_softmax`); a generator
    whose ``τ`` the fused solvers convert with cancellation (``div.hints.fused_tau_exact`` false:
    α near 1) then takes the PyTorch path.

    The rules: a reference measure ``q`` (``[R|1, k]``) is on the C solver's power kind alone (α-entmax and
    the α-divergence with α ∈ (1, 2], sparsemax, χ²; :func:`softargmax.backends.cpu.rows.covers_weights`), on
    the CPU, also for ``candidates_only`` (the PyTorch path prunes no candidates with ``q``); tensors where the Triton
    kernels run go to them (:func:`softargmax.backends.triton.rows.covers`), other CPU tensors to
    the C solver (:func:`softargmax.backends.cpu.rows.covers`); α-ReLU goes to the Triton kernels with a
    float τ and 1 < α <= 2, to the C library's with one τ or one τ per row
    (:func:`softargmax.backends.cpu.rows.covers_alpha_relu`); the operator must be one the
    backend covers (``backend.covers_divergence``: a kind of :func:`softargmax.backends.kinds.kind_of`,
    and the backend's own limits, such as the C solver's rows near α = 1).
    """
    gpu = _triton_rows.usable_device(x)
    if q is not None:
        if gpu or div is None or alpha_rows is not None or alpha_relu is not None or (
                exact_tau and not div.hints.fused_tau_exact):
            return None
        covered = _cpu_rows.covers(x) and _cpu_rows.covers_divergence(x, div) and _cpu_rows.covers_weights(x, div, q)
        return _cpu_rows if covered else None
    if alpha_relu is not None:
        if gpu:
            return _triton_rows if not isinstance(relu_tau, Tensor) and _triton_rows.covers_alpha_relu(x, alpha_relu) \
                else None
        return _cpu_rows if _cpu_rows.covers_alpha_relu(x, alpha_relu, relu_tau) else None
    if not gpu and candidates_only and not (div is not None and (
            (not div.sparse and kind_of(div)[0] in _FULL_ROW_CANDIDATES)
            or (row_sums and _cpu_rows.computes_row_sums(div)))):
        return None
    if exact_tau and div is not None and not div.hints.fused_tau_exact:
        return None
    backend = _triton_rows if gpu else _cpu_rows
    if not backend.covers(x):
        return None
    if alpha_rows is not None:
        return backend if backend.covers_alpha_rows(x, alpha_rows) else None
    return backend if div is not None and backend.covers_divergence(x, div) else None


def solve(z: Tensor, div: Divergence) -> Optional[Solution]:
    """A fused :class:`~softargmax.backends.solution.Solution` of ``z`` ``[R, k]`` with ``q = 1``, or ``None``."""
    backend = select(z, div)
    return None if backend is None else backend.solve(z, div)


def probabilities(z: Tensor, div: Divergence, q: Optional[Tensor] = None) -> Optional[Tensor]:
    """The dense ``[R, k]`` output of a fused solver alone (NaN in rows with NaN or ``+inf``), as
    ``solve(z, div).dense_p()``, or ``None`` where no fused solver covers it.  On the CPU the C
    solver then writes ``p`` alone (for callers that need no gradient).  ``q``: a reference measure
    ``[R|1, k]``, as :func:`select` takes it."""
    backend = select(z, div, q=q)
    if backend is None:
        return None
    if backend is _cpu_rows:
        return _cpu_rows.probabilities(z, div, q)
    sol = backend.solve(z, div, row_sums=False)
    assert sol is not None  # select() said that this backend covers the call
    return sol.dense_p()


def solve_alpha_rows(z: Tensor, alpha2d: Tensor) -> Optional[Solution]:
    """α-entmax with one α per row (``alpha2d`` ``[R, 1]``, every α in (1, 2]) by a fused solver, or ``None``."""
    backend = select(z, alpha_rows=alpha2d)
    return None if backend is None else backend.solve_alpha_rows(z, alpha2d, checked=True)


def alpha_relu_forward(x: Tensor, alpha: float, tau: Union[float, Tensor]) -> Optional[tuple[Tensor, ModuleType]]:
    """α-ReLU by a fused kernel, ``(output in x's dtype, the backend that computed it)``, or ``None`` (the
    PyTorch path): the Triton kernel (a float τ) or the C library's (one τ, or one per row).  The backward
    of an output is :func:`alpha_relu_backward` with that backend, from ``x``."""
    backend = select(x, alpha_relu=alpha, relu_tau=tau)
    if backend is None:
        return None
    y = backend.alpha_relu_forward(x, alpha, tau)
    return None if y is None else (y, backend)


def alpha_relu_backward(backend: ModuleType, x: Tensor, grad: Tensor, alpha: float, tau: Union[float, Tensor],
                        tau_grad: bool = False) -> tuple[Tensor, Optional[Tensor]]:
    """``(∂L/∂x, ∂L/∂τ or None)`` of an output of :func:`alpha_relu_forward` by the same ``backend``
    (``tau_grad``: τ's too, for a tensor τ; the Triton kernels take a float τ only)."""
    if backend is _cpu_rows:
        return _cpu_rows.alpha_relu_backward(x, grad, alpha, tau, tau_grad)
    assert not isinstance(tau, Tensor)  # select() gives the Triton kernels a float τ only
    return _triton_rows.alpha_relu_backward(x, grad, alpha, tau), None


# -- the Fenchel–Young loss epilogue (the GPU loss kernels; None: the PyTorch path) -------------

def kernel_device(t: Tensor) -> bool:
    """Whether ``t`` lives where the GPU kernels run (CUDA, or the CPU under Triton's interpreter in the tests)."""
    return _triton_rows.usable_device(t)


def solves_half_rows(z: Tensor, div: Divergence) -> bool:
    """Whether half-precision rows ``z`` ``[R, k]`` are solved as they are (``p`` in their dtype and the
    float32 row sums of the loss value): the Triton kernels cover them, except the kinds with ``f(0) = +∞``,
    whose loss value sums ``f(p)`` outside the kernel (from ``p`` rounded to half precision it was off by
    several percent); every other solver needs float32."""
    return kind_of(div)[0] not in INFINITE_F0_KINDS and select(z, div, candidates_only=True) is _triton_rows


def solve_loss_gradient(z: Tensor, div: Divergence, index: Tensor,
                        keep: Tensor) -> Optional[tuple[Tensor, Tensor, Tensor, Tensor]]:
    """The Fenchel–Young loss of class indices ``index`` ``[R]`` (kept rows ``keep``) by the GPU row solver
    alone: ``(G = p - y [R, k] (0 in rows not kept), ⟨z, p⟩ [R], Σ f(p) - f(0) [R], bad rows [R, 1])``
    from one launch, ``G`` written by the pass that would write ``p``
    (:func:`softargmax.backends.triton.rows.solve_gradient`); ``None`` where the Triton kernels do not
    take the rows (then :meth:`Solution.dense_p` and :func:`loss_gradient`)."""
    if select(z, div, candidates_only=True, row_sums=True) is not _triton_rows:
        return None
    return _triton_rows.solve_gradient(z, div, index, keep)


def loss_gradient(p: Tensor, index: Optional[Tensor], dense: Optional[Tensor], keep: Tensor,
                  scale: Optional[Tensor] = None, out: Optional[Tensor] = None,
                  tiles: Optional[TileFlags] = None) -> Optional[Tensor]:
    """``(p - y) · scale`` per row, 0 in rows not kept, in one pass where the GPU loss kernels run
    (:func:`softargmax.backends.triton.losses.gradient`; ``tiles``: the marks of its non-zero tiles,
    written there), else ``None``."""
    return _triton_losses.gradient(p, index, dense, keep, scale, out, tiles)


def alpha_relu_loss_gradient(z: Tensor, index: Optional[Tensor], dense: Optional[Tensor], keep: Tensor, alpha: float,
                             tau: float, scale: Optional[Tensor] = None, out: Optional[Tensor] = None,
                             tiles: Optional[TileFlags] = None
                             ) -> Optional[tuple[Tensor, Tensor, Tensor, Optional[Tensor]]]:
    """``(G, Σ p t, ⟨y, z - τ/(α-1)⟩, Σ y^α or None)`` of the α-ReLU loss in one kernel where the GPU loss
    kernels run (:func:`softargmax.backends.triton.losses.alpha_relu_gradient`; ``tiles`` as in
    :func:`loss_gradient`), else ``None``."""
    return _triton_losses.alpha_relu_gradient(z, index, dense, keep, alpha, tau, scale, out, tiles)


def skips_tiles(x: Tensor) -> bool:
    """Whether :func:`tile_backprop` may run for tensors on ``x``'s device: where the GPU kernels run and the
    tile products are on (:func:`softargmax.backends.triton.tile_gemms.set_enabled`)."""
    return _triton_tile_gemms.enabled() and _triton_rows.usable_device(x)


def tile_backprop(G: Tensor, weight: Tensor, h: Tensor, gh: Optional[Tensor], gw: Optional[Tensor],
                  tiles: TileFlags) -> bool:
    """``gh = G W`` and ``gw += Gᵀ h`` over the tiles of ``G`` marked in ``tiles`` only, where the GPU kernels
    run (:func:`softargmax.backends.triton.tile_gemms.backprop`); ``False`` (nothing done) elsewhere."""
    return _triton_tile_gemms.backprop(G, weight, h, gh, gw, tiles)


def scale_loss_gradient(G: Tensor, scale: Tensor, out: Optional[Tensor] = None) -> Optional[Tensor]:
    """``G · scale`` per row (``scale`` ``[R]``), rounded once to ``G``'s dtype, into ``out`` (``G`` for in
    place), in one pass where the GPU loss kernels run (:func:`softargmax.backends.triton.losses.scale_rows`),
    else ``None``."""
    return _triton_losses.scale_rows(G, scale, out)


def softmax_loss_gradient(z: Tensor, index: Optional[Tensor], dense: Optional[Tensor], keep: Tensor,
                          scale: Optional[Tensor] = None,
                          out: Optional[Tensor] = None) -> Optional[tuple[Tensor, Tensor, Tensor]]:
    """``(G, log Σ e^z, ⟨y, z⟩)`` of the softmax loss in one kernel where the GPU loss kernels run
    (:func:`softargmax.backends.triton.losses.softmax_gradient`), else ``None``."""
    return _triton_losses.softmax_gradient(z, index, dense, keep, scale, out)
