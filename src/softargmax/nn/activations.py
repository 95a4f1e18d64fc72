r"""The operators as ``torch.nn`` modules: :class:`Sparsemax`, :class:`Entmax15`, :class:`Entmax`
(optionally learnable α), :class:`AlphaReLU` (optionally calibrating τ on its first training batch),
:class:`FSoftargmax` (optionally learnable reference measure ``q``), :class:`Normmax` and
:class:`BudgetSparsemax`.

A learnable α is kept in ``(alpha_min, alpha_max)`` through the smooth
reparametrization :math:`\alpha = \alpha_{\min} + (\alpha_{\max} - \alpha_{\min}) \operatorname{sigmoid}(w)`
(Correia et al. (2019) keeps α in (1, 2]); a learnable ``q`` is :math:`\exp(\log q)`.

References:

* Gonçalo M. Correia, Vlad Niculae and André F. T. Martins, *Adaptively Sparse Transformers*, EMNLP 2019, https://arxiv.org/abs/1909.00015
* Maxat Tezekbayev, Vassilina Nikoulina, Matthias Gallé and Zhenisbek Assylbekov, *Speeding Up Entmax*, Findings of NAACL 2022, https://arxiv.org/abs/2111.06832
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NoReturn, Optional, Union

import torch
from torch import Tensor, nn

from .._utils.checks import check_alpha, check_positive_number, check_q, check_real, check_tau, check_tensor
from .._utils.tracing import values_checkable
from ..divergences import Divergence, get_divergence, spec_of
from ..operators.alpha_relu import alpha_relu
from ..operators.alpha_relu_tau import from_logits
from ..operators.budget import budget_sparsemax, check_budget
from ..operators.entmax import entmax, entmax15, sparsemax
from ..operators.fdiv import f_softargmax
from ..operators.normmax import normmax
from ._parameters import bounded, bounded_logit, initial_value, placed

__all__ = ["Sparsemax", "Entmax15", "Entmax", "AlphaReLU", "FSoftargmax", "Normmax", "BudgetSparsemax",
           "not_scriptable"]


def not_scriptable(module: nn.Module, why: str) -> TypeError:
    r"""The ``TypeError`` that ``torch.jit.script(module)`` raises for a module it cannot compile.

    A module's ``__prepare_scriptable__`` raises it; the message names the module, the reason, and
    the two other ways to record a module, ``torch.jit.trace`` and ``torch.export.export`` (the
    guide "Export and deployment" and :mod:`softargmax.operators.export`).

    Args:
        module: the module that cannot be compiled.
        why: the reason, a clause.

    Returns:
        the ``TypeError``, to raise.

    Examples:
        ``AlphaReLU(tau="calibrate")`` sets :math:`\tau` from its first training batch; before that,
        there is no :math:`\tau` to compile:

        >>> import torch, softargmax as sa
        >>> _ = torch.manual_seed(0)
        >>> m = sa.nn.AlphaReLU(1.5, tau="calibrate")
        >>> try:
        ...     torch.jit.script(m)
        ... except TypeError as e:
        ...     print(e)
        torch.jit.script cannot compile AlphaReLU: tau='calibrate' sets τ from a training batch first
        (calibrate, then script). Use torch.jit.trace(module, example_inputs) ... instead (see softargmax.export)
        >>> _ = m(torch.randn(16, 10))  # calibrated
        >>> x = torch.randn(4, 10)
        >>> torch.allclose(torch.jit.script(m)(x), m(x))
        True
    """
    return TypeError(f"torch.jit.script cannot compile {type(module).__name__}: {why}. Use "
                     "torch.jit.trace(module, example_inputs) (a graph of PyTorch operators only) or "
                     "torch.export.export(module, args) instead (see softargmax.export)")


class Sparsemax(nn.Module):
    r"""Applies sparsemax along ``dim``: the Euclidean projection onto the probability simplex.

    .. math::

        \operatorname{Sparsemax}(x) = \operatorname*{argmin}_{p \in \Delta} \lVert p - x\rVert_2^2 = [x - \tau]_+,
        \qquad \sum_j p_j = 1,

    :func:`softargmax.sparsemax` as a module.

    Args:
        dim: the dimension that sums to one. Default: ``-1``.

    Shape:
        - Input: :math:`(*)`, any number of dimensions.
        - Output: :math:`(*)`, the shape of the input.

    Examples:
        >>> import torch, softargmax as sa
        >>> m = sa.nn.Sparsemax(dim=-1)
        >>> m
        Sparsemax(dim=-1)
        >>> m(torch.tensor([[1.0, 0.8, -1.0]]))
        tensor([[0.6000, 0.4000, 0.0000]])

    References:
        André F. T. Martins and Ramón F. Astudillo, *From Softmax to Sparsemax: A Sparse Model of
        Attention and Multi-Label Classification*, ICML 2016, https://arxiv.org/abs/1602.02068
    """

    def __init__(self, dim: int = -1) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: Tensor) -> Tensor:
        if torch.jit.is_scripting():  # the library's operator (softargmax.export)
            return torch.ops.softargmax.normalized(x, None, None, "chi_square", 0.0, 1.0, self.dim)
        return sparsemax(x, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class Entmax15(Sparsemax):
    r"""Applies 1.5-entmax along ``dim``.

    .. math::

        \operatorname{Entmax}_{1.5}(x) = \operatorname*{argmax}_{p \in \Delta} \langle p, x\rangle + H^T_{1.5}(p)
        = [x/2 - \tau]_+^2, \qquad \sum_j p_j = 1,

    :func:`softargmax.entmax15` as a module.

    Args:
        dim: the dimension that sums to one. Default: ``-1``.

    Shape:
        - Input: :math:`(*)`, any number of dimensions.
        - Output: :math:`(*)`, the shape of the input.

    Examples:
        >>> import torch, softargmax as sa
        >>> sa.nn.Entmax15()(torch.tensor([[1.0, 0.8, -1.0]]))
        tensor([[0.5705, 0.4295, 0.0000]])

    References:
        Ben Peters, Vlad Niculae and André F. T. Martins, *Sparse Sequence-to-Sequence Models*,
        ACL 2019, https://arxiv.org/abs/1905.05702
    """

    def forward(self, x: Tensor) -> Tensor:
        if torch.jit.is_scripting():
            return torch.ops.softargmax.normalized(x, None, None, "alpha", 1.5, 1.0, self.dim)
        return entmax15(x, self.dim)


class Entmax(nn.Module):
    r"""Applies α-entmax along ``dim``, with a fixed or learnable α (one per row or per attention head).

    .. math::

        \operatorname{Entmax}(x) = \operatorname*{argmax}_{p \in \Delta} \langle p, x\rangle + H^T_\alpha(p)
        = [(\alpha - 1) x - \tau]_+^{1/(\alpha-1)}, \qquad \sum_j p_j = 1,

    :func:`softargmax.entmax` as a module.  A learnable α is
    :math:`\alpha = \alpha_{\min} + (\alpha_{\max} - \alpha_{\min}) \operatorname{sigmoid}(w)` with the
    parameter :math:`w` (``alpha_logit``), trained by the exact gradient in α (Correia et al., 2019).

    Args:
        alpha: initial α: a float or a tensor broadcastable to the input with size 1
            along ``dim`` (e.g. shape ``(heads, 1, 1)`` for one α per attention head). Default: ``1.5``.
        learn_alpha: make α a parameter; the initial α must then lie strictly inside
            ``(alpha_min, alpha_max)``. Default: ``False``.
        dim: the normalized dimension. Default: ``-1``.
        alpha_min: the lower end of a learnable α's range (any :math:`0 < \alpha_{\min} <
            \alpha_{\max}`: α below 1 gives dense outputs; the sigmoid can round to 0, so α can
            reach :math:`\alpha_{\min}` itself, which must be a valid α). Default: ``1.0``.
        alpha_max: the upper end of a learnable α's range. Default: ``2.0``.
        device: where α (parameter or buffer) is created, as for ``torch.nn`` layers.
            Default: ``None`` (a tensor α's own device).
        dtype: the dtype of α, as for ``torch.nn`` layers. Default: ``None`` (a tensor α's own
            dtype; the default dtype for a float α).

    Shape:
        - Input: :math:`(*)`, any number of dimensions.
        - alpha: broadcastable to the input with size 1 along ``dim``.
        - Output: :math:`(*)`, the shape of the input.

    Examples:
        >>> import torch, softargmax as sa
        >>> sa.nn.Entmax(alpha=2.0)(torch.tensor([[1.0, 0.8, -1.0]]))
        tensor([[0.6000, 0.4000, 0.0000]])

        One learnable α per attention head, for scores ``[batch, heads, queries, keys]``:

        >>> m = sa.nn.Entmax(alpha=torch.full((4, 1, 1), 1.5), learn_alpha=True)
        >>> m
        Entmax(learn_alpha=True, range=(1.0, 2.0), dim=-1)
        >>> m(torch.randn(2, 4, 5, 5)).sum().backward()
        >>> m.alpha.shape, m.alpha_logit.grad.shape
        (torch.Size([4, 1, 1]), torch.Size([4, 1, 1]))

    References:
        Gonçalo M. Correia, Vlad Niculae and André F. T. Martins, *Adaptively Sparse Transformers*,
        EMNLP 2019, https://arxiv.org/abs/1909.00015
    """

    if TYPE_CHECKING:  # (for the type checker only: torch.jit.script reads a class's annotations as attribute types)
        _alpha: Tensor  # a buffer: a fixed tensor α

    def __init__(
        self,
        alpha: Union[float, Tensor] = 1.5,
        learn_alpha: bool = False,
        dim: int = -1,
        alpha_min: float = 1.0,
        alpha_max: float = 2.0,
        *,
        device: Union[str, torch.device, None] = None,
        dtype: Optional[torch.dtype] = None,
    ) -> None:
        super().__init__()
        alpha = check_alpha(alpha, "alpha", minimum=0.0, strict=True)
        self.dim = dim
        self.learn_alpha = bool(learn_alpha)
        if self.learn_alpha:
            alpha_min, alpha_max = check_real(alpha_min, "alpha_min"), check_real(alpha_max, "alpha_max")
            if not 0.0 < alpha_min < alpha_max:  # α = alpha_min is reached when the sigmoid underflows: it must be valid
                raise ValueError(f"alpha_min, alpha_max must satisfy 0 < alpha_min < alpha_max < inf (α-entmax needs "
                                 f"α > 0), got {alpha_min}, {alpha_max}")
            a = initial_value(alpha)
            if values_checkable(a) and bool(((a <= alpha_min) | (a >= alpha_max)).any()):
                raise ValueError(f"learnable alpha={alpha} must start strictly inside (alpha_min, alpha_max) = "
                                 f"({alpha_min}, {alpha_max})")
            self.alpha_min, self.alpha_max = float(alpha_min), float(alpha_max)
            self.alpha_logit = nn.Parameter(placed(bounded_logit(a, alpha_min, alpha_max), device, dtype))
        elif isinstance(alpha, Tensor):
            self.register_buffer("_alpha", placed(initial_value(alpha), device, dtype))
        else:
            self._alpha_float = float(alpha)

    @property
    def alpha(self) -> Union[float, Tensor]:
        """The current α (a tensor that carries gradients when learnable)."""
        if self.learn_alpha:
            return bounded(self.alpha_logit, self.alpha_min, self.alpha_max)
        if hasattr(self, "_alpha"):
            return self._alpha
        return self._alpha_float

    __jit_unused_properties__ = ["alpha"]

    def forward(self, x: Tensor) -> Tensor:
        if torch.jit.is_scripting():  # the library's operator; attributes resolved when compiled
            if hasattr(self, "alpha_logit"):
                a = self.alpha_min + (self.alpha_max - self.alpha_min) * torch.sigmoid(self.alpha_logit)
            elif hasattr(self, "_alpha"):
                a = self._alpha
            else:
                return torch.ops.softargmax.normalized(x, None, None, "alpha", self._alpha_float, 1.0, self.dim)
            if a.dim() == 0:
                a = a.reshape([1] * x.dim())
            return torch.ops.softargmax.normalized(x, None, a, "", 0.0, 1.0, self.dim)
        check_tensor(x)
        alpha = self.alpha
        if isinstance(alpha, Tensor) and alpha.dim() == 0:
            alpha = alpha.reshape([1] * x.dim())
        return entmax(x, alpha, self.dim)

    def extra_repr(self) -> str:
        if self.learn_alpha:
            return f"learn_alpha=True, range=({self.alpha_min}, {self.alpha_max}), dim={self.dim}"
        return f"alpha={self.alpha}, dim={self.dim}"


class AlphaReLU(nn.Module):
    r"""Applies α-ReLU elementwise: α-entmax's map with a fixed threshold τ, optionally calibrated on a batch.

    .. math::

        \operatorname{AlphaReLU}(x) = [(\alpha - 1) x - \tau]_+^{1/(\alpha-1)},

    :func:`softargmax.alpha_relu` as a module (τ in the entmax parametrization).  With
    ``tau="calibrate"`` the module sets τ on its first forward call in training mode to the mean
    α-entmax threshold of that batch (:func:`softargmax.operators.alpha_relu_tau.from_logits`, how
    Tezekbayev et al. (2022) choose τ from the untrained model); until then it must not be used in
    eval mode.  The calibrated value is a buffer, saved with the state dict.

    Args:
        alpha: a float > 1. Default: ``1.5``.
        tau: a number, a tensor broadcastable to the input, or ``"calibrate"``. Default: ``0.0``.
        dim: the class dimension (used to calibrate τ). Default: ``-1``.
        device: where the τ buffer is created. Default: ``None``.
        dtype: the dtype of the τ buffer. Default: ``None``.

    Shape:
        - Input: :math:`(*)`, any number of dimensions.
        - Output: :math:`(*)`, the shape of the input.

    Examples:
        >>> import torch, softargmax as sa
        >>> sa.nn.AlphaReLU(alpha=1.5, tau=-0.25)(torch.tensor([1.0, 0.5, -1.0]))
        tensor([0.5625, 0.2500, 0.0000])
        >>> m = sa.nn.AlphaReLU(tau="calibrate")
        >>> _ = m(torch.tensor([[1.0, 0.8, -1.0], [0.0, 0.0, 0.0]]))  # the first training batch sets tau
        >>> m.tau
        tensor(-0.4163)

    References:
        Maxat Tezekbayev, Vassilina Nikoulina, Matthias Gallé and Zhenisbek Assylbekov, *Speeding
        Up Entmax*, Findings of NAACL 2022, https://arxiv.org/abs/2111.06832
    """

    if TYPE_CHECKING:  # (as Entmax's)
        tau: Tensor  # a buffer

    def __init__(self, alpha: float = 1.5, tau: Union[float, Tensor, str] = 0.0, dim: int = -1, *,
                 device: Union[str, torch.device, None] = None, dtype: Optional[torch.dtype] = None) -> None:
        super().__init__()
        checked = check_alpha(alpha, "alpha", minimum=1.0, strict=True)
        if isinstance(checked, Tensor):
            raise TypeError("AlphaReLU: alpha must be a float > 1")
        self.alpha = checked
        self.dim = dim
        self.calibrate = tau == "calibrate"
        if isinstance(tau, str) and not self.calibrate:
            raise ValueError(f"tau must be a number, a tensor or 'calibrate', got {tau!r}")
        value = float("nan") if self.calibrate else check_tau(tau)
        # the τ buffer is created on ``device``/``dtype`` where given (``torch.nn`` factory keywords)
        t = initial_value(value)
        self.register_buffer("tau", placed(t, device, dtype))

    @property
    def calibrated(self) -> bool:
        return not bool(torch.isnan(self.tau).any())

    __jit_unused_properties__ = ["calibrated"]

    def __prepare_scriptable__(self) -> AlphaReLU:
        if self.calibrate and not self.calibrated:
            raise not_scriptable(self, "tau='calibrate' sets τ from a training batch first (calibrate, then script)")
        return self

    def forward(self, x: Tensor) -> Tensor:
        if torch.jit.is_scripting():  # elementwise: PyTorch's operators (as softargmax.alpha_relu computes)
            a = self.alpha - 1.0
            t = torch.clamp(x * a - self.tau.to(x.dtype), min=0.0)
            return t ** (1.0 / a)
        if self.calibrate and not self.calibrated:
            if not self.training:
                raise RuntimeError("AlphaReLU(tau='calibrate') has not seen a training batch yet")
            self.tau.copy_(from_logits(x.detach(), self.alpha, self.dim).to(self.tau.dtype))
        return alpha_relu(x, self.alpha, self.tau)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}, tau={self.tau.tolist()}, calibrate={self.calibrate}"


class FSoftargmax(nn.Module):
    r"""Applies the f-softargmax of an f-divergence along ``dim``, with a fixed or learnable reference measure.

    .. math::

        \operatorname{FSoftargmax}(x) = \operatorname*{argmax}_{p \in \Delta} \langle p, x\rangle - \beta \sum_j q_j f(p_j / q_j),

    :func:`softargmax.f_softargmax` as a module; a learnable :math:`q = \exp(\log q)` is trained through
    the exact gradient of the mapping in :math:`q`.

    Args:
        divergence: a name or a :class:`~softargmax.divergences.Divergence`. Default: ``"kl"``.
        q: ``None`` or a finite, strictly positive floating tensor broadcastable to the input
            (checked here, as :func:`softargmax.f_softargmax` checks it). Default: ``None`` (all ones).
        temperature: :math:`\beta > 0`. Default: ``1.0``.
        dim: the normalized dimension. Default: ``-1``.
        learn_q: make :math:`\log q` a parameter (``q`` must be given). Default: ``False``.
        device: where ``q`` (parameter or buffer) is created. Default: ``None`` (``q``'s own).
        dtype: the dtype of ``q``. Default: ``None`` (``q``'s own).
        **params: parameters of the named divergence (``alpha=``).

    Shape:
        - Input: :math:`(*)`, any number of dimensions.
        - q: broadcastable to the input.
        - Output: :math:`(*)`, the shape of the input.

    Examples:
        >>> import torch, softargmax as sa
        >>> m = sa.nn.FSoftargmax("chi_square", q=torch.ones(3), learn_q=True)
        >>> p = m(torch.tensor([[1.0, 0.8, -1.0]]))
        >>> p.detach()
        tensor([[0.6000, 0.4000, 0.0000]])
        >>> p[0, 0].backward()
        >>> m.log_q.grad[:2]  # q_0 dp_0/dq_0 and q_1 dp_0/dq_1 (0 for the class off the support)
        tensor([ 0.3000, -0.2000])

    References:
        Vincent Roulet, Tianlin Liu, Nino Vieillard, Michael E. Sander and Mathieu Blondel, *Loss
        Functions and Operators Generated by f-Divergences*, 2025, https://arxiv.org/abs/2501.18537
    """

    def __init__(
        self,
        divergence: Union[str, Divergence] = "kl",
        q: Optional[Tensor] = None,
        temperature: float = 1.0,
        dim: int = -1,
        learn_q: bool = False,
        *,
        device: Union[str, torch.device, None] = None,
        dtype: Optional[torch.dtype] = None,
        **params: object,
    ) -> None:
        super().__init__()
        self.divergence = get_divergence(divergence, **params)
        self.temperature = check_positive_number(temperature, "temperature")
        self.dim = dim
        self.learn_q = bool(learn_q)
        if q is not None:
            check_q(q, q)  # what f_softargmax requires of q (finite, > 0), before any input fixes its shape
            if self.learn_q:
                self.log_q = nn.Parameter(placed(torch.log(initial_value(q)), device, dtype))
            else:
                self.register_buffer("_q", placed(initial_value(q), device, dtype))
        elif self.learn_q:
            raise ValueError("learn_q=True needs an initial q (e.g. torch.ones(num_classes))")
        spec = spec_of(self.divergence)
        #: the name and parameter ``torch.jit.script`` passes to the library's operator
        self._spec_name, self._spec_param = spec if spec is not None else ("", 0.0)

    __jit_unused_properties__ = ["q"]

    if TYPE_CHECKING:  # (as Entmax's)
        _q: Tensor  # a buffer, when a fixed q is given

    def __prepare_scriptable__(self) -> FSoftargmax:
        if not self._spec_name:
            raise not_scriptable(self, f"its divergence {self.divergence!r} has no name to pass to the library's operator")
        return self

    @property
    def q(self) -> Optional[Tensor]:
        if self.learn_q:
            return torch.exp(self.log_q)
        return getattr(self, "_q", None)

    def forward(self, x: Tensor) -> Tensor:
        if torch.jit.is_scripting():
            q: Optional[Tensor] = None
            if hasattr(self, "log_q"):
                q = torch.exp(self.log_q)
            elif hasattr(self, "_q"):
                q = self._q
            return torch.ops.softargmax.normalized(x, q, None, self._spec_name, self._spec_param, self.temperature,
                                                   self.dim)
        return f_softargmax(x, self.divergence, q=self.q, temperature=self.temperature, dim=self.dim)

    def extra_repr(self) -> str:
        return f"divergence={self.divergence!r}, temperature={self.temperature}, dim={self.dim}, learn_q={self.learn_q}"


class Normmax(nn.Module):
    r"""Applies α-normmax along ``dim`` (:math:`\alpha \ge 1`; α = 1 is the argmax).

    .. math::

        \operatorname{Normmax}(x) = \operatorname*{argmax}_{p \in \Delta} \langle p, x\rangle - \lVert p\rVert_\alpha,

    :func:`softargmax.normmax` as a module.

    Args:
        alpha: a float ``>= 1`` or a tensor broadcastable to the input with size 1 along ``dim``
            (one α per row; not learned). Default: ``2.0``.
        dim: the dimension that sums to one. Default: ``-1``.

    Shape:
        - Input: :math:`(*)`, any number of dimensions.
        - Output: :math:`(*)`, the shape of the input.

    Examples:
        >>> import torch, softargmax as sa
        >>> sa.nn.Normmax(alpha=2.0)(torch.tensor([[1.0, 0.8, -1.0]]))
        tensor([[0.5714, 0.4286, 0.0000]])

    References:
        Saul Santos, Vlad Niculae, Daniel McNamee and André F. T. Martins, *Sparse and Structured
        Hopfield Networks*, ICML 2024, https://arxiv.org/abs/2402.13725
    """

    def __init__(self, alpha: Union[float, Tensor] = 2.0, dim: int = -1) -> None:
        super().__init__()
        self.alpha = check_alpha(alpha, "alpha", minimum=1.0)
        self.dim = dim

    __jit_ignored_attributes__ = ["alpha"]

    def forward(self, x: Tensor) -> Tensor:
        if torch.jit.is_scripting():
            if hasattr(self, "_alpha_tensor"):
                return torch.ops.softargmax.normmax(x, self._alpha_tensor, 0.0, self.dim)
            return torch.ops.softargmax.normmax(x, None, self._alpha_value, self.dim)
        return normmax(x, self.alpha, self.dim)

    def __prepare_scriptable__(self) -> Normmax:
        # what the compiled forward reads: a float α, or a tensor α (a typed attribute of its own)
        if isinstance(self.alpha, Tensor):
            self._alpha_tensor = self.alpha
        else:
            self._alpha_value = float(self.alpha)
        return self

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}, dim={self.dim}"


class BudgetSparsemax(nn.Module):
    r"""Applies budget sparsemax along ``dim``: sparsemax with every probability at most :math:`1/B`.

    .. math::

        \operatorname{BudgetSparsemax}(x) = \operatorname*{argmax}_{p \in \Delta,\ p \le 1/B}
        \langle p, x\rangle - \tfrac12 \lVert p\rVert^2,

    :func:`softargmax.budget_sparsemax` as a module.

    Args:
        budget: :math:`B > 0`, a float or a tensor broadcastable to the input with size 1 along
            ``dim``. Default: ``2.0``.
        dim: the dimension that sums to one. Default: ``-1``.

    Shape:
        - Input: :math:`(*)`, any number of dimensions.
        - Output: :math:`(*)`, the shape of the input.

    Examples:
        >>> import torch, softargmax as sa
        >>> sa.nn.BudgetSparsemax(budget=2.0)(torch.tensor([[3.0, 1.0, 0.8, -1.0]]))
        tensor([[0.5000, 0.3500, 0.1500, 0.0000]])

    References:
        Saul Santos, Vlad Niculae, Daniel McNamee and André F. T. Martins, *Sparse and Structured
        Hopfield Networks*, ICML 2024, https://arxiv.org/abs/2402.13725
    """

    def __init__(self, budget: Union[float, Tensor] = 2.0, dim: int = -1) -> None:
        super().__init__()
        self.budget = check_budget(budget)
        self.dim = dim

    def __prepare_scriptable__(self) -> NoReturn:
        raise not_scriptable(self, "budget sparsemax has no torch.library operator")

    def forward(self, x: Tensor) -> Tensor:
        return budget_sparsemax(x, self.budget, self.dim)

    def extra_repr(self) -> str:
        return f"budget={self.budget}, dim={self.dim}"
