"""What the device collector needs of the algorithm that holds it: :class:`CollectingAlgorithm`."""

from __future__ import annotations

from collections import deque
from typing import Any, NamedTuple, Protocol

import torch as th
from stable_baselines3.common.type_aliases import TrainFreq


class Counters(NamedTuple):
    """The host counters a fused block advances before it runs (put back when its capture fails)."""

    num_timesteps: int
    calls: int  # SB3's ``_on_step`` calls
    progress_remaining: float
    exploration_rate: float
    iqr_bonus: float
    beta: float


class CollectingAlgorithm(Protocol):
    """An off-policy algorithm a :class:`~sb3_her_ext.collect.DeviceCollector` collects for (``BranchingIQN``
    is one): the collector reads its public parts and drives its counters and schedules through the methods
    below, in SB3's order (see ``BranchingIQN``'s methods of the same names)."""

    device: th.device
    seed: int | None
    n_envs: int
    num_timesteps: int
    train_freq: TrainFreq
    gradient_steps: int
    batch_size: int
    tau: float
    target_update_interval: int
    diagnostics_interval: int
    env: Any  # SB3's VecEnv (its optional check_action_flag() is called at flushes)
    ep_info_buffer: deque | None
    policy: Any
    replay_buffer: Any
    q_net: th.nn.Module
    q_net_target: th.nn.Module
    action_dims: list[int]
    diagnostics: Any  # sb3_her_ext.diagnostics.TrainingDiagnostics
    guard: Any  # sb3_her_ext.guard.NanGuard or None
    learner: Any  # its train_step_in_graph runs inside a fused block
    generator: th.Generator  # what explore draws from: registered with every fused graph
    cuda_graph: bool
    graph_collect: bool | None
    exploration_rate: float
    iqr_bonus: float

    # acting
    def explore(self, obs: th.Tensor, exploration_rate: th.Tensor | None = None,
                iqr_bonus: th.Tensor | None = None, branch_rates: th.Tensor | None = None) -> th.Tensor: ...
    def branch_rates(self, exploration_rates: th.Tensor) -> th.Tensor: ...
    # counters and schedules
    def update_progress(self) -> bool: ...
    def advance_schedules(self) -> bool: ...
    def after_env_step(self) -> None: ...
    def record_episodes(self, episodes: list[tuple[float, int]], finished: int, seconds: float) -> int: ...
    def plan_gradient_steps(self, steps: int) -> tuple[bool, ...]: ...
    def count_gradient_steps(self, steps: int) -> None: ...
    def counters(self) -> Counters: ...
    def restore_counters(self, counters: Counters) -> None: ...
    # logs
    def diagnostics_due(self) -> bool: ...
    def log_diagnostics(self) -> dict[str, Any]: ...
    def dump_logs(self) -> None: ...
