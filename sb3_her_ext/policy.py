"""BranchingIQN's SB3 policy: the online and target :class:`~sb3_her_ext.networks.BranchingQNetwork`, PopArt,
the C51 support and the optimizer; acting here is greedy (the algorithm adds exploration).

The network lives in :mod:`sb3_her_ext.networks`, its hand-fused training passes in
:mod:`sb3_her_ext.fused_iqn_head`; the names they define are importable from here too, as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.policies import BasePolicy
from stable_baselines3.common.torch_layers import FlattenExtractor
from stable_baselines3.common.type_aliases import PyTorchObs, Schedule
from torch import nn

from sb3_her_ext.branches import branch_action_dims, branch_index, default_branch_names
from sb3_her_ext.exploration import select_actions
from sb3_her_ext.fused_iqn_head import TakenQuantileHead as _TakenQuantileHead
from sb3_her_ext.networks import BranchingQNetwork, BranchLinear, _taken_logits, quantile_iqr
from sb3_her_ext.popart import PopArt
from sb3_her_ext.validation import check_positive

__all__ = [
    "BranchLinear",
    "BranchingIQNPolicy",
    "BranchingQNetwork",
    "MlpPolicy",
    "_TakenQuantileHead",
    "_taken_logits",
    "branch_action_dims",
    "default_optimizer_kwargs",
    "quantile_iqr",
    "resolve_bottleneck_dims",
]

#: Bottleneck width of every branch unless given.
DEFAULT_BOTTLENECK_DIM = 8
#: Per-branch MLP of the policy when ``net_arch`` is None: small enough for a fast CPU gradient step.
DEFAULT_NET_ARCH: tuple[int, ...] = (128, 128)

def default_optimizer_kwargs(
    optimizer_class: type[th.optim.Optimizer], optimizer_kwargs: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The optimizer's keyword arguments: the user's, with ``fused=True`` added for Adam and AdamW.

    The fused implementation (CPU and CUDA) updates every parameter in one kernel instead of ~9 per
    parameter (same update up to float rounding). It is not added when the user chooses ``fused``,
    ``foreach`` or ``differentiable`` themselves (``optimizer_kwargs={"fused": False}`` turns it off).

    :param optimizer_class: the optimizer class.
    :param optimizer_kwargs: the user's keyword arguments (None: none).
    :return: a new dict.
    """
    kwargs = dict(optimizer_kwargs or {})
    chosen = {"fused", "foreach", "differentiable"} & kwargs.keys()
    if optimizer_class in (th.optim.Adam, th.optim.AdamW) and not chosen:
        kwargs["fused"] = True
    return kwargs



def resolve_bottleneck_dims(
    n_branches: int,
    bottleneck_dims: Sequence[int] | Mapping[int | str, int] | None,
    branch_names: Sequence[str] | None = None,
) -> list[int]:
    """Per-branch bottleneck widths from a sequence, an index/name mapping of overrides, or None (defaults).

    Default: ``DEFAULT_BOTTLENECK_DIM`` (8) for every branch; a mapping overrides the branches it names.

    :param n_branches: number of action branches.
    :param bottleneck_dims: the user's setting.
    :param branch_names: the branches' names, for name keys (None: ``"0", "1", ...``).
    :return: one positive width per branch.
    """
    names = list(default_branch_names(n_branches) if branch_names is None else branch_names)
    if len(names) != n_branches:
        raise ValueError(f"branch_names={names} has {len(names)} names for {n_branches} branches")
    widths = [DEFAULT_BOTTLENECK_DIM] * n_branches
    if bottleneck_dims is None:
        return widths
    if isinstance(bottleneck_dims, Mapping):
        for key, width in bottleneck_dims.items():
            if isinstance(key, str):
                if key not in names:
                    raise ValueError(f"bottleneck_dims key {key!r} is not a branch name ({names})")
            elif not isinstance(key, int | np.integer) or isinstance(key, bool) or not 0 <= key < n_branches:
                raise ValueError(f"bottleneck_dims key {key!r} must be a branch index in [0, {n_branches})")
            check_positive(f"bottleneck_dims[{key!r}]", width)
            widths[branch_index(key, names, "bottleneck_dims")] = int(width)
        return widths
    if isinstance(bottleneck_dims, str) or len(bottleneck_dims) != n_branches:
        raise ValueError(f"bottleneck_dims={bottleneck_dims!r} must have one width per branch ({n_branches})")
    for b, width in enumerate(bottleneck_dims):
        check_positive(f"bottleneck_dims[{b}]", width)
    return [int(w) for w in bottleneck_dims]


