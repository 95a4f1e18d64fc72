"""The L2-regularized linear models of the sparsemax paper's experiments, fit by L-BFGS.

Shared by the label-proportion and multi-label experiments: ``(W, b)`` minimizing
``loss(X W + b) + λ ‖W‖²`` from zero, with PyTorch's L-BFGS and a strong-Wolfe line
search (the objectives are convex, so the start does not matter).
"""

from __future__ import annotations

from typing import Callable

import torch


def fit_linear(X: torch.Tensor, num_outputs: int, loss: Callable[[torch.Tensor], torch.Tensor], lam: float,
               max_iter: int = 100) -> tuple[torch.Tensor, torch.Tensor]:
    """``(W, b)`` minimizing ``loss(X @ W + b) + lam * ‖W‖²`` by L-BFGS (strong Wolfe)."""
    W = torch.zeros(X.shape[1], num_outputs, dtype=X.dtype, requires_grad=True)
    b = torch.zeros(num_outputs, dtype=X.dtype, requires_grad=True)
    opt = torch.optim.LBFGS([W, b], lr=1, max_iter=max_iter, line_search_fn="strong_wolfe",
                            tolerance_grad=1e-9, tolerance_change=1e-12)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        obj = loss(X @ W + b) + lam * (W * W).sum()
        obj.backward()
        return obj

    opt.step(closure)
    return W.detach(), b.detach()
