"""BranchingIQN: branching distributional Q-learning (IQN + C51) with prioritized hindsight replay, for SB3.

One Q-network head per action branch (BDQ), each head an ensemble of IQN quantile functions plus a C51
categorical head on a PopArt-normalised scale. The train step, top to bottom:

1. sample a batch from the prioritized buffer (importance weights ``w``);
2. BDQ double-Q target: per branch, the online argmax over the ensemble-mean quantile-mean at ``s'``, the
   target network's quantiles at that action, averaged over branches; ``y = r + γ(1 − done)·Z'``
   (de-normalised);
3. PopArt update from ``y`` (output-preserving), then ``y`` normalised;
4. IQN quantiles (and C51 logits) of the taken actions; ``L = (1 − c51_alpha)·L_IQN + c51_alpha·L_C51``,
   weighted by ``w``;
5. every ``vaccine_interval``-th gradient step: a batch stratified by the magnitude branch, its gradient,
   and GradVac's correction of the main gradient;
6. clip, optimizer step, PER priorities ``Σ_b |δ_b|`` (per-branch TD errors).

The target network is updated in :meth:`BranchingIQN._on_step` as in DQN (every
``target_update_interval`` environment steps, Polyak ``tau``).
Exploration is per branch (see :mod:`sb3_her_ext.exploration`).
"""

from __future__ import annotations

import dataclasses
import os
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, NamedTuple, TypeVar

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import ReplayBuffer
from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm
from stable_baselines3.common.policies import BasePolicy
from stable_baselines3.common.type_aliases import GymEnv, MaybeCallback, Schedule
from stable_baselines3.common.utils import LinearSchedule, polyak_update, safe_mean
from stable_baselines3.common.vec_env import VecEnv

from foxenv.config import is_whole
from sb3_her_ext.diagnostics import TrainingDiagnostics
from sb3_her_ext.exploration import (
    branch_epsilons,
    default_branch_names,
    linear_anneal,
    resolve_boltzmann_branches,
    resolve_exploration_mults,
    select_actions,
)
from sb3_her_ext.graphed_step import GraphedTrainStep, StaticBatch, StepOutputs
from sb3_her_ext.losses import c51_cross_entropy, c51_project, quantile_huber_loss
from sb3_her_ext.policy import BranchingIQNPolicy, branch_action_dims
from sb3_her_ext.replay import HindsightConfig, PrioritizedHindsightReplayBuffer
from sb3_her_ext.vaccine import GradVac, assign_flat_grad, flat_grad

# cuBLAS reads this when it creates its first handle; with it, seeded CUDA runs can be deterministic.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

SelfBranchingIQN = TypeVar("SelfBranchingIQN", bound="BranchingIQN")


class DistributionalLoss(NamedTuple):
    """Per-sample pieces of the loss of one batch.

    :param per_sample: ``[B]`` mixed loss ``(1 − α)·L_IQN + α·L_C51`` (before importance weights).
    :param l_q: ``[B]`` IQN quantile-Huber loss (mean over ensemble heads and branches).
    :param l_c51: ``[B]`` C51 cross-entropy (mean over branches).
    :param td_abs: ``[B, NB]`` absolute per-branch TD errors (normalised scale), for PER priorities; None
        when the loss was formed for its gradient only.
    """

    per_sample: th.Tensor
    l_q: th.Tensor
    l_c51: th.Tensor
    td_abs: th.Tensor | None


def _mean_values(net: th.nn.Module, obs: th.Tensor, taus: th.Tensor) -> th.Tensor:
    """``[B, NB, A]`` ensemble-mean quantile-mean: the network's fused :meth:`mean_values` when it has one.

    :param net: a :class:`~sb3_her_ext.policy.BranchingQNetwork` or any module with ``quantiles``.
    :param obs: ``[B, D]`` observations.
    :param taus: ``[B, N]`` quantile fractions.
    :return: ``[B, NB, A]``.
    """
    if hasattr(net, "mean_values"):
        return net.mean_values(obs, taus)
    return net.quantiles(obs, taus).mean(dim=(0, -1))


def _taken_quantiles_and_logits(net: th.nn.Module, obs: th.Tensor, taus: th.Tensor, actions: th.Tensor) -> (
    tuple[th.Tensor, th.Tensor]
):
    """Quantiles ``[E, B, NB, N]`` and C51 logits ``[B, NB, atoms]`` of one action per branch.

    Uses the network's fused :meth:`taken_quantiles_and_logits` when it has one, else gathers from
    ``quantiles_and_logits``.

    :param net: a :class:`~sb3_her_ext.policy.BranchingQNetwork` or any module with ``quantiles_and_logits``.
    :param obs: ``[B, D]`` observations.
    :param taus: ``[B, N]`` quantile fractions.
    :param actions: ``[B, NB]`` int64 actions.
    :return: ``(quantiles, logits)``.
    """
    if hasattr(net, "taken_quantiles_and_logits"):
        return net.taken_quantiles_and_logits(obs, taus, actions)
    z, logits = net.quantiles_and_logits(obs, taus)  # [E, B, NB, A, N], [B, NB, A, atoms]
    index = actions[None, :, :, None, None].expand(z.shape[0], -1, -1, 1, z.shape[-1])
    atom_index = actions[:, :, None, None].expand(-1, -1, 1, logits.shape[-1])
    return z.gather(3, index).squeeze(3), logits.gather(2, atom_index).squeeze(2)


def _pair(value: float | Sequence[float], field: str) -> tuple[float, float]:
    """A ``(start, end)`` pair from a number (constant) or a pair."""
    if isinstance(value, int | float):
        return float(value), float(value)
    if isinstance(value, Sequence) and len(value) == 2:
        return float(value[0]), float(value[1])
    raise ValueError(f"{field}={value!r} must be a number or a (start, end) pair")


