"""Gradient Vaccine (Wang et al. 2021): align an auxiliary loss's gradient with the main loss's gradient.

The main (IQN) and auxiliary (C51) gradients are flattened into vectors; when their cosine similarity
``phi`` falls below a running target ``phi_hat``, the main gradient gets a multiple of the auxiliary one
added so that the pair reaches the target similarity. Everything stays on the device: the decision is a
``torch.where``, so nothing syncs the host.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch as th
from torch import nn

from sb3_her_ext.validation import check_ema


def flat_grad(params: Iterable[nn.Parameter]) -> th.Tensor:
    """Concatenate the gradients of ``params`` into one vector (zeros for parameters without a gradient).

    :param params: parameters, in a fixed order.
    :return: ``[P]`` vector, ``P`` = total number of elements.
    """
    params = list(params)
    if not params:
        raise ValueError("params=[] must hold at least one parameter")
    return th.cat([(p.grad if p.grad is not None else th.zeros_like(p)).reshape(-1) for p in params])


def assign_flat_grad(params: Iterable[nn.Parameter], flat: th.Tensor) -> None:
    """Write a flat gradient vector back into the ``.grad`` of ``params`` (the inverse of :func:`flat_grad`).

    :param params: parameters, in the same order as for :func:`flat_grad`.
    :param flat: ``[P]`` vector.
    """
    params = list(params)
    total = sum(p.numel() for p in params)
    if flat.dim() != 1 or flat.shape[0] != total:
        raise ValueError(f"flat.shape={tuple(flat.shape)} must be [{total}] (the parameters' total size)")
    grads, chunks = [], []
    for p, chunk in zip(params, flat.split([p.numel() for p in params]), strict=True):
        if p.grad is None:
            p.grad = chunk.view_as(p).clone()
        else:
            grads.append(p.grad)
            chunks.append(chunk.view_as(p))
    if grads:
        th._foreach_copy_(grads, chunks)  # one multi-tensor copy instead of one op per parameter


class GradVac(nn.Module):
    """GradVac gradient surgery with an exponential moving average of the target cosine similarity.

    :param beta: EMA step of the target similarity ``phi_hat``, in (0, 1].
    :param eps: guards the divisions by gradient norms and by ``sqrt(1 - phi_hat^2)``.
    """

    target_cos: th.Tensor

    def __init__(self, beta: float = 0.01, eps: float = 1e-12) -> None:
        super().__init__()
        check_ema(beta, eps)
        self.beta = beta
        self.eps = eps
        self.register_buffer("target_cos", th.zeros(()))

    @th.no_grad()
    def correct(self, g_main: th.Tensor, g_aux: th.Tensor) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
        """Apply the GradVac rule to ``g_main`` and update the target similarity.

        With ``phi = cos(g_main, g_aux)`` and target ``phi_hat``: if ``phi < phi_hat``,
        ``g_new = g_main + g_aux * |g_main| (phi_hat sqrt(1 - phi^2) - phi sqrt(1 - phi_hat^2))
        / (|g_aux| sqrt(1 - phi_hat^2))``, else ``g_new = g_main``. Then
        ``phi_hat <- (1 - beta) phi_hat + beta phi``.

        :param g_main: ``[P]`` main-loss gradient.
        :param g_aux: ``[P]`` auxiliary-loss gradient.
        :return: ``(g_new [P], cos, corrected)``; ``cos`` (float) and ``corrected`` (bool) are 0-dim tensors.
        """
        if g_main.dim() != 1 or g_main.shape != g_aux.shape:
            raise ValueError(
                f"g_main.shape={tuple(g_main.shape)} and g_aux.shape={tuple(g_aux.shape)} must be equal [P]"
            )
        norm_main = g_main.norm()
        norm_aux = g_aux.norm()
        cos = (g_main @ g_aux) / (norm_main * norm_aux).clamp(min=self.eps)
        cos = cos.clamp(-1.0, 1.0)  # float rounding only
        target = self.target_cos.to(cos.dtype)
        sin = (1.0 - cos.pow(2)).clamp(min=0.0).sqrt()
        target_sin = (1.0 - target.pow(2)).clamp(min=0.0).sqrt()
        coef = norm_main * (target * sin - cos * target_sin) / (norm_aux * target_sin).clamp(min=self.eps)
        corrected = cos < target
        g_new = th.where(corrected, g_main + coef * g_aux, g_main)
        self.target_cos.mul_(1.0 - self.beta).add_(self.beta * cos.to(self.target_cos.dtype))
        return g_new, cos, corrected

    def extra_repr(self) -> str:
        """:return: the hyper-parameters, for ``print(module)``."""
        return f"beta={self.beta}"
