"""Pure-PyTorch references of the action-selection ops: ``branch_select`` and ``quantile_iqr``.

The CPU path and the oracle of the CUDA kernels. Floats are computed one float32 operation at a time in
the kernels' order; the Boltzmann weights are ``exp`` evaluated in float64 and rounded to float32 and
summed sequentially in float32 (a loop over the few actions of a branch, never over rows), so the CUDA
kernel draws the same action for the same ``u_action``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from cuda_ext.reference.checks import check_same_device, check_scalar, check_tensor

__all__ = ["branch_select", "check_branch_select", "check_quantile_iqr", "iqr_positions", "quantile_iqr"]

MIN_TEMPERATURE = 0.01


def check_branch_select(
    q: Tensor,
    iqr: Tensor,
    ens_std: Tensor,
    n_actions: Tensor,
    eps: Tensor,
    boltzmann: Tensor,
    u_explore: Tensor,
    u_action: Tensor,
    alpha: float,
    beta: float,
    check_values: bool = True,
) -> None:
    """Validate the arguments of :func:`branch_select`; raise ``ValueError`` naming the bad one.

    ``n_actions`` values are checked only when it lives on the CPU (reading them elsewhere would sync).

    :param q: see :func:`branch_select`; the other parameters likewise.
    :param check_values: also check the values of a CPU ``n_actions`` (not for fake tensors).
    """
    check_tensor("q", q, torch.float32, (None, None, None))
    n_books, n_branches, max_actions = q.shape
    if max_actions < 1:
        raise ValueError(f"q.shape[2]={max_actions} must be >= 1")
    check_tensor("iqr", iqr, torch.float32, (n_books, n_branches, max_actions))
    check_tensor("ens_std", ens_std, torch.float32, (n_books, n_branches, max_actions))
    check_tensor("n_actions", n_actions, torch.int64, (n_branches,))
    check_tensor("eps", eps, torch.float32, (n_branches,))
    check_tensor("boltzmann", boltzmann, torch.bool, (n_branches,))
    check_tensor("u_explore", u_explore, torch.float32, (n_books, n_branches))
    check_tensor("u_action", u_action, torch.float32, (n_books, n_branches))
    check_same_device(
        q=q, iqr=iqr, ens_std=ens_std, n_actions=n_actions, eps=eps, boltzmann=boltzmann,
        u_explore=u_explore, u_action=u_action,
    )
    check_scalar("alpha", alpha)
    check_scalar("beta", beta)
    if check_values and n_actions.device.type == "cpu" and n_actions.numel() > 0:
        bad = (n_actions < 1) | (n_actions > max_actions)
        if bad.any():
            branch = int(bad.long().argmax())
            raise ValueError(
                f"n_actions[{branch}]={int(n_actions[branch])} must be in [1, {max_actions}] (q.shape[2])"
            )


def branch_select(
    q: Tensor,
    iqr: Tensor,
    ens_std: Tensor,
    n_actions: Tensor,
    eps: Tensor,
    boltzmann: Tensor,
    u_explore: Tensor,
    u_action: Tensor,
    alpha: float,
    beta: float,
) -> Tensor:
    """Pick one action per book and branch: ε-greedy, with Boltzmann sampling on chosen branches.

    Over a branch's valid actions ``a < n_actions[b]``, ``score = q + alpha * iqr + beta * ens_std``.
    ``u_explore < eps[b]`` → the uniform draw ``min(floor(u_action * n_b), n_b - 1)``; else on a Boltzmann
    branch ``tau = max(max score - min score, 0.01)``, ``p_a = exp((score_a - max score) / tau)`` and the
    action is the first ``a`` whose running sum of ``p`` exceeds ``u_action * Σp`` (``n_b - 1`` when
    rounding leaves none); on other branches the argmax (lowest index on ties). A branch whose
    ``n_actions`` is outside ``[1, A]`` gets action -1 (on the CPU it raises ``ValueError`` instead).

    :param q: ``[B, NB, A] float32`` expected returns.
    :param iqr: ``[B, NB, A] float32`` interquartile range of the return distribution.
    :param ens_std: ``[B, NB, A] float32`` ensemble standard deviation.
    :param n_actions: ``[NB] int64`` valid actions per branch.
    :param eps: ``[NB] float32`` exploration rate per branch.
    :param boltzmann: ``[NB] bool`` sample (instead of argmax) on this branch.
    :param u_explore: ``[B, NB] float32`` uniforms in ``[0, 1)`` deciding exploration.
    :param u_action: ``[B, NB] float32`` uniforms in ``[0, 1)`` choosing the action.
    :param alpha: weight of the IQR bonus.
    :param beta: weight of the ensemble-std bonus.
    :return: ``[B, NB] int64`` actions.
    """
    check_branch_select(q, iqr, ens_std, n_actions, eps, boltzmann, u_explore, u_action, alpha, beta)
    max_actions = q.shape[2]
    score = q + alpha * iqr + beta * ens_std
    valid = torch.arange(max_actions, device=q.device) < n_actions.unsqueeze(1)  # [NB, A]
    n_valid = n_actions.unsqueeze(0).expand_as(u_action)  # [B, NB]
    bad_branch = (n_valid < 1) | (n_valid > max_actions)

    uniform = torch.minimum(torch.floor(u_action * n_valid.to(torch.float32)).long(), n_valid - 1)

    neg_inf = torch.full_like(score, -math.inf)
    best = torch.where(valid, score, neg_inf).amax(-1)
    worst = torch.where(valid, score, -neg_inf).amin(-1)
    greedy = torch.where(valid, score, neg_inf).argmax(-1)

    tau = torch.clamp_min(best - worst, MIN_TEMPERATURE)
    scaled = (score - best.unsqueeze(-1)) / tau.unsqueeze(-1)
    weight = torch.where(valid, torch.exp(scaled.double()).float(), torch.zeros_like(score))
    running = torch.zeros_like(best)
    cumulative = []
    for a in range(max_actions):  # a few actions per branch: sequential float32 sum, as in the kernel
        running = running + weight[..., a]
        cumulative.append(running)
    target = u_action * running
    exceeds = (torch.stack(cumulative, -1) > target.unsqueeze(-1)) & valid
    sampled = torch.where(exceeds.any(-1), exceeds.long().argmax(-1), n_valid - 1)

    exploit = torch.where(boltzmann.unsqueeze(0), sampled, greedy)
    actions = torch.where(u_explore < eps.unsqueeze(0), uniform, exploit)
    return torch.where(bad_branch, torch.full_like(actions, -1), actions)


def check_quantile_iqr(samples: Tensor) -> None:
    """Validate the argument of :func:`quantile_iqr`; raise ``ValueError`` naming the bad one.

    :param samples: see :func:`quantile_iqr`.
    """
    if not isinstance(samples, Tensor):
        raise ValueError(f"samples={samples!r} must be a Tensor")
    if samples.dtype != torch.float32:
        raise ValueError(f"samples.dtype={samples.dtype} must be torch.float32")
    if samples.dim() < 1 or samples.shape[-1] < 1:
        raise ValueError(f"samples.shape={tuple(samples.shape)} must have a last dimension >= 1")


def iqr_positions(n_samples: int) -> tuple[int, int, float, int, int, float]:
    """Sorted positions and weights of the 25% and 75% quantiles of ``n_samples`` values.

    ``pos = float32(q) * float32(n_samples - 1)`` in float32, as ``torch.quantile`` computes it; the
    quantile is ``v[lo] + w * (v[hi] - v[lo])``, ``lo = floor(pos)``, ``hi = ceil(pos)``, ``w = pos - lo``.

    :param n_samples: values per row, >= 1.
    :return: ``(lo25, hi25, w25, lo75, hi75, w75)``.
    """
    last = torch.tensor(float(n_samples - 1), dtype=torch.float32)
    out: list[int | float] = []
    for q in (0.25, 0.75):
        pos = torch.tensor(q, dtype=torch.float32) * last
        lo = torch.floor(pos)
        out += [int(lo), int(torch.ceil(pos)), float(pos - lo)]
    return out[0], out[1], out[2], out[3], out[4], out[5]  # type: ignore[return-value]


def quantile_iqr(samples: Tensor) -> Tensor:
    """Interquartile range ``Q(0.75) - Q(0.25)`` over the last dim, interpolated like ``torch.quantile``.

    The row is sorted and each quantile is ``v[lo] + w * (v[hi] - v[lo])`` (see :func:`iqr_positions`),
    so there is no limit on the number of elements. A row holding a NaN gives NaN.

    :param samples: ``[..., N] float32`` samples (e.g. IQN quantile values per action).
    :return: ``[...] float32`` the interquartile range of each row.
    """
    check_quantile_iqr(samples)
    lo25, hi25, w25, lo75, hi75, w75 = iqr_positions(samples.shape[-1])
    ordered = samples.sort(dim=-1).values

    def quantile(lo: int, hi: int, w: float) -> Tensor:
        below = ordered[..., lo]
        return below + w * (ordered[..., hi] - below)

    iqr = quantile(lo75, hi75, w75) - quantile(lo25, hi25, w25)
    return torch.where(samples.isnan().any(-1), torch.full_like(iqr, math.nan), iqr)