def resolve_hindsight(hindsight: bool | str | Mapping[str, Any] | HindsightConfig, env: VecEnv | None) -> (
    HindsightConfig | None
):
    """The replay buffer's hindsight config from the ``hindsight`` argument.

    :param hindsight: ``True`` (defaults), ``False`` (off), ``"auto"`` (on when the env provides the
        foxenv info contract, i.e. has ``n_market_features``), a dict of :class:`HindsightConfig` fields,
        or a config.
    :param env: the (vectorized) env, used by ``"auto"`` and for the fields a dict or ``True`` leaves
        out that the env publishes (``reward_scale``, ``magnitudes``).
    :return: the config, or ``None`` when hindsight is off.
    """
    if isinstance(hindsight, HindsightConfig):
        return hindsight
    if isinstance(hindsight, bool):
        fields: Mapping[str, Any] | None = {} if hindsight else None
    elif isinstance(hindsight, str) and hindsight == "auto":
        fields = {} if env is not None and env.has_attr("n_market_features") else None
    elif isinstance(hindsight, Mapping):
        known = {f.name for f in dataclasses.fields(HindsightConfig)}
        unknown = sorted(set(hindsight) - known)
        if unknown:
            raise ValueError(f"hindsight has unknown fields {unknown}; known fields are {sorted(known)}")
        fields = hindsight
    else:
        raise ValueError(f"hindsight={hindsight!r} must be True, False, 'auto', a dict or a HindsightConfig")
    if fields is None:
        return None
    from_env: dict[str, Any] = {}
    if env is not None and "reward_scale" not in fields and env.has_attr("reward_scale"):
        from_env["reward_scale"] = float(env.get_attr("reward_scale")[0])
    if env is not None and "magnitudes" not in fields and env.has_attr("magnitudes"):
        from_env["magnitudes"] = tuple(float(m) for m in env.get_attr("magnitudes")[0])
    return HindsightConfig(**{**from_env, **fields})


