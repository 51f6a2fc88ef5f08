"""BranchingIQN: branching distributional Q-learning (IQN + C51) with prioritized hindsight replay, for SB3.

One Q-network head per action branch (BDQ), each head an ensemble of IQN quantile functions plus a C51
categorical head on a PopArt-normalised scale. This module is the SB3 algorithm: arguments, setup, acting,
schedules, saving and logging. The gradient step (sample, double-Q target, PopArt, loss, vaccine, clip,
optimizer step, priorities) is :class:`sb3_her_ext.learner.Learner`, which :meth:`BranchingIQN.train` calls.

The target network is updated in :meth:`BranchingIQN._on_step` as in DQN (every
``target_update_interval`` environment steps, Polyak ``tau``).
Exploration is per branch (see :mod:`sb3_her_ext.exploration`).
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, TypeVar

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import ReplayBuffer
from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm
from stable_baselines3.common.policies import BasePolicy
from stable_baselines3.common.type_aliases import GymEnv, MaybeCallback, Schedule
from stable_baselines3.common.utils import LinearSchedule, polyak_update, safe_mean
from stable_baselines3.common.vec_env import VecEnv

from sb3_her_ext import counterfactual_targets
from sb3_her_ext.arguments import check_arguments, reject_vec_normalize, resolve_hindsight
from sb3_her_ext.branches import branch_action_dims, branch_index, env_branch_names
from sb3_her_ext.collect import DeviceCollector
from sb3_her_ext.concurrent import holding_build_lock
from sb3_her_ext.diagnostics import TrainingDiagnostics
from sb3_her_ext.exploration import (
    branch_epsilons,
    linear_anneal,
    resolve_boltzmann_branches,
    resolve_exploration_mults,
)
from sb3_her_ext.graphed_step import GraphedTrainStep
from sb3_her_ext.guard import NanGuard, named_state, refuse_nonfinite
from sb3_her_ext.learner import DistributionalLoss, Learner
from sb3_her_ext.persistence import ModelFiles
from sb3_her_ext.policy import BranchingIQNPolicy
from sb3_her_ext.replay import HindsightConfig, PrioritizedHindsightReplayBuffer
from sb3_her_ext.vaccine import GradVac
from sb3_her_ext.validation import check_learning_rate

SelfBranchingIQN = TypeVar("SelfBranchingIQN", bound="BranchingIQN")

#: The default learning rate. At rl-zoo3's QR-DQN CartPole-v1 settings (128 gradient steps between target
#: copies) 1e-4 left the quantile heads short of their targets and the greedy policy unstable; 5e-4 held 500
#: (``benchmarks/RESULTS.md``, "CartPole-v1 at rl-zoo3's QR-DQN settings").
DEFAULT_LEARNING_RATE = 5e-4


class BranchingIQN(ModelFiles, OffPolicyAlgorithm):
    """Branching IQN with C51 mixing, PopArt, GradVac vaccine and prioritized hindsight replay.

    DQN's arguments keep DQN's names and meaning; see :class:`stable_baselines3.DQN`.

    :param policy: the policy model (``"MlpPolicy"`` or a :class:`BranchingIQNPolicy` subclass).
    :param env: the environment (``MultiDiscrete`` or ``Discrete`` actions, ``Box`` observations).
    :param learning_rate: learning rate, constant or a schedule of the progress remaining (default
        :data:`DEFAULT_LEARNING_RATE`, 5e-4; DQN's tuned rates are too high for the distributional heads).
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
        (process-wide, and left on; without its NaN fill of new allocations) so that the same seed gives the
        same results on the GPU.
    :param device: ``"cpu"``, ``"cuda"`` or ``"auto"``.
    :param c51_alpha: weight of the C51 loss in ``(1 − α)·L_IQN + α·L_C51``, fixed from the first step.
    :param exploration_mults: per-branch ε multipliers (``ε_b = min(1, ε·mult_b)``): a list of length NB or
        a dict by branch name or index (branches left out: 1); default 1 for every branch.
    :param boltzmann_branches: branches (names or indices) that explore by Boltzmann sampling instead of
        uniformly; default none.
    :param iqr_bonus: ``(start, end)`` weight of the IQR optimism bonus, annealed linearly over training.
    :param ensemble_bonus: weight of the ensemble-std optimism bonus.
    :param per_alpha: PER priority exponent.
    :param per_beta: ``(start, end)`` PER importance exponent, annealed linearly over training.
    :param hindsight: ``True``/``False``/``"auto"``/dict of :class:`HindsightConfig` fields/a config.
    :param vaccine_interval: every this many gradient steps, a GradVac correction from a batch stratified by
        the actions of ``vaccine_branch`` (0: never).
    :param vaccine_branch: the branch (index or name) whose actions stratify the vaccine batch (an equal
        share of rows per action); default the first branch.
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
    :param nan_guard: the NaN guard (:mod:`sb3_her_ext.guard`): a non-finite reward or observation is
        refused before it is stored, and a non-finite target, loss or gradient stops training without
        applying that step, with a :class:`~sb3_her_ext.guard.NonFiniteError`. On the CPU it raises at once;
        on a GPU it raises at the next sync point (a diagnostics line, the end of ``learn``,
        :meth:`check_finite`).
    :param graph_collect: on a device vector env, ``learn`` runs training blocks (:mod:`sb3_her_ext.collect`:
        each rollout of ``train_freq`` vector steps with its gradient steps); with ``cuda_graph=True`` on CUDA
        each block is ONE CUDA graph replay. ``None`` (default): captured whenever the configuration allows,
        ``False``: blocks run eagerly; ``True``: as ``None``, ``cuda_graph=True`` is required, and blocks that
        run eagerly warn once with the reason. A failed capture leaves the blocks eager with one warning.
    :param counterfactual: learn from the exact outcome of every action (or, on a large action space, of
        each branch's values with the other branches greedy) from each replayed state, in the same gradient
        step (:mod:`sb3_her_ext.counterfactual_targets`); the env must implement
        :class:`~sb3_her_ext.counterfactual.CounterfactualEnv`. Not with hindsight relabels or
        autoregressive branches.
    :param counterfactual_actions: the joint face (every joint action) when the action space has at most
        this many actions, else the per-branch face.
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
        learning_rate: float | Schedule = DEFAULT_LEARNING_RATE,
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
        vaccine_branch: int | str = 0,
        diagnostics_path: str | None = None,
        diagnostics_interval: int = 1000,
        compile_loss: bool = False,
        cuda_graph: bool = False,
        nan_guard: bool = True,
        graph_collect: bool | None = None,
        counterfactual: bool = False,
        counterfactual_actions: int = counterfactual_targets.DEFAULT_JOINT_CAP,
        _init_setup_model: bool = True,
    ) -> None:
        if env is None and _init_setup_model:  # SB3 takes env=None only for a model built later (its load)
            raise ValueError("env=None: BranchingIQN builds its networks from the env's spaces; pass an env "
                             "(a Gym env, a VecEnv or an env id), or _init_setup_model=False as SB3's load")
        # every argument is checked before SB3 sees it (its errors name no argument)
        checked = check_arguments(**{k: v for k, v in locals().items() if k not in ("self", "__class__")})
        buffer_size, batch_size = checked["buffer_size"], checked["batch_size"]
        learning_starts, gradient_steps = checked["learning_starts"], checked["gradient_steps"]
        target_update_interval = checked["target_update_interval"]
        diagnostics_interval, vaccine_interval = checked["diagnostics_interval"], checked["vaccine_interval"]
        seed = checked["seed"]
        self.iqr_bonus_range, self.per_beta_range = checked["iqr_bonus_range"], checked["per_beta_range"]

        super().__init__(
            policy, env, learning_rate, buffer_size, learning_starts, batch_size, tau, gamma, train_freq,
            gradient_steps, action_noise=None, replay_buffer_class=replay_buffer_class,
            replay_buffer_kwargs=replay_buffer_kwargs, optimize_memory_usage=optimize_memory_usage,
            policy_kwargs=policy_kwargs, stats_window_size=stats_window_size, tensorboard_log=tensorboard_log,
            verbose=verbose, device=device, seed=seed, sde_support=False,
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
        self.vaccine_branch = vaccine_branch
        self.diagnostics_path = diagnostics_path
        self.diagnostics_interval = diagnostics_interval
        self.compile_loss = compile_loss
        self.cuda_graph = cuda_graph
        self.nan_guard = nan_guard
        self.graph_collect = graph_collect
        self.counterfactual, self.counterfactual_actions = counterfactual, counterfactual_actions
        if cuda_graph and self.device.type != "cuda":
            raise ValueError(f"cuda_graph=True needs a CUDA device, got device={self.device}")
        self._start_counters()
        if getattr(self, "action_space", None) is not None:  # unset only in `load`, which restores it all
            self._settings_from_env(exploration_mults, boltzmann_branches, hindsight)

        if _init_setup_model:
            self._setup_model()

    def _start_counters(self) -> None:
        """The progress counters and the annealed values at the start of training."""
        self.exploration_rate = 0.0
        self.iqr_bonus = self.iqr_bonus_range[0]
        self._n_calls = 0
        self._n_gradient_steps = 0
        self._last_diagnostics_step = 0

    def _settings_from_env(self, exploration_mults: Sequence[float] | Mapping[int | str, float] | None,
                           boltzmann_branches: Sequence[int | str] | None,
                           hindsight: bool | str | Mapping[str, Any] | HindsightConfig) -> None:
        """The settings that depend on the env: branches, their names, exploration, hindsight, the policy's
        market features and the replay buffer's arguments (see ``__init__``'s parameters)."""
        if not isinstance(self.observation_space, spaces.Box):
            raise ValueError(f"observation_space={self.observation_space} is not supported: it must be a "
                             "Box")
        self.action_dims = branch_action_dims(self.action_space)
        self.branch_names = env_branch_names(self.env, len(self.action_dims))
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

    # ------------------------------------------------------------------ setup

    @holding_build_lock  # SB3 seeds the process-wide generators here: one build at a time (concurrent.py)
    def _setup_model(self) -> None:
        """Build the policy and buffer (SB3), then schedules, action masks, generator, vaccine, diagnostics
        and the learner.

        On CUDA this sets ``CUBLAS_WORKSPACE_CONFIG`` (unless set) before the model's first cuBLAS call, and
        for a seeded run calls ``torch.use_deterministic_algorithms(True, warn_only=True)``: without them the
        backward pass's scatter-adds and cuBLAS may reorder float additions, and the same seed would not give
        the same parameters on the GPU. It also sets ``torch.utils.deterministic.fill_uninitialized_memory``
        to False (deterministic mode would otherwise launch a fill kernel after every allocation). All are
        process-wide and stay after the model is gone; ops without a deterministic kernel only warn.
        """
        if self.cuda_graph and self.device.type != "cuda":  # a graphed model loaded onto a CPU
            warnings.warn(
                f"cuda_graph=True needs a CUDA device; device={self.device}: eager steps", stacklevel=2
            )
            self.cuda_graph = False
        if self.device.type == "cuda":
            # read when cuBLAS creates its first handle; with it, seeded CUDA runs can be deterministic
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        # the policy resolves name keys (bottleneck_dims) with the branch names the env publishes
        self.policy_kwargs = {"branch_names": list(self.branch_names), **self.policy_kwargs}
        optimizer_kwargs = dict(self.policy_kwargs.get("optimizer_kwargs") or {})
        if self.cuda_graph:
            optimizer_kwargs["capturable"] = True  # the optimizer step is part of the graph
        else:
            optimizer_kwargs.pop("capturable", None)
        self.policy_kwargs = {**self.policy_kwargs, "optimizer_kwargs": optimizer_kwargs}
        if getattr(self, "counterfactual", False):  # before the buffer: it keeps the env's states
            counterfactual_targets.configure(self)
        super()._setup_model()
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
            # nothing here reads memory it did not write: no NaN fill kernel after every empty allocation
            th.utils.deterministic.fill_uninitialized_memory = False
        self._generator = th.Generator(device=self.device)
        self._generator.manual_seed(self.seed if self.seed is not None else int(np.random.randint(2**31)))
        self.vaccine = GradVac(beta=self.vaccine_beta).to(self.device)
        if not hasattr(self, "vaccine_branch"):  # a model saved before the argument existed
            self.vaccine_branch = getattr(self, "_vaccine_branch", 0)
        self.vaccine_branch_index = branch_index(self.vaccine_branch, self.branch_names, "vaccine_branch")
        self.diagnostics = TrainingDiagnostics(
            self.diagnostics_path, self.action_dims, self.branch_names, self.device
        )
        if not hasattr(self, "nan_guard"):  # a model saved before the argument existed
            self.nan_guard = True
        self.guard = NanGuard(self.device) if self.nan_guard else None
        self._diagnostics_clock = time.time()
        self.learner = Learner(
            self.policy,
            self.action_dims,
            gamma=self.gamma,
            c51_alpha=self.c51_alpha,
            max_grad_norm=self.max_grad_norm,
            vaccine=self.vaccine,
            vaccine_interval=self.vaccine_interval,
            vaccine_branch=self.vaccine_branch_index,
            diagnostics=self.diagnostics,
            generator=self._generator,
            device=self.device,
            compile_loss=self.compile_loss,
            cuda_graph=self.cuda_graph,
            guard=self.guard,
        )
        if getattr(self, "counterfactual", False):
            self.learner.counterfactual = counterfactual_targets.CounterfactualTargets(
                lambda: self.env, self.action_dims, self.counterfactual_actions, self.device)
        #: training on a device vector env (its block's device state and CUDA graphs; not saved)
        self.collector = DeviceCollector(self)
        assert n_branches == self.q_net.n_branches, "policy and action space disagree on the branches"

    def _excluded_save_params(self) -> list[str]:
        return [
            *super()._excluded_save_params(),
            "learner",
            "vaccine",
            "diagnostics",
            "guard",
            "_generator",
            "_n_actions",
            "_valid_actions",
            "_mults",
            "_boltzmann",
            "collector",
        ]

    def _get_torch_save_params(self) -> tuple[list[str], list[str]]:
        # PopArt statistics live in the policy's state dict; GradVac's target cosine in ``vaccine``.
        return ["policy", "policy.optimizer", "vaccine"], []

    @property
    def q_net(self) -> th.nn.Module:
        """The online network the learner trains (the policy's)."""
        return self.learner.q_net

    @q_net.setter
    def q_net(self, net: th.nn.Module) -> None:
        self.learner.q_net = net

    @property
    def q_net_target(self) -> th.nn.Module:
        """The target network the learner reads (the policy's)."""
        return self.learner.q_net_target

    @q_net_target.setter
    def q_net_target(self, net: th.nn.Module) -> None:
        self.learner.q_net_target = net

    @property
    def _graphed_step(self) -> GraphedTrainStep | None:
        """The learner's graph of the plain gradient steps (``cuda_graph=True``), else None."""
        return self.learner.graphed_step

    @property
    def _graphed_vaccine_step(self) -> GraphedTrainStep | None:
        """The learner's graph of the vaccine gradient steps (``cuda_graph=True``), else None."""
        return self.learner.graphed_vaccine_step

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
        actions = self.explore(obs_tensor)  # the training block's selection, then one copy to the host
        actions_np = actions.cpu().numpy().reshape((-1, *self.action_space.shape))
        if not vectorized:
            actions_np = actions_np.squeeze(axis=0)
        return actions_np, state

    def explore(self, obs: th.Tensor, exploration_rate: th.Tensor | None = None,
                iqr_bonus: th.Tensor | None = None, branch_rates: th.Tensor | None = None) -> th.Tensor:
        """Exploratory actions on the device: ``predict(obs, deterministic=False)`` without the host copy.

        :param obs: ``[N, D]`` observations on the model's device.
        :param exploration_rate: ε as a 0-dim float32 device tensor; None: :attr:`exploration_rate`.
        :param iqr_bonus: the IQR bonus weight as a 0-dim float32 device tensor; None: :attr:`iqr_bonus`.
        :param branch_rates: ``[NB]`` per-branch rates, a row of :meth:`branch_rates` made for several steps
            at once (then ``exploration_rate`` is not read).
        :return: ``[N, NB]`` int64 actions on the device.
        """
        with th.no_grad():
            if branch_rates is None:
                branch_rates = self.branch_rates(
                    self.exploration_rate if exploration_rate is None else exploration_rate
                )
            actions, iqr, ens_std = self.policy.explore(
                obs, self._n_actions, branch_rates, self._boltzmann,
                self.iqr_bonus if iqr_bonus is None else iqr_bonus, self.ensemble_bonus, self._generator,
            )
            self.diagnostics.add_selection(iqr, ens_std, self._valid_actions)
        return actions

    def branch_rates(self, exploration_rates: th.Tensor | float) -> th.Tensor:
        """Per-branch exploration rates ``min(1, ε·mult_b)`` on the device: ``[NB]`` for one ε (a number or
        0-dim tensor), ``[k, NB]`` for ``[k, 1]`` values."""
        return branch_epsilons(exploration_rates, self._mults)

    @property
    def generator(self) -> th.Generator:
        """The model's generator: exploration uniforms, quantile fractions (seeded from ``seed``)."""
        return self._generator

    # ------------------------------------------------------------------ SB3's loop (any other VecEnv)

    def collect_rollouts(self, env: VecEnv, callback: Any, train_freq: Any, replay_buffer: ReplayBuffer,
                         action_noise: Any = None, learning_starts: int = 0,
                         log_interval: int | None = None) -> Any:
        """SB3's ``collect_rollouts``, after fitting a pending observation normalizer at the first rollout
        that trains (a device env's ``learn`` does the same in :meth:`DeviceCollector.run_rollout`)."""
        if self.policy.observation_normalizer_pending and self.num_timesteps >= learning_starts:
            self._fit_observation_normalizer(required=False)  # before the first rollout that trains
        return super().collect_rollouts(env, callback, train_freq, replay_buffer, action_noise,
                                        learning_starts, log_interval)

    def update_progress(self) -> bool:
        """Set SB3's progress remaining at ``num_timesteps``; return whether the learn's total is reached."""
        self._update_current_progress_remaining(self.num_timesteps, self._total_timesteps)
        return self.num_timesteps >= self._total_timesteps

    def advance_schedules(self) -> bool:
        """Count one ``_on_step`` call and move ε, the IQR bonus and PER β to the current progress (host
        numbers; a training block computes the same values on the device from its counters); return whether
        the target update is due."""
        self._n_calls += 1
        progress_remaining = self._current_progress_remaining
        self.exploration_rate = self.exploration_schedule(progress_remaining)
        self.iqr_bonus = linear_anneal(*self.iqr_bonus_range, progress_remaining)
        if hasattr(self.replay_buffer, "beta"):
            self.replay_buffer.beta = linear_anneal(*self.per_beta_range, progress_remaining)
        self.logger.record("rollout/exploration_rate", self.exploration_rate)
        return self._n_calls % max(self.target_update_interval // self.n_envs, 1) == 0

    def after_env_step(self) -> None:
        """SB3's ``_on_step``, after each vector step: schedules, the target update and a diagnostics line
        when due."""
        if self.advance_schedules():
            polyak_update(self.q_net.parameters(), self.q_net_target.parameters(), self.tau)
        if self.diagnostics_due():
            self.log_diagnostics()

    _on_step = after_env_step

    def diagnostics_due(self) -> bool:
        """Whether a diagnostics line is due (``diagnostics_interval`` env steps since the last)."""
        return self.num_timesteps - self._last_diagnostics_step >= self.diagnostics_interval

    def record_episodes(self, episodes: Sequence[tuple[float, int]], finished: int, seconds: float) -> int:
        """Add the ``(return, length)`` of the last of ``finished`` episodes the device collector read, at
        ``seconds`` into the ``learn``, to SB3's statistics; return the count of episodes so far."""
        self.ep_info_buffer.extend({"r": r, "l": length, "t": seconds} for r, length in episodes)
        self._episode_num += finished
        return self._episode_num

    def _store_transition(
        self,
        replay_buffer: ReplayBuffer,
        buffer_action: np.ndarray,
        new_obs: np.ndarray | dict[str, np.ndarray],
        reward: np.ndarray,
        dones: np.ndarray,
        infos: list[dict[str, Any]],
    ) -> None:
        if self.guard is not None:  # host arrays: the check is free; nothing is stored when it fails
            final = np.array(new_obs, copy=True)  # each env's next obs as stored: its terminal obs at an end
            for i in np.flatnonzero(dones):
                if infos[i].get("terminal_observation") is not None:
                    final[i] = infos[i]["terminal_observation"]
            observations = [o for o in (self._last_obs, new_obs, final) if o is not None]
            self.guard.check_env_arrays(self.num_timesteps, observations, reward)
        self.diagnostics.add_actions(buffer_action)
        super()._store_transition(replay_buffer, buffer_action, new_obs, reward, dones, infos)

    # ------------------------------------------------------------------ learning

    def train(self, gradient_steps: int, batch_size: int = 256) -> None:
        """Run ``gradient_steps`` gradient steps on batches of ``batch_size`` (:meth:`Learner.train_step`; no
        host sync); SB3's loop (a device env's blocks run their own: :mod:`sb3_her_ext.collect`).

        :param gradient_steps: number of gradient steps.
        :param batch_size: minibatch size.
        """
        self.policy.set_training_mode(True)
        self._update_learning_rate(self.policy.optimizer)
        if self.policy.observation_normalizer_pending:
            self._fit_observation_normalizer()
        for _ in range(gradient_steps):
            self._n_gradient_steps += 1
            self.learner.train_step(
                self.replay_buffer, batch_size, self._n_gradient_steps, env=self._vec_normalize_env
            )
        self._n_updates += gradient_steps
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")

    def _fit_observation_normalizer(self, required: bool = True) -> None:
        """Fit the policy's observation standardisation to the replay buffer's rows, once: when the first
        rollout past ``learning_starts`` begins (every loop alike), else before the first gradient step. One
        device sync; the rows are then the ``learning_starts`` exploration data.

        :param required: raise when the buffer holds fewer than 2 rows (else leave the fit for later).
        """
        rows = self.replay_buffer.size()
        if rows < 2 and not required:
            return
        if rows < 2:
            raise ValueError(f"the replay buffer holds {rows} rows: normalize_observations needs >= 2 to fit "
                             "(raise learning_starts)")
        self.policy.fit_observation_normalizer(self.replay_buffer.observations[:rows])

    def _distributional_loss(
        self, batch: Any, update_popart: bool, values: bool = True
    ) -> DistributionalLoss:
        """The per-sample loss of one batch: :meth:`Learner.loss` (its arguments and return)."""
        return self.learner.loss(batch, update_popart, values)

    def _update_learning_rate(self, optimizers: list[th.optim.Optimizer] | th.optim.Optimizer) -> None:
        """SB3's schedule; with ``cuda_graph`` the rate is a tensor updated in place (the graph reads it).

        Every value is checked (a host number: free): a schedule that gives a non-finite or non-positive
        rate stops training with a ValueError naming ``learning_rate`` before any step uses it.
        """
        progress = self._current_progress_remaining
        check_learning_rate("learning_rate", self.lr_schedule(progress), progress)
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
        if self.guard is not None:  # a sync point: the line (with its non-finite loss) is written first
            self.guard.raise_if_tripped()
        return record

    def check_finite(self) -> None:
        """Raise :class:`~sb3_her_ext.guard.NonFiniteError` if the NaN guard recorded a failure, or if a
        parameter or a PopArt statistic is not finite (reads the device: call it at sync points, e.g. before
        a checkpoint).
        """
        if self.guard is not None:
            self.guard.raise_if_tripped()
        refuse_nonfinite(named_state(self.policy, self.policy.optimizer), self.guard, self._n_gradient_steps,
                         "checkpoint")

    def set_env(self, env: GymEnv, force_reset: bool = True) -> None:
        """SB3's ``set_env``, refusing ``VecNormalize`` (see :func:`reject_vec_normalize`)."""
        reject_vec_normalize(env)
        super().set_env(env, force_reset)
        if getattr(self, "counterfactual", False):
            counterfactual_targets.enable(self, self.env)

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
        if self.collector.supports(self.env, self.train_freq, self.action_noise):  # a device env: blocks
            learn = self.collector.learn
        else:
            learn = super().learn
        model = learn(
            total_timesteps=total_timesteps,
            callback=callback,
            log_interval=log_interval,
            tb_log_name=tb_log_name,
            reset_num_timesteps=reset_num_timesteps,
            progress_bar=progress_bar,
        )
        if self.guard is not None:  # the end of learn is a sync point
            self.guard.raise_if_tripped()
        return model
