"""PopArt: adaptive target normalisation that preserves the network's outputs (van Hasselt et al. 2016).

The value heads predict in a normalised space; ``denormalize(y) = sigma * y + mu`` maps them back to
returns. ``update`` moves ``mu`` and ``sigma`` towards the statistics of a batch of (de-normalised)
targets and rescales every registered output layer so that its de-normalised outputs do not change
("Preserving Outputs Precisely"). All state lives in buffers on the module's device; nothing syncs the host.

Order of one training step: build the targets in de-normalised space (``denormalize`` the target
network's outputs, add rewards), ``update(targets)``, then ``normalize(targets)`` for the loss against
the online network's (normalised) outputs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch as th
from torch import nn

from sb3_her_ext.validation import check_ema


class PopArt(nn.Module):
    """Running first/second moments of the targets and output-preserving rescaling of output layers.

    :param beta: step size of the exponential moving averages of the first and second moments, in (0, 1].
    :param eps: lower bound on ``sigma`` (keeps the scale away from zero when the targets are constant).
    """

    mu: th.Tensor
    nu: th.Tensor
    sigma: th.Tensor

    def __init__(self, beta: float = 3e-4, eps: float = 1e-5) -> None:
        super().__init__()
        check_ema(beta, eps)
        self.beta = beta
        self.eps = eps
        self.register_buffer("mu", th.zeros(()))
        self.register_buffer("nu", th.ones(()))
        self.register_buffer("sigma", th.ones(()))
        self._layers: list[nn.Module] = []

    def register(self, *linears: nn.Module) -> None:
        """Register output layers whose outputs are in the normalised space.

        :param linears: ``nn.Linear`` layers, or any module with ``weight`` and ``bias`` parameters whose
            output is ``x @ weight (+ bias)`` along the output units (e.g. a stacked per-branch linear);
            ``update`` rescales ``weight`` and ``bias`` elementwise.
        """
        for layer in linears:
            weight, bias = getattr(layer, "weight", None), getattr(layer, "bias", None)
            if not isinstance(weight, th.Tensor) or not isinstance(bias, th.Tensor):
                raise ValueError(f"layer={layer!r} needs weight and bias tensors to be rescaled by PopArt")
            self._layers.append(layer)

    def normalize(self, x: th.Tensor) -> th.Tensor:
        """Map returns to the normalised space: ``(x - mu) / sigma``.

        :param x: values in return units.
        :return: normalised values.
        """
        return (x - self.mu) / self.sigma

    def denormalize(self, x: th.Tensor) -> th.Tensor:
        """Map normalised values back to returns: ``sigma * x + mu``.

        :param x: normalised values.
        :return: values in return units.
        """
        return x * self.sigma + self.mu

    def normalize_bellman_reward(self, rewards: th.Tensor, discounts: th.Tensor | float) -> th.Tensor:
        """Reward for a Bellman backup done entirely in the normalised space.

        With ``discounts = gamma * (1 - done)``, ``r_n + discounts * z`` equals
        ``normalize(r + discounts * denormalize(z))`` exactly for the current statistics, so with C51 atoms
        on a fixed support in the normalised space ``c51_project(p, r_n, dones, gamma, support)`` is the
        normalised categorical target. (BranchingIQN's train step does not call it: it updates PopArt between
        the target and the loss, so it builds the same target from the statistics before and after.)

        :param rewards: rewards in return units.
        :param discounts: ``gamma * (1 - done)``, broadcastable to ``rewards``.
        :return: ``(rewards - (1 - discounts) * mu) / sigma``.
        """
        return (rewards - (1.0 - discounts) * self.mu) / self.sigma

    def rescaled_tensors(self) -> list[th.Tensor]:
        """Everything :meth:`update` writes: the statistics and the registered layers' weights and biases.

        :return: the tensors (``mu``, ``nu``, ``sigma``, then each layer's ``weight`` and ``bias``).
        """
        layers = [t.data for layer in self._layers for t in (layer.weight, layer.bias)]
        return [self.mu, self.nu, self.sigma, *layers]

    @th.no_grad()
    def update(self, targets: th.Tensor,
               check: Callable[[th.Tensor, th.Tensor, th.Tensor], None] | None = None) -> None:
        """Update ``mu``/``sigma`` from a batch of de-normalised targets, preserving registered outputs.

        ``mu <- (1 - beta) mu + beta mean(targets)``, ``nu <- (1 - beta) nu + beta mean(targets^2)``,
        ``sigma = sqrt(max(nu - mu^2, eps^2))``; then every registered layer becomes
        ``W <- W sigma_old / sigma``, ``b <- (sigma_old b + mu_old - mu) / sigma``.

        :param targets: any-shaped tensor of target returns (de-normalised), at least one element.
        :param check: called with the new ``(mu, nu, sigma)`` before anything is written (the NaN guard's
            :meth:`~sb3_her_ext.guard.NanGuard.check_popart`: finite targets can still overflow ``nu``).
        """
        if targets.numel() == 0:
            raise ValueError(f"targets.shape={tuple(targets.shape)} must hold at least one value")
        targets = targets.detach().to(self.mu.dtype)
        old_mu, old_sigma = self.mu.clone(), self.sigma.clone()
        # (1 - beta) * m + beta * mean as one lerp each; few ops, as this runs in every train step
        mu = th.lerp(self.mu, targets.mean(), self.beta)
        nu = th.lerp(self.nu, targets.square().mean(), self.beta)
        sigma = th.sqrt(th.addcmul(nu, mu, mu, value=-1.0).clamp_(min=self.eps**2))
        if check is not None:
            check(mu, nu, sigma)
        self.mu.copy_(mu)
        self.nu.copy_(nu)
        self.sigma.copy_(sigma)
        if self._layers:
            scale = old_sigma / self.sigma
            shift = (old_mu - self.mu) / self.sigma
            weights = [layer.weight for layer in self._layers]
            biases = [layer.bias for layer in self._layers]
            # W <- W scale (one multi-tensor op), b <- b scale + shift; the shift is added per layer: the
            # multi-tensor add of a one-element CUDA tensor syncs with the host (it broke CUDA-graph capture)
            th._foreach_mul_(weights + biases, scale)
            for bias in biases:
                bias.add_(shift)

    def extra_repr(self) -> str:
        """:return: the hyper-parameters, for ``print(module)``."""
        return f"beta={self.beta}, eps={self.eps}, layers={len(self._layers)}"