class BranchingIQNPolicy(BasePolicy):
    """Policy of ``BranchingIQN``: online and target :class:`BranchingQNetwork`, PopArt, C51 support.

    Acting here is greedy (the algorithm adds exploration): the greedy action maximises the ensemble-mean
    quantile mean at a fixed midpoint grid of ``n_quantiles_act`` fractions, so it is deterministic for
    fixed weights.

    :param observation_space: a ``Box`` (flattened).
    :param action_space: ``MultiDiscrete`` (one branch per entry) or ``Discrete`` (one branch).
    :param lr_schedule: learning-rate schedule (``lr_schedule(1)`` is the initial rate).
    :param n_market_features: leading market features of the flat observation; None = all features.
    :param bottleneck_dims: per-branch widths, as a sequence or a mapping {index or name: width} of
        overrides; None = defaults (see :func:`resolve_bottleneck_dims`).
    :param branch_names: the branches' names, for the name keys of ``bottleneck_dims``; None =
        ``"0", "1", ...`` (:class:`~sb3_her_ext.BranchingIQN` passes the names the env publishes).
    :param net_arch: per-branch hidden layers; None = ``(128, 128)``.
    :param n_ensemble: IQN output heads per branch.
    :param n_cos: cosine embedding size.
    :param n_quantiles: ``N``, online quantile fractions per training sample.
    :param n_quantiles_target: ``N'``, target quantile fractions per training sample.
    :param n_quantiles_act: ``K``, quantile fractions for acting.
    :param n_atoms: number of C51 atoms.
    :param v_min: lowest C51 atom (in the PopArt-normalised space when PopArt is on).
    :param v_max: highest C51 atom.
    :param activation_fn: activation function.
    :param popart: normalise the IQN targets with PopArt (the IQN output layers of both networks are
        registered). The C51 head is not rescaled: its atoms are a fixed support in the normalised space, and
        the algorithm projects ``(r + γ(1 − d)(σ_old z + μ_old) − μ) / σ`` onto it (``σ_old``, ``μ_old``: the
        statistics before this batch's PopArt update; see :meth:`sb3_her_ext.learner.Learner.loss`).
    :param popart_beta: PopArt's moment step size.
    :param optimizer_class: optimizer of the online network.
    :param optimizer_kwargs: optimizer keyword arguments, without the learning rate; Adam and AdamW get
        ``fused=True`` unless these choose ``fused``, ``foreach`` or ``differentiable``
        (see :func:`default_optimizer_kwargs`).
    :param normalize_images: kept for SB3 compatibility (observations are flat vectors; unused).
    :param shared_tau_embedding: share the ``tau`` embedding layer across branches (see
        :class:`BranchingQNetwork`); False gives each branch its own.
    :param normalize_observations: standardise every observation feature with a mean and standard
        deviation fitted once, on the replay buffer's rows when training starts (see
        :meth:`BranchingQNetwork.fit_observation_normalizer`); False feeds the raw observations.
    :param branch_coupling: ``"independent"`` (BDQ: each branch valued over the others' choices) or
        ``"autoregressive"`` (branch ``b`` conditioned on the sub-actions of branches ``< b``; acting decodes
        greedily branch by branch, the target's argmax the same way, and each earlier branch is trained
        towards the next branch's best value given its prefix; see :mod:`sb3_her_ext.networks` and
        :meth:`sb3_her_ext.learner.Learner.loss`).
    """

    q_net: BranchingQNetwork
    q_net_target: BranchingQNetwork
    support: th.Tensor

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        lr_schedule: Schedule,
        n_market_features: int | None = None,
        bottleneck_dims: Sequence[int] | Mapping[int | str, int] | None = None,
        branch_names: Sequence[str] | None = None,
        net_arch: Sequence[int] | None = None,
        n_ensemble: int = 5,
        n_cos: int = 64,
        n_quantiles: int = 32,
        n_quantiles_target: int = 32,
        n_quantiles_act: int = 32,
        n_atoms: int = 51,
        v_min: float = -10.0,
        v_max: float = 10.0,
        activation_fn: type[nn.Module] = nn.ReLU,
        popart: bool = True,
        popart_beta: float = 3e-4,
        optimizer_class: type[th.optim.Optimizer] = th.optim.Adam,
        optimizer_kwargs: dict[str, Any] | None = None,
        normalize_images: bool = False,
        shared_tau_embedding: bool = True,
        normalize_observations: bool = True,
        branch_coupling: str = "independent",
    ) -> None:
        if not isinstance(observation_space, spaces.Box):
            raise ValueError(f"observation_space={observation_space} is not supported (Box only)")
        super().__init__(
            observation_space,
            action_space,
            features_extractor_class=FlattenExtractor,
            optimizer_class=optimizer_class,
            optimizer_kwargs=default_optimizer_kwargs(optimizer_class, optimizer_kwargs),
            normalize_images=normalize_images,
        )
        action_dims = branch_action_dims(action_space)
        obs_dim = int(np.prod(observation_space.shape))
        if n_market_features is None:
            n_market_features = obs_dim
        check_positive("n_market_features", n_market_features)
        if n_market_features > obs_dim:
            raise ValueError(f"n_market_features={n_market_features} must be <= observation dim {obs_dim}")
        for name, value in (
            ("n_quantiles", n_quantiles),
            ("n_quantiles_target", n_quantiles_target),
            ("n_quantiles_act", n_quantiles_act),
            ("n_atoms", n_atoms),
        ):
            check_positive(name, value)
        if n_atoms < 2:
            raise ValueError(f"n_atoms={n_atoms} must be >= 2")
        if not v_min < v_max:
            raise ValueError(f"v_min={v_min} must be < v_max={v_max}")

        self.n_market_features = int(n_market_features)
        self.branch_names = None if branch_names is None else [str(name) for name in branch_names]
        self.bottleneck_dims = resolve_bottleneck_dims(len(action_dims), bottleneck_dims, self.branch_names)
        self.net_arch = list(DEFAULT_NET_ARCH if net_arch is None else net_arch)
        self.n_ensemble = n_ensemble
        self.n_cos = n_cos
        self.n_quantiles = n_quantiles
        self.n_quantiles_target = n_quantiles_target
        self.n_quantiles_act = n_quantiles_act
        self.n_atoms = n_atoms
        self.v_min = float(v_min)
        self.v_max = float(v_max)
        self.activation_fn = activation_fn
        self.use_popart = popart
        self.popart_beta = popart_beta
        self.net_args: dict[str, Any] = dict(
            obs_dim=obs_dim,
            n_market_features=self.n_market_features,
            action_dims=action_dims,
            bottleneck_dims=self.bottleneck_dims,
            net_arch=self.net_arch,
            n_ensemble=n_ensemble,
            n_cos=n_cos,
            n_atoms=n_atoms,
            activation_fn=activation_fn,
            shared_tau_embedding=shared_tau_embedding,
            normalize_observations=bool(normalize_observations),
            branch_coupling=branch_coupling,
        )
        self._build(lr_schedule)

    def _build(self, lr_schedule: Schedule) -> None:
        """Create the networks, PopArt, the C51 support and the optimizer.

        :param lr_schedule: learning-rate schedule.
        """
        self.q_net = BranchingQNetwork(**self.net_args)
        self.q_net_target = BranchingQNetwork(**self.net_args)
        self.q_net_target.load_state_dict(self.q_net.state_dict())
        self.q_net_target.train(False)
        self.q_net_target.requires_grad_(False)
        self.popart: PopArt | None = PopArt(beta=self.popart_beta) if self.use_popart else None
        if self.popart is not None:
            self.popart.register(self.q_net.iqn_out, self.q_net_target.iqn_out)
        self.q_net.attach_popart(self.popart)
        self.q_net_target.attach_popart(self.popart)
        self.register_buffer("support", th.linspace(self.v_min, self.v_max, self.n_atoms))
        act_taus = (th.arange(self.n_quantiles_act, dtype=th.float32) + 0.5) / self.n_quantiles_act
        self.register_buffer("act_taus", act_taus, persistent=False)
        self.optimizer = self.optimizer_class(  # type: ignore[call-arg]
            self.q_net.parameters(), lr=lr_schedule(1), **self.optimizer_kwargs
        )

    @property
    def action_dims(self) -> list[int]:
        """:return: number of actions of each branch."""
        return self.q_net.action_dims

    @property
    def n_branches(self) -> int:
        """:return: number of action branches."""
        return self.q_net.n_branches

    def _flat_obs(self, obs: PyTorchObs) -> th.Tensor:
        if not isinstance(obs, th.Tensor):
            raise ValueError(f"obs of type {type(obs).__name__} must be a tensor (Box observations)")
        return obs.float().reshape(obs.shape[0], -1)

    def sample_taus(self, batch_size: int, n: int, generator: th.Generator | None = None) -> th.Tensor:
        """Fresh uniform quantile fractions.

        :param batch_size: ``B``.
        :param n: fractions per row.
        :param generator: the generator to draw from (the model's while training, so that a model's draws do
            not depend on anything else in the process); None: torch's global one.
        :return: ``[B, n]`` on the policy's device.
        """
        return th.rand(batch_size, n, device=self.device, generator=generator)

    def forward(self, obs: PyTorchObs, deterministic: bool = True) -> th.Tensor:
        """Greedy actions.

        :param obs: observations ``[B, *obs_shape]``.
        :param deterministic: unused (acting here is always greedy).
        :return: ``[B, NB]`` long.
        """
        return self._predict(obs, deterministic=deterministic)

    def _predict(self, observation: PyTorchObs, deterministic: bool = True) -> th.Tensor:
        """Greedy actions from the online network at the fixed midpoint fractions ``(k + 0.5) / K``.

        :param observation: observations ``[B, *obs_shape]``.
        :param deterministic: unused (exploration lives in the algorithm).
        :return: ``[B, NB]`` long.
        """
        obs = self._flat_obs(observation)
        taus = self.act_taus.expand(obs.shape[0], -1)
        q, _, _ = self.q_net.action_stats(obs, taus)
        return q.argmax(dim=-1)

    def action_stats(self, obs: PyTorchObs, generator: th.Generator | None = None
                     ) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
        """``(q, iqr, ens_std)``, each ``[B, NB, A]``, with fresh ``K = n_quantiles_act`` fractions.

        :param obs: observations ``[B, *obs_shape]``.
        :param generator: the fractions' generator (None: torch's global one).
        :return: see :meth:`BranchingQNetwork.action_stats`.
        """
        flat = self._flat_obs(obs)
        return self.q_net.action_stats(flat, self.sample_taus(flat.shape[0], self.n_quantiles_act, generator))

    def explore(
        self, obs: PyTorchObs, n_actions: th.Tensor, eps: th.Tensor, boltzmann: th.Tensor,
        iqr_bonus: float | th.Tensor, ensemble_bonus: float, generator: th.Generator | None,
    ) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
        """Exploratory actions (:func:`~sb3_her_ext.exploration.select_actions` on :meth:`action_stats`).

        Autoregressive branches select branch by branch: branch ``b``'s statistics are conditioned on the
        sub-actions already selected, explored ones included, so an exploring direction is followed by the
        sizes and orders valued for it (one draw of the uniforms, ``NB`` passes of the network).

        :param obs: observations ``[B, *obs_shape]``.
        :param n_actions: ``[NB]`` int64 actions per branch.
        :param eps: ``[NB]`` float32 per-branch ε.
        :param boltzmann: ``[NB]`` bool Boltzmann branches.
        :param iqr_bonus: the IQR bonus weight (number or 0-dim tensor).
        :param ensemble_bonus: the ensemble-std bonus weight.
        :param generator: the generator of the quantile fractions and the uniforms.
        :return: ``(actions [B, NB] int64, iqr, ens_std)``: the statistics of the (last) pass for diagnostics.
        """
        flat = self._flat_obs(obs)
        taus = self.sample_taus(flat.shape[0], self.n_quantiles_act, generator)
        if not self.q_net.autoregressive:
            q, iqr, ens_std = self.q_net.action_stats(flat, taus)
            actions = select_actions(q, iqr, ens_std, n_actions, eps, boltzmann, iqr_bonus, ensemble_bonus,
                                     generator)
            return actions, iqr, ens_std
        shape = (flat.shape[0], self.n_branches)
        uniforms = (th.rand(shape, generator=generator, device=flat.device, dtype=th.float32),
                    th.rand(shape, generator=generator, device=flat.device, dtype=th.float32))
        actions = th.zeros(shape, dtype=th.int64, device=flat.device)
        columns = th.arange(self.n_branches, device=flat.device)
        for b in range(self.n_branches):
            q, iqr, ens_std = self.q_net.action_stats(flat, taus, actions)
            chosen = select_actions(q, iqr, ens_std, n_actions, eps, boltzmann, iqr_bonus, ensemble_bonus,
                                    generator, uniforms=uniforms)
            actions = th.where(columns == b, chosen, actions)  # branch b, given the selected a_{<b}
        return actions, iqr, ens_std

    def _get_constructor_parameters(self) -> dict[str, Any]:
        data = super()._get_constructor_parameters()
        data.update(
            dict(
                lr_schedule=self._dummy_schedule,
                n_market_features=self.n_market_features,
                bottleneck_dims=self.bottleneck_dims,
                branch_names=self.branch_names,
                net_arch=self.net_arch,
                n_ensemble=self.n_ensemble,
                n_cos=self.n_cos,
                n_quantiles=self.n_quantiles,
                n_quantiles_target=self.n_quantiles_target,
                n_quantiles_act=self.n_quantiles_act,
                n_atoms=self.n_atoms,
                v_min=self.v_min,
                v_max=self.v_max,
                activation_fn=self.activation_fn,
                popart=self.use_popart,
                popart_beta=self.popart_beta,
                optimizer_class=self.optimizer_class,
                optimizer_kwargs=self.optimizer_kwargs,
                shared_tau_embedding=self.net_args["shared_tau_embedding"],
                normalize_observations=self.net_args["normalize_observations"],
                branch_coupling=self.net_args["branch_coupling"],
            )
        )
        return data

    @property
    def observation_normalizer_pending(self) -> bool:
        """Whether the networks standardise observations but have not been fitted yet (host flag, no sync)."""
        return not self.q_net.observation_normalizer_fitted

    def fit_observation_normalizer(self, observations: th.Tensor) -> None:
        """Fit the online network's observation standardisation and copy it to the target network.

        :param observations: ``[N, D]`` observations (the replay buffer's rows when training starts).
        """
        self.q_net.fit_observation_normalizer(self._flat_obs(observations))
        self.q_net_target.set_observation_normalizer(self.q_net.obs_shift, self.q_net.obs_scale)

    def set_training_mode(self, mode: bool) -> None:
        """Put the online network in training (True) or evaluation (False) mode; the target stays in eval.

        :param mode: training mode flag.
        """
        self.q_net.train(mode)
        self.training = mode


MlpPolicy = BranchingIQNPolicy
