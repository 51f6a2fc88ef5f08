"""What the device collector needs of the algorithm that holds it: :class:`CollectingAlgorithm`."""

from __future__ import annotations

from collections import deque
from typing import Any, Protocol

import torch as th
from stable_baselines3.common.type_aliases import TrainFreq


class CollectingAlgorithm(Protocol):
    """An off-policy algorithm a :class:`~sb3_her_ext.collect.DeviceCollector` trains (``BranchingIQN`` is
    one): the collector reads its public parts, its SB3 counters (``num_timesteps``, ``_n_calls``,
    ``_n_gradient_steps``, ``_n_updates``, ``_total_timesteps``) and its schedules' settings, and calls the
    methods below (see ``BranchingIQN``'s methods of the same names)."""

    device: th.device
    seed: int | None
    n_envs: int
    num_timesteps: int
    train_freq: TrainFreq
    learning_starts: int
    gradient_steps: int
    batch_size: int
    tau: float
    target_update_interval: int
    diagnostics_interval: int
    exploration_schedule: Any  # SB3's LinearSchedule of ε
    iqr_bonus_range: tuple[float, float]
    per_beta_range: tuple[float, float]
    env: Any  # SB3's VecEnv (its optional check_action_flag() is called at flushes)
    ep_info_buffer: deque | None
    policy: Any
    replay_buffer: Any
    q_net: th.nn.Module
    q_net_target: th.nn.Module
    action_dims: list[int]
    diagnostics: Any  # sb3_her_ext.diagnostics.TrainingDiagnostics
    guard: Any  # sb3_her_ext.guard.NanGuard or None
    learner: Any  # its train_step_in_graph runs inside a block
    generator: th.Generator  # what explore draws from: registered with every graph
    cuda_graph: bool
    graph_collect: bool | None
    exploration_rate: float
    iqr_bonus: float

    # acting
    def explore(self, obs: th.Tensor, exploration_rate: th.Tensor | None = None,
                iqr_bonus: th.Tensor | None = None, branch_rates: th.Tensor | None = None) -> th.Tensor: ...
    def branch_rates(self, exploration_rates: th.Tensor) -> th.Tensor: ...
    # counters and schedules (host)
    def update_progress(self) -> bool: ...
    def advance_schedules(self) -> bool: ...
    def record_episodes(self, episodes: list[tuple[float, int]], finished: int, seconds: float) -> int: ...
    # logs
    def diagnostics_due(self) -> bool: ...
    def log_diagnostics(self) -> dict[str, Any]: ...
    def dump_logs(self) -> None: ...
