"""The branching distributional Q-network: IQN + C51 heads, an ensemble of IQN heads, market bottlenecks.

Data flow of :class:`BranchingQNetwork` for a batch of ``B`` observations, ``NB`` action branches,
``A = max(action_dims)`` actions per branch (shorter branches padded), ``E`` ensemble heads:

1. split the observation into market features (first ``n_market_features``) and portfolio features;
2. per branch, compress the market features: ``tanh(x_market @ W_b)`` to the branch's bottleneck width;
3. per branch, concatenate the bottleneck output with the portfolio features and run the branch's MLP;
4. IQN: embed each quantile fraction ``tau`` as ``act(Linear(cos(pi * i * tau)))``, ``i = 0..n_cos-1``
   (one embedding shared by the branches by default), multiply it into each branch's features, and map
   to ``E x A`` quantile values with the branch's output layer (the ``E`` ensemble heads);
5. C51: map the branch features to ``A x n_atoms`` logits.

All branches run together: each per-branch layer is one stacked weight ``[NB, in, out]`` applied with a
single batched matmul, so there is no Python loop over branches in ``forward``.

Branch coupling (``branch_coupling``): ``"independent"`` (BDQ) gives each branch its values averaged over
the other branches' choices. ``"autoregressive"`` (Metz et al. 2017, Q-Transformer) conditions branch ``b`` on
the sub-actions of the branches before it: the one-hot of ``a_0 .. a_{b-1}`` enters branch ``b``'s first
hidden layer (a per-branch weight ``[NB, NB * A, H1]`` masked to the earlier branches, zero at
initialisation, so an untrained network starts as the independent one). Given actions (training: the taken
ones) the pass is teacher-forced; without them the network decodes greedily, branch by branch (``NB``
passes of the branch MLPs: a loop over the few branches, not over rows), and every output of branch ``b``
is then conditioned on the greedy ``a_0 .. a_{b-1}``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch as th
from torch import nn

import cuda_ext
from sb3_her_ext.fused_iqn_head import TakenQuantileHead, block_samples, blocked_mean_tau_embedding
from sb3_her_ext.popart import PopArt
from sb3_her_ext.validation import check_positive

#: The ways the action branches can be coupled (see the module docstring).
BRANCH_COUPLINGS = ("independent", "autoregressive")


def quantile_iqr(samples: th.Tensor) -> th.Tensor:
    """Inter-quartile range over the last dim via ``cuda_ext.quantile_iqr``.

    Not differentiable (an exploration statistic): the samples are detached.

    :param samples: ``[..., N]`` values.
    :return: ``[...]`` ``Q(0.75) - Q(0.25)``.
    """
    samples = samples.detach()
    return cuda_ext.quantile_iqr(samples.float().contiguous()).to(samples.dtype)


def _taken_logits(logits: th.Tensor, actions: th.Tensor, by_mask: bool) -> th.Tensor:
    """The C51 logits of each branch's taken action, ``[B, NB, atoms]`` from ``[B, NB, A, atoms]``.

    Both ways give the same values and gradients bit for bit. ``by_mask`` (the GPU path): a mask and a sum
    over ``A`` (each value plus zeros), whose backward is a mask; a gather's backward is a scatter-add, which
    on CUDA under ``torch.use_deterministic_algorithms`` (a seeded model) runs as a sort-based index_put of
    dozens of launches. On the CPU the gather is the faster (see benchmarks/RESULTS.md) and its scatter-add is
    sequential.

    :param logits: ``[B, NB, A, atoms]``.
    :param actions: ``[B, NB]`` int64.
    :param by_mask: select by a mask and a sum instead of a gather.
    :return: ``[B, NB, atoms]``.
    """
    if by_mask:
        columns = th.arange(logits.shape[2], device=logits.device)
        taken = (actions.unsqueeze(-1) == columns).unsqueeze(-1)  # [B, NB, A, 1]
        return th.where(taken, logits, 0.0).sum(dim=2)
    index = actions[:, :, None, None].expand(-1, -1, 1, logits.shape[-1])
    return logits.gather(2, index).squeeze(2)


class BranchLinear(nn.Module):
    """``NB`` independent linear layers applied in one batched matmul.

    :param n_branches: number of branches ``NB``.
    :param in_features: input width of every branch.
    :param out_features: output width of every branch.
    """

    def __init__(self, n_branches: int, in_features: int, out_features: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(th.empty(n_branches, in_features, out_features))
        self.bias = nn.Parameter(th.empty(n_branches, out_features))
        bound = 1.0 / math.sqrt(in_features)  # nn.Linear's default initialisation, per branch
        nn.init.uniform_(self.weight, -bound, bound)
        nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: th.Tensor) -> th.Tensor:
        """:param x: ``[NB, ..., in]``.
        :return: ``[NB, ..., out]``.
        """
        lead = x.shape[:-1]
        flat = x.reshape(x.shape[0], -1, x.shape[-1])
        out = th.baddbmm(self.bias.unsqueeze(1), flat, self.weight)
        # a 3-D input's output is returned as is, not as a view: an in-place op on it (the branch MLP's ReLU)
        # then needs no view bookkeeping in autograd
        return out if x.dim() == 3 else out.view(*lead, self.weight.shape[-1])


def _check_network_arguments(
    obs_dim: int,
    n_market_features: int,
    action_dims: Sequence[int],
    bottleneck_dims: Sequence[int],
    net_arch: Sequence[int],
    n_ensemble: int,
    n_cos: int,
    n_atoms: int,
    branch_coupling: str,
) -> None:
    """Raise a ValueError naming the first of :class:`BranchingQNetwork`'s arguments that is out of range."""
    if branch_coupling not in BRANCH_COUPLINGS:
        raise ValueError(f"branch_coupling={branch_coupling!r} must be one of {BRANCH_COUPLINGS}")
    for name, value in (
        ("obs_dim", obs_dim),
        ("n_market_features", n_market_features),
        ("n_ensemble", n_ensemble),
        ("n_cos", n_cos),
        ("n_atoms", n_atoms),
    ):
        check_positive(name, value)
    if n_market_features > obs_dim:
        raise ValueError(f"n_market_features={n_market_features} must be <= obs_dim={obs_dim}")
    if len(action_dims) == 0:
        raise ValueError(f"action_dims={list(action_dims)} must name at least one branch")
    for b, n in enumerate(action_dims):
        check_positive(f"action_dims[{b}]", n)
    if len(bottleneck_dims) != len(action_dims):
        raise ValueError(
            f"bottleneck_dims={list(bottleneck_dims)} must have one width per branch ({len(action_dims)})"
        )
    for b, w in enumerate(bottleneck_dims):
        check_positive(f"bottleneck_dims[{b}]", w)
    if len(net_arch) == 0:
        raise ValueError(f"net_arch={list(net_arch)} must have at least one hidden layer")
    for i, h in enumerate(net_arch):
        check_positive(f"net_arch[{i}]", h)


