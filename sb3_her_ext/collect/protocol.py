"""What the device collector needs of the algorithm that holds it: :class:`CollectingAlgorithm`.

The collector reads the algorithm's public parts (policy, buffer, diagnostics, NaN guard, learner, SB3's
settings and counters) and drives its schedules and counters through the methods below, in SB3's order.
``BranchingIQN`` is one.
"""

from __future__ import annotations

from collections import deque
from typing import Any, NamedTuple, Protocol

import torch as th
from stable_baselines3.common.type_aliases import TrainFreq


class Counters(NamedTuple):
    """The host counters and schedule values a fused block advances before it runs (put back when its capture
    fails): SB3's ``num_timesteps``, ``_on_step`` calls and progress remaining, ε, the IQR bonus, PER β."""

    num_timesteps: int
    calls: int
    progress_remaining: float
    exploration_rate: float
    iqr_bonus: float
    beta: float


class CollectingAlgorithm(Protocol):
    """An off-policy algorithm the :class:`~sb3_her_ext.collect.DeviceCollector` collects for."""

    # SB3's
    device: th.device
    seed: int | None
    n_envs: int
    num_timesteps: int
    train_freq: TrainFreq
    gradient_steps: int
    batch_size: int
    tau: float
    target_update_interval: int
    env: Any  # SB3's VecEnv (its optional check_action_flag() is called at flushes)
    ep_info_buffer: deque | None
    policy: Any
    replay_buffer: Any
    q_net: th.nn.Module
    q_net_target: th.nn.Module
    # the algorithm's own
    action_dims: list[int]
    diagnostics: Any  # sb3_her_ext.diagnostics.TrainingDiagnostics
    guard: Any  # sb3_her_ext.guard.NanGuard or None
    learner: Any  # its train_step_in_graph runs inside a fused block
    generator: th.Generator  # action selection and quantile fractions: registered with every fused graph
    diagnostics_interval: int
    cuda_graph: bool
    graph_collect: bool | None
    exploration_rate: float
    iqr_bonus: float

    def explore(self, obs: th.Tensor, exploration_rate: th.Tensor | None = None,
                iqr_bonus: th.Tensor | None = None, branch_rates: th.Tensor | None = None) -> th.Tensor:
        """Exploratory actions on the device, no host copy."""

    def branch_rates(self, exploration_rates: th.Tensor) -> th.Tensor:
        """Per-branch exploration rates of ε values on the device (``[..., 1]`` -> ``[..., NB]``)."""

    def update_progress(self) -> bool:
        """SB3's progress remaining at ``num_timesteps``; whether this ``learn``'s total is reached."""

    def advance_schedules(self) -> bool:
        """Count one ``_on_step`` call, move ε, the IQR bonus and PER β; whether the target update is due."""

    def after_env_step(self) -> None:
        """SB3's ``_on_step``: :meth:`advance_schedules`, the target update, a diagnostics line when due."""

    def diagnostics_due(self) -> bool:
        """Whether a diagnostics line is due at ``num_timesteps``."""

    def log_diagnostics(self) -> dict[str, Any]:
        """Write a diagnostics line."""

    def record_episodes(self, episodes: list[tuple[float, int]], finished: int, seconds: float) -> int:
        """Add finished episodes to SB3's statistics; the count of episodes so far."""

    def plan_gradient_steps(self, steps: int) -> tuple[bool, ...]:
        """Per coming gradient step whether it is a vaccine step; readies training (mode, learning rate)."""

    def count_gradient_steps(self, steps: int) -> None:
        """Count gradient steps that ran outside ``train`` (in a fused block)."""

    def counters(self) -> Counters:
        """The host counters a fused block advances."""

    def restore_counters(self, counters: Counters) -> None:
        """Put back :meth:`counters`."""

    def dump_logs(self) -> None:
        """SB3's log dump."""