class BranchingIQN(OffPolicyAlgorithm):
    """Branching IQN with C51 mixing, PopArt, GradVac vaccine and prioritized hindsight replay.

    DQN's arguments keep DQN's names and meaning; see :class:`stable_baselines3.DQN`.

    :param policy: the policy model (``"MlpPolicy"`` or a :class:`BranchingIQNPolicy` subclass).
    :param env: the environment (``MultiDiscrete`` or ``Discrete`` actions, ``Box`` observations).
    :param learning_rate: learning rate, constant or a schedule of the progress remaining.
    :param buffer_size: replay buffer capacity.
    :param learning_starts: steps of uniform random actions before learning starts.
    :param batch_size: minibatch size of each gradient step.
    :param tau: Polyak coefficient of the target update (1 = hard copy).
    :param gamma: discount factor.
    :param train_freq: update the model every ``train_freq`` steps (or ``(n, "episode")``).
    :param gradient_steps: gradient steps per rollout (``-1``: as many as env steps).
    :param replay_buffer_class: replay buffer class (default :class:`PrioritizedHindsightReplayBuffer`).
    :param replay_buffer_kwargs: extra keyword arguments of the replay buffer.
    :param optimize_memory_usage: SB3's memory-efficient replay variant (passed to the buffer).
    :param target_update_interval: update the target network every this many environment steps.
    :param exploration_fraction: fraction of training over which ε falls linearly.
    :param exploration_initial_eps: initial ε.
    :param exploration_final_eps: final ε.
    :param max_grad_norm: gradient clipping norm.
    :param stats_window_size: episodes averaged in the rollout statistics.
    :param tensorboard_log: TensorBoard log folder (``None``: none).
    :param policy_kwargs: keyword arguments of the policy.
    :param verbose: 0 none, 1 info, 2 debug.
    :param seed: random seed (network init, replay sampling, exploration uniforms). With a seed on a CUDA
        device, :meth:`_setup_model` turns on ``torch.use_deterministic_algorithms(True, warn_only=True)``
        (process-wide, and left on) so that the same seed gives the same results on the GPU.
    :param device: ``"cpu"``, ``"cuda"`` or ``"auto"``.
    :param c51_alpha: weight of the C51 loss in ``(1 − α)·L_IQN + α·L_C51``, fixed from the first step.
    :param exploration_mults: per-branch ε multipliers (``ε_b = min(1, ε·mult_b)``): a list of length NB or
        a dict by branch name or index; default direction 1.0, magnitude 2.0, order 1.5, urgency 1.5.
    :param boltzmann_branches: branches (names or indices) that explore by Boltzmann sampling; default
        order and urgency.
    :param iqr_bonus: ``(start, end)`` weight of the IQR optimism bonus, annealed linearly over training.
    :param ensemble_bonus: weight of the ensemble-std optimism bonus.
    :param per_alpha: PER priority exponent.
    :param per_beta: ``(start, end)`` PER importance exponent, annealed linearly over training.
    :param hindsight: ``True``/``False``/``"auto"``/dict of :class:`HindsightConfig` fields/a config.
    :param vaccine_interval: every this many gradient steps, a GradVac correction from a batch stratified by
        the magnitude branch (0: never).
    :param vaccine_beta: GradVac EMA rate of the target cosine.
    :param diagnostics_path: JSONL file for diagnostics lines (``None``: logger only).
    :param diagnostics_interval: environment steps between diagnostics lines.
    :param compile_loss: compute the quantile-Huber loss with ``torch.compile`` (see
        :func:`~sb3_her_ext.losses.quantile_huber_loss`): a faster gradient step after a compile of some
        seconds at the first step of each batch shape; needs a working ``torch.compile`` (a C++ compiler on
        the CPU, Triton on a GPU).
    :param cuda_graph: run each gradient step as one CUDA graph replay (:mod:`sb3_her_ext.graphed_step`;
        the vaccine steps as a second graph, which also holds the vaccine batch's pass); CUDA only. The
        optimizer is made capturable (its learning rate a tensor, so schedules still apply); the first few
        steps of each kind run eagerly while its graph is prepared. Same random draws and same arithmetic as
        the eager step.
    :param _init_setup_model: whether to build the networks on creation.
    """

    policy_aliases: ClassVar[dict[str, type[BasePolicy]]] = {"MlpPolicy": BranchingIQNPolicy}
    policy: BranchingIQNPolicy
    replay_buffer: ReplayBuffer
    exploration_schedule: Schedule

    def __init__(
        self,
        policy: str | type[BranchingIQNPolicy],
        env: GymEnv | str | None,
        learning_rate: float | Schedule = 1e-4,
        buffer_size: int = 1_000_000,
        learning_starts: int = 1000,
        batch_size: int = 256,
        tau: float = 1.0,
        gamma: float = 0.99,
        train_freq: int | tuple[int, str] = 4,
        gradient_steps: int = 1,
        replay_buffer_class: type[ReplayBuffer] | None = None,
        replay_buffer_kwargs: dict[str, Any] | None = None,
        optimize_memory_usage: bool = False,
        target_update_interval: int = 10_000,
        exploration_fraction: float = 0.1,
        exploration_initial_eps: float = 1.0,
        exploration_final_eps: float = 0.05,
        max_grad_norm: float = 10.0,
        stats_window_size: int = 100,
        tensorboard_log: str | None = None,
        policy_kwargs: dict[str, Any] | None = None,
        verbose: int = 0,
        seed: int | None = None,
        device: th.device | str = "auto",
        c51_alpha: float = 0.5,
        exploration_mults: Sequence[float] | Mapping[int | str, float] | None = None,
        boltzmann_branches: Sequence[int | str] | None = None,
        iqr_bonus: float | tuple[float, float] = (0.3, 0.05),
        ensemble_bonus: float = 0.2,
        per_alpha: float = 0.6,
        per_beta: float | tuple[float, float] = (0.4, 1.0),
        hindsight: bool | str | Mapping[str, Any] | HindsightConfig = "auto",
        vaccine_interval: int = 5,
        vaccine_beta: float = 0.01,
        diagnostics_path: str | None = None,
        diagnostics_interval: int = 1000,
        compile_loss: bool = False,
        cuda_graph: bool = False,
        _init_setup_model: bool = True,
    ) -> None:
        if not 0.0 <= c51_alpha <= 1.0:
            raise ValueError(f"c51_alpha={c51_alpha} must lie in [0, 1]")
        for field, value in (("exploration_initial_eps", exploration_initial_eps),
                             ("exploration_final_eps", exploration_final_eps)):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{field}={value} must lie in [0, 1]")
        if not 0.0 < exploration_fraction <= 1.0:
            raise ValueError(f"exploration_fraction={exploration_fraction} must lie in (0, 1]")
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma={gamma} must lie in [0, 1]")
        if not 0.0 < tau <= 1.0:
            raise ValueError(f"tau={tau} must lie in (0, 1]")
        if not max_grad_norm > 0.0:
            raise ValueError(f"max_grad_norm={max_grad_norm} must be > 0")
        if not 0.0 < vaccine_beta <= 1.0:
            raise ValueError(f"vaccine_beta={vaccine_beta} must lie in (0, 1]")
        if not ensemble_bonus >= 0.0:
            raise ValueError(f"ensemble_bonus={ensemble_bonus} must be >= 0")
        if not per_alpha >= 0.0:
            raise ValueError(f"per_alpha={per_alpha} must be >= 0")
        if not is_whole(vaccine_interval) or vaccine_interval < 0:
            raise ValueError(f"vaccine_interval={vaccine_interval!r} must be an integer >= 0 (0 = off)")
        if not is_whole(diagnostics_interval) or diagnostics_interval <= 0:
            raise ValueError(f"diagnostics_interval={diagnostics_interval!r} must be an integer > 0")
        if not is_whole(target_update_interval) or target_update_interval <= 0:
            raise ValueError(f"target_update_interval={target_update_interval!r} must be an integer > 0")
        for field, value, least in (("buffer_size", buffer_size, 1), ("batch_size", batch_size, 1),
                                    ("learning_starts", learning_starts, 0),
                                    ("gradient_steps", gradient_steps, -1)):
            if not is_whole(value) or value < least:
                raise ValueError(f"{field}={value!r} must be an integer >= {least}")
        frequency = train_freq[0] if isinstance(train_freq, tuple) and len(train_freq) == 2 else train_freq
        if not is_whole(frequency) or frequency < 1:
            raise ValueError(f"train_freq={train_freq!r} must be an integer >= 1 or (integer >= 1, unit)")
        if not isinstance(compile_loss, bool):
            raise ValueError(f"compile_loss={compile_loss!r} must be a bool")
        if not isinstance(cuda_graph, bool):
            raise ValueError(f"cuda_graph={cuda_graph!r} must be a bool")
        self.iqr_bonus_range = _pair(iqr_bonus, "iqr_bonus")
        self.per_beta_range = _pair(per_beta, "per_beta")
        if not all(0.0 <= b <= 1.0 for b in self.per_beta_range):
            raise ValueError(f"per_beta={per_beta} must lie in [0, 1]")
        if not all(b >= 0.0 for b in self.iqr_bonus_range):
            raise ValueError(f"iqr_bonus={iqr_bonus} must be >= 0")

        super().__init__(
            policy,
            env,
            learning_rate,
            buffer_size,
            learning_starts,
            batch_size,
            tau,
            gamma,
            train_freq,
            gradient_steps,
            action_noise=None,
            replay_buffer_class=replay_buffer_class,
            replay_buffer_kwargs=replay_buffer_kwargs,
            optimize_memory_usage=optimize_memory_usage,
            policy_kwargs=policy_kwargs,
            stats_window_size=stats_window_size,
            tensorboard_log=tensorboard_log,
            verbose=verbose,
            device=device,
            seed=seed,
            sde_support=False,
            supported_action_spaces=None,  # checked below, with a ValueError naming the space
            support_multi_env=True,
        )
        self.c51_alpha = float(c51_alpha)
        self.ensemble_bonus = float(ensemble_bonus)
        self.per_alpha = float(per_alpha)
        self.exploration_initial_eps = exploration_initial_eps
        self.exploration_final_eps = exploration_final_eps
        self.exploration_fraction = exploration_fraction
        self.target_update_interval = target_update_interval
        self.max_grad_norm = max_grad_norm
        self.vaccine_interval = vaccine_interval
        self.vaccine_beta = vaccine_beta
        self.diagnostics_path = diagnostics_path
        self.diagnostics_interval = diagnostics_interval
        self.compile_loss = compile_loss
        self.cuda_graph = cuda_graph
        if cuda_graph and self.device.type != "cuda":
            raise ValueError(f"cuda_graph=True needs a CUDA device, got device={self.device}")
        self._rand_queue: list[th.Tensor] | None = None  # set while a graphed step runs: its static draws
        self.exploration_rate = 0.0
        self.iqr_bonus = self.iqr_bonus_range[0]
        self._n_calls = 0
        self._n_gradient_steps = 0
        self._last_diagnostics_step = 0

        if getattr(self, "action_space", None) is not None:  # unset only in `load`, which restores it all
            self.action_dims = self._check_spaces(self.observation_space, self.action_space)
            self.branch_names = self._branch_names(self.env, len(self.action_dims))
            self.exploration_mults = resolve_exploration_mults(exploration_mults, self.branch_names)
            self.boltzmann_flags = resolve_boltzmann_branches(boltzmann_branches, self.branch_names)
            self.hindsight_config = resolve_hindsight(hindsight, self.env)
            self.policy_kwargs = dict(self.policy_kwargs)  # never modify the caller's dict
            if self.env is not None and self.env.has_attr("n_market_features"):
                n_market = int(self.env.get_attr("n_market_features")[0])
                self.policy_kwargs.setdefault("n_market_features", n_market)
            if self.replay_buffer_class is None:
                self.replay_buffer_class = PrioritizedHindsightReplayBuffer
            if issubclass(self.replay_buffer_class, PrioritizedHindsightReplayBuffer):
                self.replay_buffer_kwargs = {
                    "alpha": self.per_alpha,
                    "beta": self.per_beta_range[0],
                    "hindsight": self.hindsight_config,
                    **self.replay_buffer_kwargs,
                }

        if _init_setup_model:
            self._setup_model()

    # ------------------------------------------------------------------ setup

    @staticmethod
    def _check_spaces(observation_space: spaces.Space, action_space: spaces.Space) -> list[int]:
        """Validate the spaces and return the number of actions of each branch."""
        if not isinstance(observation_space, spaces.Box):
            raise ValueError(f"observation_space={observation_space} is not supported: it must be a Box")
        return branch_action_dims(action_space)

    @staticmethod
    def _branch_names(env: VecEnv | None, n_branches: int) -> list[str]:
        """Branch names the env publishes (``branch_names``), else the defaults."""
        if env is not None and env.has_attr("branch_names"):
            names = [str(name) for name in env.get_attr("branch_names")[0]]
            if len(names) != n_branches:
                raise ValueError(f"env branch_names={names} has {len(names)} names for {n_branches} branches")
            return names
        return list(default_branch_names(n_branches))

    def _setup_model(self) -> None:
        """Build the policy and buffer (SB3), then schedules, action masks, generator, vaccine, diagnostics.

        For a seeded run on CUDA this calls ``torch.use_deterministic_algorithms(True, warn_only=True)``:
        without it the backward pass's scatter-adds and cuBLAS may reorder float additions, and the same seed
        would not give the same parameters on the GPU (verified on an H200). The switch is process-wide and
        stays on after the model is gone; ops without a deterministic kernel only warn.
        """
        if self.cuda_graph and self.device.type != "cuda":  # a graphed model loaded onto a CPU
            warnings.warn(
                f"cuda_graph=True needs a CUDA device; device={self.device}: eager steps", stacklevel=2
            )
            self.cuda_graph = False
        optimizer_kwargs = dict(self.policy_kwargs.get("optimizer_kwargs") or {})
        if self.cuda_graph:
            optimizer_kwargs["capturable"] = True  # the optimizer step is part of the graph
        else:
            optimizer_kwargs.pop("capturable", None)
        self.policy_kwargs = {**self.policy_kwargs, "optimizer_kwargs": optimizer_kwargs}
        super()._setup_model()
        self.q_net = self.policy.q_net
        self.q_net_target = self.policy.q_net_target
        self.exploration_schedule = LinearSchedule(
            self.exploration_initial_eps, self.exploration_final_eps, self.exploration_fraction
        )
        n_branches, max_actions = len(self.action_dims), max(self.action_dims)
        self._n_actions = th.tensor(self.action_dims, dtype=th.int64, device=self.device)
        self._valid_actions = th.arange(max_actions, device=self.device)[None, :] < self._n_actions[:, None]
        self._mults = th.tensor(self.exploration_mults, dtype=th.float32, device=self.device)
        self._boltzmann = th.tensor(self.boltzmann_flags, dtype=th.bool, device=self.device)
        if self.seed is not None and self.device.type == "cuda":
            # Same seed, same results on a GPU too: the backward pass's scatter-adds and cuBLAS are otherwise
            # free to reorder float additions (SB3's set_random_seed likewise sets cudnn.deterministic).
            th.use_deterministic_algorithms(True, warn_only=True)
        self._generator = th.Generator(device=self.device)
        self._generator.manual_seed(self.seed if self.seed is not None else int(np.random.randint(2**31)))
        self.vaccine = GradVac(beta=self.vaccine_beta).to(self.device)
        names = self.branch_names
        self._vaccine_branch = names.index("magnitude") if "magnitude" in names and n_branches > 1 else 0
        self.diagnostics = TrainingDiagnostics(self.diagnostics_path, self.action_dims, names, self.device)
        self._diagnostics_clock = time.time()
        self._rand_queue = None
        self._graphed_step = self._graphed_vaccine_step = None
        if self.cuda_graph:
            generator = self._generator
            self._graphed_step = GraphedTrainStep(self._graphable_step, self._step_rand_shapes, generator)
            self._graphed_vaccine_step = GraphedTrainStep(
                self._graphable_step, self._vaccine_rand_shapes, generator
            )
        assert n_branches == self.q_net.n_branches, "policy and action space disagree on the branches"

    def _excluded_save_params(self) -> list[str]:
        return [
            *super()._excluded_save_params(),
            "q_net",
            "q_net_target",
            "vaccine",
            "diagnostics",
            "_generator",
            "_graphed_step",
            "_graphed_vaccine_step",
            "_rand_queue",
            "_n_actions",
            "_valid_actions",
            "_mults",
            "_boltzmann",
        ]

    def _get_torch_save_params(self) -> tuple[list[str], list[str]]:
        # PopArt statistics live in the policy's state dict; GradVac's target cosine in ``vaccine``.
        return ["policy", "policy.optimizer", "vaccine"], []

    # ------------------------------------------------------------------ acting

    def branch_epsilons(self) -> list[float]:
        """Current per-branch exploration rates ``min(1, ε·mult_b)``.

        :return: one rate per branch.
        """
        return [min(1.0, self.exploration_rate * mult) for mult in self.exploration_mults]

    def predict(
        self,
        observation: np.ndarray | dict[str, np.ndarray],
        state: tuple[np.ndarray, ...] | None = None,
        episode_start: np.ndarray | None = None,
        deterministic: bool = False,
    ) -> tuple[np.ndarray, tuple[np.ndarray, ...] | None]:
        """Actions for ``observation``: greedy when ``deterministic``, else per-branch exploration.

        :param observation: one observation or a batch ``[n_envs, D]``.
        :param state: unused (no recurrent policy).
        :param episode_start: unused.
        :param deterministic: greedy actions, no exploration and no bonuses.
        :return: actions (``[n_envs, NB]`` for MultiDiscrete, ``[n_envs]`` for Discrete; unbatched for a
            single observation) and ``state``.
        """
        if deterministic:
            return self.policy.predict(observation, state, episode_start, deterministic=True)
        self.policy.set_training_mode(False)
        obs_tensor, vectorized = self.policy.obs_to_tensor(observation)
        with th.no_grad():
            q, iqr, ens_std = self.policy.action_stats(obs_tensor)
            eps = branch_epsilons(self.exploration_rate, self._mults)
            actions = select_actions(
                q, iqr, ens_std, self._n_actions, eps, self._boltzmann,
                self.iqr_bonus, self.ensemble_bonus, self._generator,
            )
            self.diagnostics.add_selection(iqr, ens_std, self._valid_actions)
        actions_np = actions.cpu().numpy().reshape((-1, *self.action_space.shape))
        if not vectorized:
            actions_np = actions_np.squeeze(axis=0)
        return actions_np, state

    # ---- device loop hook (issue 14): a DeviceVecEnv collects on the device (sb3_her_ext.device_loop),
    # ---- every other env through SB3's loop unchanged
    def collect_rollouts(self, env: VecEnv, callback: Any, train_freq: Any, replay_buffer: ReplayBuffer,
                         action_noise: Any = None, learning_starts: int = 0,
                         log_interval: int | None = None) -> Any:
        """SB3's ``collect_rollouts``, or :func:`sb3_her_ext.device_loop.collect_rollouts` when ``env`` is a
        :class:`~sb3_her_ext.device_env.DeviceVecEnv` it supports."""
        from sb3_her_ext import device_loop

        if device_loop.supports(self, env, train_freq, action_noise):
            return device_loop.collect_rollouts(self, env, callback, train_freq, replay_buffer,
                                                learning_starts, log_interval)
        return super().collect_rollouts(env, callback, train_freq, replay_buffer, action_noise,
                                        learning_starts, log_interval)
    # ---- end of the device loop hook

    def _store_transition(
        self,
        replay_buffer: ReplayBuffer,
        buffer_action: np.ndarray,
        new_obs: np.ndarray | dict[str, np.ndarray],
        reward: np.ndarray,
        dones: np.ndarray,
        infos: list[dict[str, Any]],
    ) -> None:
        self.diagnostics.add_actions(buffer_action)
        super()._store_transition(replay_buffer, buffer_action, new_obs, reward, dones, infos)

    def _on_step(self) -> None:
        """After each env step: target update, schedules (ε, IQR bonus, PER β), diagnostics at log points."""
        self._n_calls += 1
        if self._n_calls % max(self.target_update_interval // self.n_envs, 1) == 0:
            polyak_update(self.q_net.parameters(), self.q_net_target.parameters(), self.tau)
        progress_remaining = self._current_progress_remaining
        self.exploration_rate = self.exploration_schedule(progress_remaining)
        self.iqr_bonus = linear_anneal(*self.iqr_bonus_range, progress_remaining)
        if hasattr(self.replay_buffer, "beta"):
            self.replay_buffer.beta = linear_anneal(*self.per_beta_range, progress_remaining)
        self.logger.record("rollout/exploration_rate", self.exploration_rate)
        if self.num_timesteps - self._last_diagnostics_step >= self.diagnostics_interval:
            self.log_diagnostics()

    # ------------------------------------------------------------------ learning

    def _distributional_loss(
        self, batch: Any, update_popart: bool, values: bool = True
    ) -> DistributionalLoss:
        """Per-sample loss of one batch, following the module docstring's steps 2–4.

        :param batch: replay samples (SB3's ``ReplayBufferSamples`` fields).
        :param update_popart: update PopArt from this batch's targets (the main batch only).
        :param values: False when only the loss's gradient is used (the vaccine batch): the IQN loss's own
            values are not formed (``l_q`` is zeros carrying its gradient, so ``per_sample`` holds only the
            C51 part's values) and there are no TD errors; the gradients are the same.
        :return: the per-sample losses and per-branch TD errors.
        """
        policy = self.policy
        q_net, q_net_target, popart = self.q_net, self.q_net_target, policy.popart
        n_quantiles, n_target, n_act = policy.n_quantiles, policy.n_quantiles_target, policy.n_quantiles_act
        batch_size, n_branches = batch.observations.shape[0], len(self.action_dims)
        actions = batch.actions.long().reshape(batch_size, n_branches)
        rewards = batch.rewards.reshape(batch_size).float()
        dones = batch.dones.reshape(batch_size).float()
        rand = self._rand

        # 2. BDQ double-Q target y = r + γ(1 − done)·Z' (de-normalised)
        with th.no_grad():
            # Double-Q per branch: the online network picks a' on the ensemble-mean quantile-mean ...
            next_q = _mean_values(q_net, batch.next_observations, rand(batch_size, n_act))  # [B, NB, A]
            next_actions = next_q.masked_fill(~self._valid_actions, -th.inf).argmax(dim=-1)  # [B, NB]
            # ... the target network evaluates it; BDQ averages the branches.
            z_next, next_logits = _taken_quantiles_and_logits(  # [E, B, NB, N'], [B, NB, atoms]
                q_net_target, batch.next_observations, rand(batch_size, n_target), next_actions
            )
            z_next = z_next.mean(dim=2)  # [E, B, N']
            # copies only when PopArt's update below changes the statistics in place
            mu_old, sigma_old = self._popart_stats(copy=update_popart)
            not_done = (1.0 - dones)[None, :, None]
            y = rewards[None, :, None] + self.gamma * not_done * (sigma_old * z_next + mu_old)  # [E, B, N']
            next_probs = th.softmax(next_logits, dim=-1).mean(dim=1)  # [B, atoms]

        # 3. PopArt update from y, then y (and the C51 target) in the normalised space
        if update_popart and popart is not None:
            popart.update(y)  # output-preserving: rescales the online output layers

        with th.no_grad():
            mu, sigma = self._popart_stats(copy=False)  # used right here, before any further update
            y_norm = (y - mu) / sigma
            # C51 target in the (new) normalised space: (r + γ(1-d)(σ_old z + μ_old) - μ) / σ
            c51_rewards = (rewards + self.gamma * (1.0 - dones) * mu_old - mu) / sigma
            target_probs = c51_project(next_probs, c51_rewards, dones, self.gamma * sigma_old / sigma,
                                       policy.support)

        # 4. quantiles and C51 logits of the taken actions; the mixed per-sample loss and TD errors
        taus = rand(batch_size, n_quantiles)
        z_taken, logits_taken = _taken_quantiles_and_logits(  # [E, B, NB, N], [B, NB, atoms]
            q_net, batch.observations, taus, actions
        )
        l_q = quantile_huber_loss(
            z_taken,
            y_norm[:, :, None, :].expand(-1, -1, n_branches, -1),
            taus[None, :, None, :].expand_as(z_taken),
            compiled=self.compile_loss,
            values=values,
        ).mean(dim=(0, 2))  # [B]
        l_c51 = c51_cross_entropy(logits_taken, target_probs[:, None, :].expand_as(logits_taken)).mean(dim=1)
        per_sample = (1.0 - self.c51_alpha) * l_q + self.c51_alpha * l_c51
        if not values:
            return DistributionalLoss(per_sample, l_q, l_c51, None)
        td = y_norm.mean(dim=-1)[:, :, None] - z_taken.detach().mean(dim=-1)  # [E, B, NB]
        td_abs = td.abs().mean(dim=0)  # [B, NB]
        return DistributionalLoss(per_sample, l_q, l_c51, td_abs)

    def train(self, gradient_steps: int, batch_size: int = 256) -> None:
        """Run ``gradient_steps`` gradient steps on batches of ``batch_size`` (no host sync).

        :param gradient_steps: number of gradient steps.
        :param batch_size: minibatch size.
        """
        self.policy.set_training_mode(True)
        self._update_learning_rate(self.policy.optimizer)
        params = list(self.q_net.parameters())
        prioritized = hasattr(self.replay_buffer, "update_priorities")
        for _ in range(gradient_steps):
            # 1. a prioritized batch and its importance weights (ones for a plain buffer)
            batch = self.replay_buffer.sample(batch_size, env=self._vec_normalize_env)
            if hasattr(batch, "weights"):
                weights = batch.weights.reshape(-1).float()
            else:
                weights = th.ones_like(batch.rewards.reshape(-1))
            if self._graphed_step is not None and self._graphed_vaccine_step is not None:
                # 2.-6. as below, as one CUDA graph replay (sb3_her_ext.graphed_step); a vaccine step's graph
                # also runs the stratified batch, sampled here (after the main batch, as the eager step does)
                self._n_gradient_steps += 1
                if self._vaccine_due():
                    vaccine_batch = self._sample_vaccine_batch(batch_size)
                    self._graphed_vaccine_step.run(
                        (batch, vaccine_batch), weights, self._after_step(batch, prioritized)
                    )
                else:
                    self._graphed_step.run((batch,), weights, self._after_step(batch, prioritized))
                continue
            # 2.-4. double-Q target, PopArt update, IQN + C51 loss of the taken actions, weighted
            result = self._distributional_loss(batch, update_popart=True)
            loss = (result.per_sample * weights).mean()
            self.policy.optimizer.zero_grad()
            loss.backward()

            # 5. every vaccine_interval-th step: GradVac correction from a magnitude-stratified batch
            self._n_gradient_steps += 1
            if self._vaccine_due():
                cos, corrected = self._vaccinate(params, self._sample_vaccine_batch(batch_size))
                self.diagnostics.add_vaccine(cos, corrected)

            # 6. clip, optimizer step, PER priorities from the per-branch TD errors
            th.nn.utils.clip_grad_norm_(params, self.max_grad_norm)
            self.policy.optimizer.step()
            if prioritized:
                self.replay_buffer.update_priorities(batch.indices, result.td_abs.sum(dim=1).float())
            self.diagnostics.add_train_step(
                (result.l_q * weights).mean(), (result.l_c51 * weights).mean(), loss, weights.mean()
            )
            del result, loss  # free the autograd graph now: a graphed step may follow on a side stream
        self._n_updates += gradient_steps
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")

    def _vaccine_due(self, step: int | None = None) -> bool:
        """Whether gradient step number ``step`` (default: the current one) gets a vaccine correction."""
        step = self._n_gradient_steps if step is None else step
        return (
            self.vaccine_interval > 0
            and step % self.vaccine_interval == 0
            and hasattr(self.replay_buffer, "sample_stratified")
        )

    # ------------------------------------------------------------------ the graphed step (cuda_graph=True)

    def _step_rand_shapes(self, batch_size: int) -> list[tuple[int, ...]]:
        """Shapes of a gradient step's generator draws, in the order ``_distributional_loss`` draws them."""
        policy = self.policy
        counts = (policy.n_quantiles_act, policy.n_quantiles_target, policy.n_quantiles)
        return [(batch_size, n) for n in counts]

    def _vaccine_rand_shapes(self, batch_size: int) -> list[tuple[int, ...]]:
        """Shapes of a vaccine step's draws: the main batch's loss, then the vaccine batch's."""
        return 2 * self._step_rand_shapes(batch_size)

    def _graphable_step(
        self, batches: tuple[StaticBatch, ...], weights: th.Tensor, rands: list[th.Tensor]
    ) -> StepOutputs:
        """Steps 2–6 of :meth:`train` on static tensors, the draws taken from ``rands``.

        :param batches: the static main batch, and for a vaccine step (step 5) the static vaccine batch.
        :param weights: ``[B]`` static importance weights of the main batch.
        :param rands: the step's random fractions, in draw order (all are used).
        :return: the step's outputs (with the vaccine's cosine and correction flag on a vaccine step).
        """
        params = list(self.q_net.parameters())
        self._rand_queue = rands
        try:
            result = self._distributional_loss(batches[0], update_popart=True)
            loss = (result.per_sample * weights).mean()
            self.policy.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            cos = corrected = None
            if len(batches) > 1:
                cos, corrected = self._vaccinate(params, batches[1])
        finally:
            left, self._rand_queue = self._rand_queue, None
        if left:
            raise RuntimeError(f"{len(left)} static draws left unused: the loss draws other than expected")
        th.nn.utils.clip_grad_norm_(params, self.max_grad_norm)
        self.policy.optimizer.step()
        # Detached outputs: the graph's static outputs live as long as the graph, and an output that kept its
        # autograd graph would keep the parameters' AccumulateGrad nodes (and the capture stream) alive.
        return StepOutputs(
            result.td_abs.sum(dim=1).float(), (result.l_q * weights).mean().detach(),
            (result.l_c51 * weights).mean().detach(), loss.detach(), weights.mean(), cos, corrected,
        )

    def _after_step(self, batch: Any, prioritized: bool) -> Callable[[StepOutputs], None]:
        """What follows a graphed step: the batch's new priorities and the diagnostics sums."""

        def consume(outputs: StepOutputs) -> None:
            if outputs.vaccine_cos is not None and outputs.vaccine_corrected is not None:
                self.diagnostics.add_vaccine(outputs.vaccine_cos, outputs.vaccine_corrected)
            if prioritized:
                self.replay_buffer.update_priorities(batch.indices, outputs.td_abs_sum)
            self.diagnostics.add_train_step(outputs.l_q, outputs.l_c51, outputs.loss, outputs.mean_weight)

        return consume

    def _update_learning_rate(self, optimizers: list[th.optim.Optimizer] | th.optim.Optimizer) -> None:
        """SB3's schedule; with ``cuda_graph`` the rate is a tensor updated in place (the graph reads it)."""
        if not self.cuda_graph:
            super()._update_learning_rate(optimizers)
            return
        learning_rate = self.lr_schedule(self._current_progress_remaining)
        self.logger.record("train/learning_rate", learning_rate)
        for optimizer in optimizers if isinstance(optimizers, list) else [optimizers]:
            for group in optimizer.param_groups:
                if isinstance(group["lr"], th.Tensor):
                    group["lr"].fill_(learning_rate)
                else:
                    group["lr"] = th.tensor(float(learning_rate), device=self.device)

    def _sample_vaccine_batch(self, batch_size: int) -> Any:
        """The vaccine batch: ``batch_size`` rows stratified by the vaccine branch's action (``⅓`` each of
        Small/Half/Full for the magnitude branch)."""
        branch = self._vaccine_branch
        return self.replay_buffer.sample_stratified(batch_size, branch, self.action_dims[branch])

    def _vaccinate(self, params: list[th.nn.Parameter], batch: Any) -> tuple[th.Tensor, th.Tensor]:
        """GradVac: correct the main gradient (in ``params``' grads) with the vaccine ``batch``'s gradient.

        :param params: the online network's parameters, holding the main gradient.
        :param batch: the stratified vaccine batch (:meth:`_sample_vaccine_batch`).
        :return: ``(cos, corrected)``: the gradients' cosine and whether the main one was corrected (0-dim).
        """
        g_main = flat_grad(params)
        self.policy.optimizer.zero_grad()
        # only the gradient is used: no loss values, no TD errors (same gradient)
        self._distributional_loss(batch, update_popart=False, values=False).per_sample.mean().backward()
        g_aux = flat_grad(params)
        g_new, cos, corrected = self.vaccine.correct(g_main, g_aux)
        assign_flat_grad(params, g_new)
        return cos, corrected

    def _rand(self, *shape: int) -> th.Tensor:
        """Uniform ``[0, 1)`` quantile fractions from the model's generator (a graphed step's static draws,
        drawn from it beforehand in the same order, while one runs)."""
        if self._rand_queue is not None:
            drawn = self._rand_queue.pop(0)
            if tuple(drawn.shape) != shape:
                raise RuntimeError(f"static draw of shape {tuple(drawn.shape)} where {shape} was drawn")
            return drawn
        return th.rand(shape, generator=self._generator, device=self.device)

    def _popart_stats(self, copy: bool = True) -> tuple[th.Tensor | float, th.Tensor | float]:
        """PopArt's ``(μ, σ)`` (``(0, 1)`` without PopArt), as tensors: no host sync.

        :param copy: copies (else PopArt's own buffers, which its ``update`` changes in place).
        :return: ``(μ, σ)``.
        """
        popart = self.policy.popart
        if popart is None:
            return 0.0, 1.0
        if not copy:
            return popart.mu.detach(), popart.sigma.detach()
        return popart.mu.detach().clone(), popart.sigma.detach().clone()

    # ------------------------------------------------------------------ diagnostics

    def log_diagnostics(self) -> dict[str, Any]:
        """Write one diagnostics line and the same scalars to the logger (reads the device counters).

        :return: the record written.
        """
        buffer = self.replay_buffer
        per: dict[str, Any] = {"beta": getattr(buffer, "beta", None)}
        if hasattr(buffer, "max_priority"):
            per.update(size=int(buffer.size()), max_priority=float(buffer.max_priority()))
        totals = getattr(buffer, "hindsight_counts", None) or {}
        config = self.hindsight_config
        popart = self.policy.popart
        record = self.diagnostics.flush(
            self.num_timesteps,
            self.logger,
            eps=self.branch_epsilons(),
            popart_mu=float(popart.mu) if popart is not None else 0.0,
            popart_sigma=float(popart.sigma) if popart is not None else 1.0,
            per=per,
            hindsight_totals={kind: int(count) for kind, count in totals.items()},
            threshold=config.threshold if config is not None else None,
            priority_boost=config.priority_boost if config is not None else None,
            iqr_bonus=self.iqr_bonus,
            ep_rew_mean=safe_mean([ep["r"] for ep in self.ep_info_buffer]) if self.ep_info_buffer else None,
            n_updates=self._n_updates,
        )
        if record["loss"] == record["loss"]:  # not NaN: at least one gradient step in the interval
            self.logger.record("train/loss", record["loss"])
        self._last_diagnostics_step = self.num_timesteps
        return record

    def learn(
        self: SelfBranchingIQN,
        total_timesteps: int,
        callback: MaybeCallback = None,
        log_interval: int = 4,
        tb_log_name: str = "BranchingIQN",
        reset_num_timesteps: bool = True,
        progress_bar: bool = False,
    ) -> SelfBranchingIQN:
        """Train for ``total_timesteps`` environment steps (see SB3's ``learn``).

        :param total_timesteps: environment steps to train for.
        :param callback: SB3 callback(s).
        :param log_interval: episodes between logger dumps.
        :param tb_log_name: TensorBoard run name.
        :param reset_num_timesteps: restart the step counter.
        :param progress_bar: show a progress bar.
        :return: the trained model.
        """
        if reset_num_timesteps:
            self._last_diagnostics_step = 0
        self.diagnostics.restart(
            0 if reset_num_timesteps else self.num_timesteps,
            getattr(self.replay_buffer, "hindsight_counts", None),
        )
        return super().learn(
            total_timesteps=total_timesteps,
            callback=callback,
            log_interval=log_interval,
            tb_log_name=tb_log_name,
            reset_num_timesteps=reset_num_timesteps,
            progress_bar=progress_bar,
        )
