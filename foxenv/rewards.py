"""Reward and drawdown termination of the batched book core."""

from __future__ import annotations

import torch

from foxenv.config import EnvConfig


def step_reward(
    equity_before: torch.Tensor, equity_after: torch.Tensor, position: torch.Tensor, config: EnvConfig
) -> torch.Tensor:
    """Reward of one step: ``(equity_after - equity_before) * reward_scale - inventory_penalty *
    (position / max_position) ** 2``.

    :param equity_before: ``[B]`` equity at the previous step (currency).
    :param equity_after: ``[B]`` equity now.
    :param position: ``[B]`` signed position after the step, in lots.
    :param config: environment settings.
    :return: ``[B]`` float32 reward.
    """
    reward = equity_after - equity_before
    if config.reward_scale != 1.0:  # a config constant, not a tensor value: no host sync
        reward = reward * config.reward_scale
    if config.inventory_penalty > 0:
        reward = reward - config.inventory_penalty * (position / config.max_position) ** 2
    return reward.to(torch.float32)


def drawdown_hit(peak_equity: torch.Tensor, equity: torch.Tensor, config: EnvConfig) -> torch.Tensor:
    """Which books have lost ``max_drawdown`` or more from their episode peak equity.

    :param peak_equity: ``[B]`` highest equity of the episode so far (including now).
    :param equity: ``[B]`` equity now.
    :param config: environment settings.
    :return: ``[B]`` bool; all False when ``max_drawdown`` is None.
    """
    if config.max_drawdown is None:
        return torch.zeros_like(equity, dtype=torch.bool)
    return peak_equity - equity >= config.max_drawdown