class BranchingQNetwork(nn.Module):
    """Branching IQN/C51 network with an ensemble of IQN output heads and per-branch market bottlenecks.

    :param obs_dim: observation size ``D`` (flat).
    :param n_market_features: how many leading observation features are market features (1..D); the rest
        are portfolio features, passed to every branch uncompressed.
    :param action_dims: number of actions of each branch.
    :param bottleneck_dims: bottleneck width of each branch.
    :param net_arch: hidden layer sizes of each branch's MLP (at least one layer).
    :param n_ensemble: number ``E`` of IQN output heads per branch.
    :param n_cos: size of the cosine embedding of ``tau``.
    :param n_atoms: number of C51 atoms.
    :param activation_fn: activation after every hidden layer and after the ``tau`` embedding.
    :param shared_tau_embedding: one ``tau`` embedding ``Linear(n_cos, H)`` shared by all branches (each
        branch still multiplies it into its own features and has its own output layer); False gives every
        branch its own embedding (4x the cost of the largest matmul for 4 branches).
    :param normalize_observations: standardise each observation feature, ``(x - mean) / std``, with
        statistics fitted once by :meth:`fit_observation_normalizer` (identity until then). Raw features of
        very different scales (prices in ticks, log sizes, an imbalance in [-1, 1]) otherwise saturate the
        ``tanh`` bottleneck and drown the small ones.
    :param branch_coupling: ``"independent"`` (BDQ branches) or ``"autoregressive"`` (each branch
        conditioned on the earlier branches' sub-actions; see the module docstring).
    """

    def __init__(
        self,
        obs_dim: int,
        n_market_features: int,
        action_dims: Sequence[int],
        bottleneck_dims: Sequence[int],
        net_arch: Sequence[int] = (256, 256),
        n_ensemble: int = 5,
        n_cos: int = 64,
        n_atoms: int = 51,
        activation_fn: type[nn.Module] = nn.ReLU,
        shared_tau_embedding: bool = True,
        normalize_observations: bool = False,
        branch_coupling: str = "independent",
    ) -> None:
        super().__init__()
        _check_network_arguments(
            obs_dim, n_market_features, action_dims, bottleneck_dims, net_arch, n_ensemble, n_cos, n_atoms,
            branch_coupling,
        )
        self.obs_dim = int(obs_dim)
        self.n_market_features = int(n_market_features)
        self.action_dims = [int(n) for n in action_dims]
        self.bottleneck_dims = [int(w) for w in bottleneck_dims]
        self.net_arch = [int(h) for h in net_arch]
        self.n_branches = len(self.action_dims)
        self.max_actions = max(self.action_dims)
        self.n_ensemble = int(n_ensemble)
        self.n_cos = int(n_cos)
        self.n_atoms = int(n_atoms)
        self.activation = activation_fn()
        self._build_layers(bool(shared_tau_embedding))
        self._build_masks()
        self.popart: PopArt | None = None
        self.normalize_observations = bool(normalize_observations)
        if self.normalize_observations:
            self.register_buffer("obs_shift", th.zeros(self.obs_dim))
            self.register_buffer("obs_scale", th.ones(self.obs_dim))
            self.register_buffer("obs_normalizer_fitted", th.zeros((), dtype=th.bool))
        #: host copy of ``obs_normalizer_fitted`` (read without a device sync)
        self.observation_normalizer_fitted = not self.normalize_observations
        self.branch_coupling = branch_coupling
        #: whether branch ``b`` sees the sub-actions of branches ``< b`` (created last: the independent
        #: network's parameters are initialised exactly as before)
        self.autoregressive = branch_coupling == "autoregressive"
        if self.autoregressive:
            self._build_prefix()

    def _build_layers(self, shared_tau_embedding: bool) -> None:
        """The parameters, in the order they are initialised: the branches' bottlenecks, hidden layers, the
        ``tau`` embedding (one for all branches when ``shared_tau_embedding``) and the IQN and C51 output
        layers."""
        n_branches, n_actions = self.n_branches, self.max_actions
        max_bottleneck = max(self.bottleneck_dims)
        n_portfolio = self.obs_dim - self.n_market_features
        # Bottleneck: branch b uses the first bottleneck_dims[b] of max_bottleneck columns; the mask zeroes
        # the rest (they output tanh(0) = 0, so they carry neither signal nor gradient).
        self.bottleneck_weight = nn.Parameter(th.empty(n_branches, self.n_market_features, max_bottleneck))
        bound = 1.0 / math.sqrt(self.n_market_features)  # nn.Linear's default initialisation
        nn.init.uniform_(self.bottleneck_weight, -bound, bound)
        columns = th.arange(max_bottleneck)
        self.register_buffer(
            "bottleneck_mask",
            (columns < th.tensor(self.bottleneck_dims)[:, None]).float().unsqueeze(1),
            persistent=False,
        )
        self.uneven_bottlenecks = min(self.bottleneck_dims) < max_bottleneck
        widths = [max_bottleneck + n_portfolio, *self.net_arch]
        self.hidden = nn.ModuleList(
            BranchLinear(n_branches, i, o) for i, o in zip(widths[:-1], widths[1:], strict=True)
        )
        hidden_dim = self.net_arch[-1]
        # One matmul embeds tau for all branches: [n_cos] -> [NB * hidden_dim].
        self.shared_tau_embedding = shared_tau_embedding
        tau_width = hidden_dim if self.shared_tau_embedding else n_branches * hidden_dim
        self.tau_embedding = nn.Linear(self.n_cos, tau_width)
        self.register_buffer(
            "cos_frequencies", th.arange(self.n_cos, dtype=th.float32) * math.pi, persistent=False
        )
        self.iqn_out = BranchLinear(n_branches, hidden_dim, self.n_ensemble * n_actions)
        self.c51_out = BranchLinear(n_branches, hidden_dim, n_actions * self.n_atoms)

    def _build_masks(self) -> None:
        """The masks of padded actions (branches with fewer actions than the widest)."""
        n_branches, n_actions = self.n_branches, self.max_actions
        self.register_buffer(
            "action_mask",
            th.arange(n_actions)[None, :] < th.tensor(self.action_dims)[:, None],
            persistent=False,
        )  # [NB, A] bool, True for real actions
        self.padded_actions = min(self.action_dims) < n_actions  # masking is skipped when False
        iqn_output_mask = self.action_mask[:, None, :].expand(n_branches, self.n_ensemble, n_actions)
        self.register_buffer(
            "iqn_output_mask", iqn_output_mask.reshape(n_branches, 1, -1).float(), persistent=False
        )  # [NB, 1, E * A], matching iqn_out's (ensemble, action) output layout

    def _build_prefix(self) -> None:
        """The autoregressive coupling's weights of the earlier branches' sub-actions and their masks."""
        n_branches, n_actions = self.n_branches, self.max_actions
        n_codes = n_branches * n_actions
        self.prefix_weight = nn.Parameter(th.zeros(n_branches, n_codes, self.net_arch[0]))
        code_branch = th.arange(n_codes) // n_actions
        code_action = th.arange(n_codes) % n_actions
        real = code_action < th.tensor(self.action_dims)[code_branch]
        earlier = code_branch[None, :] < th.arange(n_branches)[:, None]  # [NB, NB * A]
        self.register_buffer("prefix_mask", (earlier & real[None, :]).float().unsqueeze(-1),
                             persistent=False)  # [NB, NB * A, 1]
        self.register_buffer("prefix_offsets", th.arange(n_branches) * n_actions, persistent=False)
        self.register_buffer("prefix_codes", th.arange(n_codes), persistent=False)

    def fit_observation_normalizer(self, observations: th.Tensor, min_std: float = 1e-6) -> None:
        """Fit the input standardisation to ``observations`` (mean and standard deviation per feature).

        A feature whose standard deviation is below ``min_std`` (constant in the data) is only shifted.

        :param observations: ``[N, D]`` observations, ``N >= 2``.
        :param min_std: smallest standard deviation that is divided by.
        """
        if not self.normalize_observations:
            raise ValueError("normalize_observations=False: this network has no observation normalizer")
        if observations.dim() != 2 or observations.shape[1] != self.obs_dim or observations.shape[0] < 2:
            shape = tuple(observations.shape)
            raise ValueError(f"observations.shape={shape} must be [N >= 2, {self.obs_dim}]")
        data = observations.detach().to(device=self.obs_shift.device, dtype=th.float64)
        mean, std = data.mean(dim=0), data.std(dim=0, unbiased=False)
        self.set_observation_normalizer(mean, th.where(std > min_std, 1.0 / std, th.ones_like(std)))

    def set_observation_normalizer(self, shift: th.Tensor, scale: th.Tensor) -> None:
        """Set the standardisation ``(x - shift) * scale`` (in place: CUDA graphs that read it stay valid).

        :param shift: ``[D]``.
        :param scale: ``[D]``.
        """
        with th.no_grad():
            self.obs_shift.copy_(shift)
            self.obs_scale.copy_(scale)
            self.obs_normalizer_fitted.fill_(True)
        self.observation_normalizer_fitted = True

    def _load_from_state_dict(
        self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any
    ) -> None:
        if self.normalize_observations and prefix + "obs_shift" not in state_dict:
            # a network saved before the normalizer existed: keep it as it was trained (identity, fitted)
            state_dict[prefix + "obs_shift"] = th.zeros(self.obs_dim)
            state_dict[prefix + "obs_scale"] = th.ones(self.obs_dim)
            state_dict[prefix + "obs_normalizer_fitted"] = th.ones((), dtype=th.bool)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        if self.normalize_observations:
            self.observation_normalizer_fitted = bool(self.obs_normalizer_fitted)

    def attach_popart(self, popart: PopArt | None) -> None:
        """Use ``popart`` to de-normalise ``action_stats`` (kept as a plain reference, not a submodule).

        :param popart: the policy's PopArt, or None.
        """
        object.__setattr__(self, "popart", popart)

    def branch_features(self, obs: th.Tensor, prefix_actions: th.Tensor | None = None) -> th.Tensor:
        """Per-branch features after bottleneck and MLP.

        :param obs: ``[B, D]`` observations.
        :param prefix_actions: autoregressive coupling: ``[B, NB]`` int64 sub-actions, branch ``b``
            conditioned on columns ``< b`` (required then; :meth:`decode` finds the greedy ones); ignored
            otherwise.
        :return: ``[NB, B, H]`` with ``H = net_arch[-1]``.
        """
        return self._branch_mlp(self._trunk_input(obs), prefix_actions)

    def _trunk_input(self, obs: th.Tensor) -> th.Tensor:
        """The branch MLPs' input: ``[NB, B, W + P]`` (bottleneck outputs and the portfolio features)."""
        if obs.dim() != 2 or obs.shape[1] != self.obs_dim:
            raise ValueError(f"obs.shape={tuple(obs.shape)} must be [B, {self.obs_dim}]")
        if self.normalize_observations:
            obs = (obs - self.obs_shift) * self.obs_scale
        market = obs[:, : self.n_market_features]
        portfolio = obs[:, self.n_market_features :]
        x = self.bottleneck(market)  # [NB, B, W]
        if portfolio.shape[1] > 0:
            x = th.cat([x, portfolio.unsqueeze(0).expand(self.n_branches, -1, -1)], dim=-1)
        return x

    def _branch_mlp(self, x: th.Tensor, prefix_actions: th.Tensor | None) -> th.Tensor:
        """The branch MLPs on their input ``x`` (``[NB, B, W + P]``), with the sub-action prefix."""
        if self.autoregressive:
            if prefix_actions is None:
                raise ValueError("branch_coupling='autoregressive' needs the prefix actions [B, NB]")
            if prefix_actions.shape != (x.shape[1], self.n_branches):
                raise ValueError(f"prefix_actions.shape={tuple(prefix_actions.shape)} must be "
                                 f"[B={x.shape[1]}, NB={self.n_branches}]")
        relu = isinstance(self.activation, nn.ReLU)
        for i, layer in enumerate(self.hidden):
            x = layer(x)
            if i == 0 and self.autoregressive:
                x = x + self._prefix_term(prefix_actions)
            # ReLU in place on the layer's fresh output (the product's backward does not need it): no second
            # [NB, B, H] buffer
            x = x.relu_() if relu else self.activation(x)
        return x

    def _prefix_term(self, actions: th.Tensor) -> th.Tensor:
        """Each branch's first-layer contribution of the earlier branches' sub-actions, ``[NB, B, H1]``."""
        rows = actions.long() + self.prefix_offsets  # [B, NB]: each sub-action's code
        one_hot = (rows.unsqueeze(-1) == self.prefix_codes).to(self.prefix_weight.dtype).sum(dim=1)
        return th.matmul(one_hot, self.prefix_weight * self.prefix_mask)  # [B, C] @ [NB, C, H1]

    def decode(self, obs: th.Tensor, taus: th.Tensor) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
        """Greedy decoding branch by branch: ``a_b`` maximises branch ``b``'s mean value given ``a_{<b}``.

        Independent branches need one pass (each branch's argmax); autoregressive ones ``NB`` passes of the
        branch MLPs (the trunk's bottleneck once), the last of which conditions every branch on its final
        prefix.

        :param obs: ``[B, D]`` observations.
        :param taus: ``[B, N]`` quantile fractions of the mean values.
        :return: ``(features [NB, B, H], actions [B, NB] int64, values [B, NB, A])``: the features and
            normalised mean values of every branch given the greedy prefix (padded actions ``-inf``).
        """
        x = self._trunk_input(obs)
        batch = x.shape[1]
        embedding = self._mean_tau_embedding(taus, batch)
        actions = th.zeros(batch, self.n_branches, dtype=th.int64, device=obs.device)
        columns = th.arange(self.n_branches, device=obs.device)
        passes = self.n_branches if self.autoregressive else 1
        for b in range(passes):
            features = self._branch_mlp(x, actions if self.autoregressive else None)
            values = self._mean_values_from(features, embedding)
            if self.padded_actions:
                values = values.masked_fill(~self.action_mask, -math.inf)
            greedy = values.argmax(dim=-1)  # [B, NB]
            if not self.autoregressive:
                return features, greedy, values
            actions = th.where(columns == b, greedy, actions)  # branch b's choice, given a_{<b}
        return features, actions, values

    def _features(self, obs: th.Tensor, taus: th.Tensor, prefix_actions: th.Tensor | None) -> th.Tensor:
        """Branch features: teacher-forced on ``prefix_actions`` when given, greedily decoded when not
        (autoregressive coupling); the plain features for independent branches."""
        if not self.autoregressive:
            return self.branch_features(obs)
        if prefix_actions is not None:
            return self.branch_features(obs, prefix_actions)
        return self.decode(obs, taus)[0]

    def bottleneck(self, market: th.Tensor) -> th.Tensor:
        """Per-branch ``tanh(x_market @ W_b)``, zero-padded to the widest branch.

        :param market: ``[B, n_market_features]``.
        :return: ``[NB, B, max(bottleneck_dims)]``; columns ``>= bottleneck_dims[b]`` of branch ``b`` are 0.
        """
        weight = self.bottleneck_weight  # [NB, n_market_features, W]
        if self.uneven_bottlenecks:
            weight = weight * self.bottleneck_mask
        n_branches, n_market, width = weight.shape
        # one [B, n_market] @ [n_market, NB * W] product (a broadcast matmul would copy market NB times)
        columns = weight.transpose(0, 1).reshape(n_market, n_branches * width)
        return th.tanh(th.mm(market, columns).view(-1, n_branches, width).transpose(0, 1))

    def _iqn_from_features(self, features: th.Tensor, taus: th.Tensor) -> th.Tensor:
        """:param features: ``[NB, B, H]``.
        :param taus: ``[B, N]``.
        :return: ``[E, B, NB, A, N]`` normalised quantile values, padded actions 0.
        """
        if taus.dim() != 2 or taus.shape[0] != features.shape[1]:
            raise ValueError(f"taus.shape={tuple(taus.shape)} must be [B={features.shape[1]}, N]")
        batch, n_taus = taus.shape
        n_branches, hidden_dim = self.n_branches, features.shape[-1]
        cosines = th.cos(taus.unsqueeze(-1) * self.cos_frequencies)  # [B, N, n_cos]
        embedding = self.activation(self.tau_embedding(cosines))  # [B, N, H] shared, or [B, N, NB * H]
        # Padded actions get zero weight and bias, so their outputs are exactly 0.
        weight, bias = self.iqn_out.weight, self.iqn_out.bias  # [NB, H, E * A], [NB, E * A]
        if self.padded_actions:
            weight, bias = weight * self.iqn_output_mask, bias * self.iqn_output_mask[:, 0]
        # Fold the branch features into the output weights, folded[b, h, nb, o] = features[nb, b, h] *
        # weight[nb, h, o], so the [B, N, NB, H] product of features and embedding is never materialised.
        features_bhn = features.permute(1, 2, 0).unsqueeze(-1)  # [B, H, NB, 1]
        weight_hnb = weight.permute(1, 0, 2)  # [H, NB, E * A]
        if th.is_grad_enabled() and (features.requires_grad or weight.requires_grad):
            folded = features_bhn.contiguous() * weight_hnb.contiguous()  # [B, H, NB, E * A], contiguous
        else:  # acting: the same products written straight into a contiguous tensor (no factor copies)
            folded = features.new_empty(batch, hidden_dim, n_branches, weight.shape[-1])
            th.mul(features_bhn, weight_hnb, out=folded)
        if self.shared_tau_embedding:
            out = th.baddbmm(bias.view(1, 1, -1), embedding, folded.view(batch, hidden_dim, -1))
        else:
            per_branch = embedding.view(batch, n_taus, n_branches, hidden_dim).transpose(1, 2)
            out = th.matmul(per_branch, folded.permute(0, 2, 1, 3))  # [B, NB, N, E * A]
            out = (out + bias[None, :, None, :]).transpose(1, 2)
        out = out.reshape(batch, n_taus, n_branches, self.n_ensemble, self.max_actions)
        return out.permute(3, 0, 2, 4, 1)  # [E, B, NB, A, N]

    def quantiles(self, obs: th.Tensor, taus: th.Tensor,
                  prefix_actions: th.Tensor | None = None) -> th.Tensor:
        """IQN quantile values of every ensemble head, branch and action.

        :param obs: ``[B, D]`` observations.
        :param taus: ``[B, N]`` quantile fractions in [0, 1].
        :param prefix_actions: autoregressive coupling: the sub-actions each branch is conditioned on
            (None: the greedy ones, decoded at ``taus``); ignored for independent branches.
        :return: ``[E, B, NB, A, N]`` in the PopArt-normalised space; padded actions are 0.
        """
        return self._iqn_from_features(self._features(obs, taus, prefix_actions), taus)

    def c51_logits(self, obs: th.Tensor, prefix_actions: th.Tensor | None = None) -> th.Tensor:
        """C51 logits of every branch and action.

        :param obs: ``[B, D]`` observations.
        :param prefix_actions: autoregressive coupling: ``[B, NB]`` sub-actions each branch is conditioned on
            (required then).
        :return: ``[B, NB, A, n_atoms]``; padded actions are all-zero logits.
        """
        features = self.branch_features(obs, prefix_actions)
        return self._c51_from_features(features)

    def _c51_from_features(self, features: th.Tensor) -> th.Tensor:
        batch = features.shape[1]
        logits = self.c51_out(features).view(self.n_branches, batch, self.max_actions, self.n_atoms)
        if self.padded_actions:
            logits = logits * self.action_mask[:, None, :, None]
        return logits.transpose(0, 1)

    def quantiles_and_logits(self, obs: th.Tensor, taus: th.Tensor,
                             prefix_actions: th.Tensor | None = None) -> tuple[th.Tensor, th.Tensor]:
        """Both heads from one pass through the shared branch trunk (cheaper than two calls).

        :param obs: ``[B, D]`` observations.
        :param taus: ``[B, N]`` quantile fractions.
        :param prefix_actions: as in :meth:`quantiles`.
        :return: ``(quantiles [E, B, NB, A, N], c51_logits [B, NB, A, n_atoms])``.
        """
        features = self._features(obs, taus, prefix_actions)
        return self._iqn_from_features(features, taus), self._c51_from_features(features)

    def _iqn_output_layer(self) -> tuple[th.Tensor, th.Tensor]:
        """IQN output weight ``[NB, H, E, A]`` and bias ``[NB, E, A]``, zero for padded actions."""
        weight, bias = self.iqn_out.weight, self.iqn_out.bias
        if self.padded_actions:
            weight, bias = weight * self.iqn_output_mask, bias * self.iqn_output_mask[:, 0]
        n_branches, hidden_dim = weight.shape[:2]
        shape = (n_branches, self.n_ensemble, self.max_actions)
        return weight.view(n_branches, hidden_dim, *shape[1:]), bias.view(shape)

    def _tau_embedding_weight(self) -> th.Tensor:
        """The tau embedding's ``[width, n_cos]`` weight with its bias on the first column.

        ``cosines[..., 0] = cos(0) = 1``, so the bias rides on the first weight column: one matrix product and
        no broadcast copy of the bias into the ``[B * N, H]`` output (same value and gradients as the Linear).
        """
        weight, bias = self.tau_embedding.weight, self.tau_embedding.bias
        return th.cat([weight[:, :1] + bias.unsqueeze(1), weight[:, 1:]], dim=1)

    def _tau_embedding(self, taus: th.Tensor, batch: int, weight: th.Tensor | None = None) -> th.Tensor:
        """:param taus: ``[B, N]``.
        :param batch: ``B`` (checked).
        :param weight: :meth:`_tau_embedding_weight` when the caller has it already (None: formed here).
        :return: ``[B, N, G, H]``, ``G = 1`` with a shared embedding, else ``NB``.
        """
        if taus.dim() != 2 or taus.shape[0] != batch:
            raise ValueError(f"taus.shape={tuple(taus.shape)} must be [B={batch}, N]")
        cosines = th.cos(taus.unsqueeze(-1) * self.cos_frequencies)  # [B, N, n_cos]
        weight = self._tau_embedding_weight() if weight is None else weight
        embedding = th.matmul(cosines, weight.t())
        if isinstance(self.activation, nn.ReLU):
            # in place: one large [B * N, H] buffer less (the product's backward does not need its output;
            # relu's needs only its own)
            embedding = embedding.relu_()
        else:
            embedding = self.activation(embedding)
        return embedding.view(batch, taus.shape[1], -1, self.net_arch[-1])

    def taken_quantiles_and_logits(
        self, obs: th.Tensor, taus: th.Tensor, actions: th.Tensor, prefix_actions: th.Tensor | None = None
    ) -> tuple[th.Tensor, th.Tensor]:
        """Quantiles and C51 logits of one action per branch (the training step's pass).

        The same values as gathering ``actions`` from :meth:`quantiles_and_logits`, but the IQN output
        layer is applied to the chosen actions' weight columns only (``A`` times fewer output products).

        :param obs: ``[B, D]`` observations.
        :param taus: ``[B, N]`` quantile fractions.
        :param actions: ``[B, NB]`` int64 action of each branch.
        :param prefix_actions: autoregressive coupling: the sub-actions each branch is conditioned on (None:
            ``actions`` themselves, teacher forcing); ignored for independent branches.
        :return: ``(quantiles [E, B, NB, N], c51_logits [B, NB, n_atoms])``.
        """
        features = self.branch_features(obs, actions if prefix_actions is None else prefix_actions)
        batch, n_taus = taus.shape[0], taus.shape[-1]
        if taus.dim() != 2 or taus.shape[0] != features.shape[1]:
            raise ValueError(f"taus.shape={tuple(taus.shape)} must be [B={features.shape[1]}, N]")
        if actions.shape != (batch, self.n_branches):
            raise ValueError(
                f"actions.shape={tuple(actions.shape)} must be [B={batch}, NB={self.n_branches}]"
            )
        weight, bias = self._iqn_output_layer()  # [NB, H, E, A], [NB, E, A]
        n_branches, hidden_dim, n_ensemble, n_actions = weight.shape
        # Each sample's taken action rows, in [B, NB] order with H innermost: gathered by index in the forward
        # pass, their weight gradient a product with the block one-hot [B * NB, NB * A] (dense, no scatter).
        columns = th.arange(n_branches * n_actions, device=actions.device)
        offsets = columns[:n_branches] * n_actions  # first column of each branch's block
        rows = actions + offsets  # [B, NB]: each taken action's row of weight_rows
        selector = (rows.unsqueeze(-1) == columns).to(weight.dtype)  # no host sync
        selector = selector.view(batch * n_branches, n_branches * n_actions)
        weight_rows = weight.permute(0, 3, 2, 1).reshape(n_branches * n_actions, n_ensemble * hidden_dim)
        bias_rows = bias.transpose(1, 2).reshape(n_branches * n_actions, n_ensemble)
        taken_bias = th.mm(selector, bias_rows).view(batch, n_branches * n_ensemble)
        features_bt = features.transpose(0, 1).unsqueeze(2)  # [B, NB, 1, H]
        if self.shared_tau_embedding and isinstance(self.activation, nn.ReLU):
            # one [NB * E, H] @ [H, N] product per sample, the branch features folded into the taken weights
            tau_weight = self._tau_embedding_weight()
            block = block_samples(taus)
            out = TakenQuantileHead.apply(
                taus, self.cos_frequencies, tau_weight, features_bt, selector, rows.view(-1), weight_rows,
                taken_bias, block,
            )
            quantiles = out.view(batch, n_branches, n_ensemble, n_taus).permute(2, 0, 1, 3)  # [E, B, NB, N]
        else:
            embedding = self._tau_embedding(taus, batch)  # [B, N, G, H]
            taken_weight = th.mm(selector, weight_rows).view(batch, n_branches, n_ensemble, hidden_dim)
            # fold the branch features into the taken weights (H stays the contiguous inner dim)
            folded = taken_weight * features_bt  # [B, NB, E, H]
            if embedding.shape[2] == 1:  # shared: one [N, H] @ [H, NB * E] product per sample
                out = th.baddbmm(
                    taken_bias.unsqueeze(1),
                    embedding.squeeze(2),
                    folded.view(batch, n_branches * n_ensemble, hidden_dim).transpose(1, 2),
                )
                quantiles = out.view(batch, n_taus, n_branches, n_ensemble).permute(3, 0, 2, 1)
            else:  # one [N, H] @ [H, E] product per sample and branch
                out = th.matmul(embedding.transpose(1, 2), folded.transpose(2, 3))  # [B, NB, N, E]
                out = out + taken_bias.view(batch, n_branches, 1, n_ensemble)
                quantiles = out.permute(3, 0, 1, 2)  # [E, B, NB, N]
        logits = self._c51_from_features(features)  # [B, NB, A, atoms]
        return quantiles, _taken_logits(logits, actions, by_mask=logits.device.type != "cpu")

    def _mean_tau_embedding(self, taus: th.Tensor, batch: int) -> th.Tensor:
        """The tau embedding's mean over the fractions: ``_tau_embedding(taus, batch).mean(dim=1)``.

        On the CPU without autograd (the target's action choice) through
        :func:`~sb3_her_ext.fused_iqn_head.blocked_mean_tau_embedding`, which never forms the ``[B, N, H]``
        embedding (the same values).

        :param taus: ``[B, N]``.
        :param batch: ``B`` (checked).
        :return: ``[B, G, H]``, ``G = 1`` with a shared embedding, else ``NB``.
        """
        weight = self._tau_embedding_weight()
        blocked = taus.device.type == "cpu" and isinstance(self.activation, nn.ReLU)
        if not blocked or (th.is_grad_enabled() and (weight.requires_grad or taus.requires_grad)):
            return self._tau_embedding(taus, batch, weight).mean(dim=1)
        if taus.dim() != 2 or taus.shape[0] != batch:
            raise ValueError(f"taus.shape={tuple(taus.shape)} must be [B={batch}, N]")
        return blocked_mean_tau_embedding(taus, self.cos_frequencies, weight, self.net_arch[-1])

    def mean_values(self, obs: th.Tensor, taus: th.Tensor,
                    prefix_actions: th.Tensor | None = None) -> th.Tensor:
        """Ensemble-mean quantile-mean of every branch and action (for greedy choices).

        Equals ``quantiles(obs, taus).mean(dim=(0, -1))`` up to rounding: the output layer is linear, so
        the mean over ``taus`` is taken of the ``tau`` embedding, before it, and the ``[.., N]`` quantiles
        are never formed.

        :param obs: ``[B, D]`` observations.
        :param taus: ``[B, N]`` quantile fractions.
        :param prefix_actions: as in :meth:`quantiles` (None with autoregressive coupling: greedy decoding,
            whose branch-by-branch argmax of these values is the greedy joint action).
        :return: ``[B, NB, A]`` in the normalised space; padded actions are 0.
        """
        if self.autoregressive and prefix_actions is None:
            values = self.decode(obs, taus)[2]  # the last pass's values: every branch given its final prefix
            return values.masked_fill(~self.action_mask, 0.0) if self.padded_actions else values
        features = self.branch_features(obs, prefix_actions)  # [NB, B, H]
        return self._mean_values_from(features, self._mean_tau_embedding(taus, features.shape[1]))

    def _mean_values_from(self, features: th.Tensor, embedding: th.Tensor) -> th.Tensor:
        """:param features: ``[NB, B, H]``.
        :param embedding: ``[B, G, H]`` mean tau embedding (:meth:`_mean_tau_embedding`).
        :return: ``[B, NB, A]`` normalised mean values; padded actions are 0.
        """
        weight, bias = self._iqn_output_layer()  # [NB, H, E, A], [NB, E, A]
        n_branches, hidden_dim = weight.shape[:2]
        mixed = embedding.permute(1, 0, 2) * features  # [NB, B, H]
        out = th.baddbmm(bias.view(n_branches, 1, -1), mixed, weight.view(n_branches, hidden_dim, -1))
        out = out.view(n_branches, -1, self.n_ensemble, self.max_actions).mean(dim=2)  # [NB, B, A]
        return out.transpose(0, 1)

    def action_stats(self, obs: th.Tensor, taus: th.Tensor, prefix_actions: th.Tensor | None = None) -> (
        tuple[th.Tensor, th.Tensor, th.Tensor]
    ):
        """Action values and uncertainty statistics for action selection.

        With autoregressive coupling every branch's statistics are conditioned on ``prefix_actions`` (None:
        the greedy sub-actions of the branches before it, decoded at ``taus``, so the per-branch argmax of
        ``q`` is the greedy joint action).

        :param obs: ``[B, D]`` observations.
        :param taus: ``[B, K]`` quantile fractions.
        :param prefix_actions: as in :meth:`quantiles`.
        :return: ``(q, iqr, ens_std)``, each ``[B, NB, A]``: ``q`` the ensemble mean of the quantile mean,
            ``iqr`` the inter-quartile range of the ensemble-mean quantiles, ``ens_std`` the (population) std
            over the ensemble of the per-head means; all de-normalised when a PopArt is attached (the spreads
            scaled by ``sigma``). Padded actions: ``q = -inf``, ``iqr = ens_std = 0``.
        """
        values = self.quantiles(obs, taus, prefix_actions)  # [E, B, NB, A, K]
        head_means = values.mean(dim=-1)  # [E, B, NB, A]
        q = head_means.mean(dim=0)
        iqr = quantile_iqr(values.mean(dim=0))
        ens_std = head_means.std(dim=0, correction=0)
        if self.popart is not None:
            q = self.popart.denormalize(q)
            iqr = iqr * self.popart.sigma
            ens_std = ens_std * self.popart.sigma
        if not self.padded_actions:  # every action exists: the masks would change nothing
            return q, iqr, ens_std
        invalid = ~self.action_mask.unsqueeze(0)
        q = q.masked_fill(invalid, -math.inf)
        return q, iqr.masked_fill(invalid, 0.0), ens_std.masked_fill(invalid, 0.0)

