"""Branching distributional Q-network (IQN + C51 heads, ensemble, market bottlenecks) and its SB3 policy.

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
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.policies import BasePolicy
from stable_baselines3.common.torch_layers import FlattenExtractor
from stable_baselines3.common.type_aliases import PyTorchObs, Schedule
from torch import nn

import cuda_ext  # noqa: F401  (defines torch.ops.cuda_ext.*)
from sb3_her_ext.popart import PopArt

#: Branch names and default bottleneck widths of the 4-branch trading action space (DESIGN.md).
TRADING_BRANCH_NAMES: tuple[str, ...] = ("direction", "magnitude", "order", "urgency")
TRADING_BOTTLENECK_DIMS: tuple[int, ...] = (4, 8, 6, 4)
#: Bottleneck width of every branch for any other number of branches.
DEFAULT_BOTTLENECK_DIM = 8
#: Per-branch MLP of the policy when ``net_arch`` is None: small enough for a fast CPU gradient step.
DEFAULT_NET_ARCH: tuple[int, ...] = (128, 128)
#: On the CPU the taken-action pass (:class:`_TakenQuantileHead`) runs the tau embedding and the IQN output
#: layer in blocks of samples holding this many (sample, tau) rows: a block's ``[rows, H]`` embedding (1 MiB
#: at ``H = 256``) and its gradient stay in the core's cache instead of making round trips through memory
#: (one thread: 1024 rows about 1.3x faster than one block). The GPU path runs the whole batch as one block.
CPU_EMBEDDING_ROWS_PER_BLOCK = 1024


def _local_quantile_iqr(samples: th.Tensor) -> th.Tensor:
    """``Q(0.75) - Q(0.25)`` over the last dim, linearly interpolated like ``torch.quantile``, no size limit.

    :param samples: ``[..., N]`` values.
    :return: ``[...]`` inter-quartile ranges.
    """
    ordered = samples.sort(dim=-1).values
    n = samples.shape[-1]

    def quantile(q: float) -> th.Tensor:
        position = q * (n - 1)
        low = math.floor(position)
        high = min(low + 1, n - 1)
        frac = position - low
        return ordered[..., low] + (ordered[..., high] - ordered[..., low]) * frac

    return quantile(0.75) - quantile(0.25)


def quantile_iqr(samples: th.Tensor) -> th.Tensor:
    """Inter-quartile range over the last dim via ``torch.ops.cuda_ext.quantile_iqr`` (local fallback).

    Not differentiable (an exploration statistic): the samples are detached.

    :param samples: ``[..., N]`` values.
    :return: ``[...]`` ``Q(0.75) - Q(0.25)``.
    """
    samples = samples.detach()
    op = getattr(th.ops.cuda_ext, "quantile_iqr", None)
    if op is None:
        return _local_quantile_iqr(samples)
    return op(samples.float().contiguous()).to(samples.dtype)


def _block_views(x: th.Tensor, block: int, batch: int, per_sample: int = 1) -> list[th.Tensor]:
    """Per-block views of ``x`` along dim 0, ``per_sample`` rows a sample, for blocks of ``block`` samples.

    :param x: the whole batch's rows (split into the blocks' pieces), or a reused block-sized buffer (the
        buffer itself for every full block, its first rows for a last partial one).
    :param block: samples per block.
    :param batch: samples in all.
    :param per_sample: rows of ``x`` per sample.
    :return: one view per block (``x`` itself when one block holds the batch: no view to dispatch).
    """
    if block >= batch:
        return [x]
    if x.shape[0] == batch * per_sample:
        return list(x.split(block * per_sample))
    n_full, last = divmod(batch, block)
    return [x] * n_full + ([x[: last * per_sample]] if last else [])


class _TakenQuantileHead(th.autograd.Function):
    """IQN output of the taken actions: tau embedding (ReLU), branch features folded into the taken weights.

    ``out[b, k, n] = sum_h folded[b, k, h] * embedding[b, n, h] + bias[b, k]`` for ``k = (branch, head)``,
    with ``folded = weight_rows[rows] * features`` (each sample's taken actions' weights: ``rows`` indexes
    the rows that the one-hot ``selector`` picks, so the gather gives the product ``selector @ weight_rows``
    exactly) and ``embedding = relu(cos(taus[..., None] * frequencies) @ tau_weight.T)``:
    one ``[NB * E, H] @ [H, N]`` product per sample. The samples go through in blocks (on the CPU a few dozen,
    so a block's ``[rows, H]`` embedding, its weights and their gradients stay in the core's cache; on a GPU
    the whole batch is one block); backward forms every gradient contiguous, applies the ReLU's mask in place
    and sums the weights' gradients over the blocks, and no ``[B, NB, E, H]`` weight gradient is formed.
    Autograd through the same ops took about 1.3x as long on one CPU thread: it handed ``H``-strided
    gradients to the elementwise ops and made the ``[B, N, H]`` embedding and its gradients round-trip
    through memory several times. Without autograd (the target network's pass) nothing is kept. Same values
    and gradients (the weights' summed block by block).
    """

    @staticmethod
    def forward(
        ctx: Any,
        taus: th.Tensor,
        frequencies: th.Tensor,
        tau_weight: th.Tensor,
        features: th.Tensor,
        selector: th.Tensor,
        rows: th.Tensor,
        weight_rows: th.Tensor,
        bias: th.Tensor,
        block: int,
    ) -> th.Tensor:
        """:param taus: ``[B, N]`` quantile fractions (no gradient).
        :param frequencies: ``[n_cos]`` cosine frequencies (no gradient).
        :param tau_weight: ``[H, n_cos]`` tau embedding weight, its bias on the first column.
        :param features: ``[B, NB, 1, H]`` branch features.
        :param selector: ``[B * NB, NB * A]`` one-hot rows of the taken actions (no gradient): the weight
            gradient is its transposed product with the rows' gradients (dense, no index scatter).
        :param rows: ``[B * NB]`` int64, the column of each selector row's one (no gradient): the taken
            weights are gathered by ``index_select`` (one copy; the one-hot product, a ``K = NB * A`` matrix
            product, took about 4x as long per block on one CPU thread).
        :param weight_rows: ``[NB * A, E * H]`` output weights of every (branch, action), ``(E, H)`` inner.
        :param bias: ``[B, NB * E]`` taken actions' output biases.
        :param block: samples per block.
        :return: ``[B, NB * E, N]``.
        """
        batch, n_taus = taus.shape
        n_branches, hidden_dim = features.shape[1], features.shape[-1]
        n_ensemble = weight_rows.shape[1] // hidden_dim
        n_cos = frequencies.shape[0]
        # With autograd the folded weights, the embedding and (for the tau weight's gradient) the cosines are
        # kept for backward, written block by block into whole-batch buffers; without it (the target network's
        # pass) every block reuses one block-sized set of buffers and nothing is kept.
        keep = any(ctx.needs_input_grad)
        # Without autograd on the CPU the embedding is formed transposed, ``[H, N]`` per sample (one batched
        # ``tau_weight @ cosines^T`` product): the output product then reads it with unit stride instead of
        # through the transposed view of an ``[N, H]`` block (one thread, a block of 32 samples at the default
        # sizes: 145 instead of 241 us, and the embedding's product 308 instead of 326 us). Measured bit for
        # bit the same values there (each output's sum runs over the same terms in the same order in MKL).
        transposed = not keep and taus.device.type == "cpu"
        samples_kept = batch if keep else min(block, batch)
        folded = taus.new_empty(samples_kept, n_branches, n_ensemble, hidden_dim)
        keep_cosines = keep and ctx.needs_input_grad[2]
        samples_cosines = batch if keep_cosines else min(block, batch)
        if transposed:
            embedding = taus.new_empty(samples_kept, hidden_dim, n_taus)
            cosines = taus.new_empty(samples_cosines, n_cos, n_taus)
        else:
            embedding = taus.new_empty(samples_kept, n_taus, hidden_dim)
            cosines = taus.new_empty(samples_cosines, n_taus, n_cos)
        out = taus.new_empty(batch, n_branches * n_ensemble, n_taus)
        # Every block's views, made up front: a split per tensor instead of a dozen slicings and views per
        # block (the loop's Python and dispatch cost is per block: one thread, default sizes, 8 blocks: about
        # 0.4 ms less per pass). The taken weights are gathered into the folded buffer's rows and folded with
        # the features in place there.
        gathered = _block_views(folded.view(-1, n_ensemble * hidden_dim), block, batch, n_branches)
        weighted = _block_views(folded, block, batch)  # [b, NB, E, H]
        matrices = _block_views(folded.view(folded.shape[0], -1, hidden_dim), block, batch)  # [b, NB * E, H]
        indices = _block_views(rows, block, batch, n_branches)
        feature_blocks = _block_views(features, block, batch)
        bias_blocks = _block_views(bias.unsqueeze(-1), block, batch)
        out_blocks = _block_views(out, block, batch)
        cosine_blocks = _block_views(cosines, block, batch)
        columns, tau_weight_t = frequencies.unsqueeze(-1), tau_weight.t()
        if transposed:  # [b, n_cos, N] cosines, [b, H, N] embedding
            taus_blocks = _block_views(taus.unsqueeze(1), block, batch)
            tau_weights = _block_views(tau_weight.expand(min(block, batch), -1, -1), block, batch)
            embedding_blocks = _block_views(embedding, block, batch)
            cosine_rows = embedding_rows = []
        else:  # [b, N, n_cos] cosines, [b, N, H] embedding; their product on the blocks' rows
            taus_blocks = _block_views(taus.unsqueeze(-1), block, batch)
            tau_weights = []
            cosine_rows = _block_views(cosines.view(-1, n_cos), block, batch, n_taus)
            embedding_rows = _block_views(embedding.view(-1, hidden_dim), block, batch, n_taus)
            embedding_blocks = _block_views(embedding.transpose(1, 2), block, batch)  # [b, H, N] views
        for i in range(len(out_blocks)):
            th.index_select(weight_rows, 0, indices[i], out=gathered[i])
            weighted[i].mul_(feature_blocks[i])
            if transposed:
                th.mul(columns, taus_blocks[i], out=cosine_blocks[i]).cos_()
                th.bmm(tau_weights[i], cosine_blocks[i], out=embedding_blocks[i]).relu_()
            else:
                th.mul(taus_blocks[i], frequencies, out=cosine_blocks[i]).cos_()
                th.mm(cosine_rows[i], tau_weight_t, out=embedding_rows[i]).relu_()
            th.baddbmm(bias_blocks[i], matrices[i], embedding_blocks[i], out=out_blocks[i])
        if keep:
            kept_cosines = cosines if keep_cosines else None
            saved = (kept_cosines, features, selector, rows, weight_rows, folded, embedding)
            ctx.save_for_backward(*saved)
        ctx.block = block
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: th.Tensor) -> tuple[th.Tensor | None, ...]:
        cosines, features, selector, rows, weight_rows, folded, embedding = ctx.saved_tensors
        need_tau_weight, need_features, need_weight_rows = (ctx.needs_input_grad[i] for i in (2, 3, 6))
        batch, n_branches, hidden_dim = features.shape[0], features.shape[1], features.shape[-1]
        n_taus, n_ensemble = embedding.shape[1], weight_rows.shape[1] // hidden_dim
        block, samples = ctx.block, min(ctx.block, batch)
        grad_out = grad_out.contiguous()  # [B, NB * E, N]
        grad_blocks = _block_views(grad_out, block, batch)
        embedding_blocks = _block_views(embedding, block, batch)
        # One block-sized set of buffers (the gradients of the embedding and the folded weights, the gradient
        # of the gathered weights, the gathered weights), reused by every block: it stays in the core's cache
        # instead of a fresh allocation per block and product. Every block's views are made up front.
        folded_shape = (samples, n_branches, n_ensemble, hidden_dim)
        grad_tau_weight_t = grad_folded = grad_weight_rows = grad_features = None
        if need_tau_weight:
            # The tau weight's gradient is summed transposed, [n_cos, H] += cosines^T @ grad_embedding: a
            # block's product about 13% faster on one CPU thread than grad_embedding^T @ cosines, and the same
            # sums (MKL runs each over the rows in the same order: equal bit for bit at the default sizes).
            n_cos = cosines.shape[-1]
            grad_tau_weight_t = embedding.new_zeros(n_cos, hidden_dim)
            grad_embedding = grad_out.new_empty(samples, n_taus, hidden_dim)
            grad_embeddings = _block_views(grad_embedding, block, batch)  # [b, N, H]
            grad_embedding_rows = _block_views(grad_embedding.view(-1, hidden_dim), block, batch, n_taus)
            grads_t = [x.transpose(1, 2) for x in grad_blocks]
            matrices = _block_views(folded.view(batch, -1, hidden_dim), block, batch)  # [b, NB * E, H]
            cosine_rows = _block_views(cosines.view(-1, n_cos), block, batch, n_taus)  # kept by forward
            cosine_rows_t = [x.t() for x in cosine_rows]
        if need_features or need_weight_rows:
            grad_folded = grad_out.new_empty(folded_shape)
            grad_folded_blocks = _block_views(grad_folded, block, batch)
            grad_folded_matrices = _block_views(grad_folded.view(samples, -1, hidden_dim), block, batch)
        if need_weight_rows:  # the gather's backward as a one-hot product: dense, no scatter
            grad_weight_rows = th.zeros_like(weight_rows)
            grad_taken = grad_out.new_empty(folded_shape)
            grad_taken_blocks = _block_views(grad_taken, block, batch)
            grad_taken_rows = grad_taken.view(-1, n_ensemble * hidden_dim)
            grad_taken_rows = _block_views(grad_taken_rows, block, batch, n_branches)
            selectors_t = [x.t() for x in _block_views(selector, block, batch, n_branches)]
            feature_blocks = _block_views(features, block, batch)
        if need_features:
            grad_features = features.new_empty(features.shape)
            taken = grad_out.new_empty(folded_shape)  # the gathered weights, as in forward
            taken_blocks = _block_views(taken, block, batch)
            taken_rows = _block_views(taken.view(-1, n_ensemble * hidden_dim), block, batch, n_branches)
            indices = _block_views(rows, block, batch, n_branches)
            grad_feature_blocks = _block_views(grad_features, block, batch)
        for i in range(len(grad_blocks)):
            if grad_folded is not None:  # first: it reads the embedding block, the ReLU's mask reuses it
                th.bmm(grad_blocks[i], embedding_blocks[i], out=grad_folded_matrices[i])  # [b, NB * E, H]
            if grad_tau_weight_t is not None:
                th.bmm(grads_t[i], matrices[i], out=grad_embeddings[i])  # [b, N, H]
                th.ops.aten.threshold_backward.grad_input(  # the ReLU's mask, in place
                    grad_embeddings[i], embedding_blocks[i], 0.0, grad_input=grad_embeddings[i]
                )
                # summed into the gradient by addmm's out= form, not addmm_: torch.utils.flop_counter (the
                # train_step benchmark's FLOP count) counts addmm and its out= overload, not the in-place one
                th.addmm(grad_tau_weight_t, cosine_rows_t[i], grad_embedding_rows[i], out=grad_tau_weight_t)
            if grad_weight_rows is not None:
                th.mul(grad_folded_blocks[i], feature_blocks[i], out=grad_taken_blocks[i])
                th.addmm(grad_weight_rows, selectors_t[i], grad_taken_rows[i], out=grad_weight_rows)
            if grad_features is not None:
                th.index_select(weight_rows, 0, indices[i], out=taken_rows[i])
                products = grad_folded_blocks[i].mul_(taken_blocks[i])
                th.sum(products, dim=2, keepdim=True, out=grad_feature_blocks[i])
        grad_tau_weight = grad_tau_weight_t.t().contiguous() if grad_tau_weight_t is not None else None
        grad_bias = grad_out.sum(dim=-1) if ctx.needs_input_grad[7] else None
        return None, None, grad_tau_weight, grad_features, None, None, grad_weight_rows, grad_bias, None


def _taken_logits(logits: th.Tensor, actions: th.Tensor, by_mask: bool) -> th.Tensor:
    """The C51 logits of each branch's taken action, ``[B, NB, atoms]`` from ``[B, NB, A, atoms]``.

    Both ways give the same values and gradients bit for bit. ``by_mask`` (the GPU path): a mask and a sum
    over ``A`` (each value plus zeros), whose backward is a mask; a gather's backward is a scatter-add, which
    on CUDA under ``torch.use_deterministic_algorithms`` (a seeded model) runs as a sort-based index_put of
    dozens of launches. On the CPU the gather is faster (one thread, default sizes: about 570 against 960 µs
    forward and backward) and its scatter-add is sequential.

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


def _check_positive(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{name}={value!r} must be a positive int")


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
    ) -> None:
        super().__init__()
        for name, value in (
            ("obs_dim", obs_dim),
            ("n_market_features", n_market_features),
            ("n_ensemble", n_ensemble),
            ("n_cos", n_cos),
            ("n_atoms", n_atoms),
        ):
            _check_positive(name, value)
        if n_market_features > obs_dim:
            raise ValueError(f"n_market_features={n_market_features} must be <= obs_dim={obs_dim}")
        if len(action_dims) == 0:
            raise ValueError(f"action_dims={list(action_dims)} must name at least one branch")
        for b, n in enumerate(action_dims):
            _check_positive(f"action_dims[{b}]", n)
        if len(bottleneck_dims) != len(action_dims):
            raise ValueError(
                f"bottleneck_dims={list(bottleneck_dims)} must have one width per branch ({len(action_dims)})"
            )
        for b, w in enumerate(bottleneck_dims):
            _check_positive(f"bottleneck_dims[{b}]", w)
        if len(net_arch) == 0:
            raise ValueError(f"net_arch={list(net_arch)} must have at least one hidden layer")
        for i, h in enumerate(net_arch):
            _check_positive(f"net_arch[{i}]", h)

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
        n_branches, n_actions = self.n_branches, self.max_actions
        max_bottleneck = max(self.bottleneck_dims)
        n_portfolio = self.obs_dim - self.n_market_features

        # Bottleneck: branch b uses the first bottleneck_dims[b] of max_bottleneck columns; the mask zeroes
        # the rest (they output tanh(0) = 0, so they carry neither signal nor gradient).
        self.bottleneck_weight = nn.Parameter(th.empty(n_branches, self.n_market_features, max_bottleneck))
        bound = 1.0 / math.sqrt(n_market_features)  # nn.Linear's default initialisation
        nn.init.uniform_(self.bottleneck_weight, -bound, bound)
        columns = th.arange(max_bottleneck)
        self.register_buffer(
            "bottleneck_mask",
            (columns < th.tensor(self.bottleneck_dims)[:, None]).float().unsqueeze(1),
            persistent=False,
        )
        widths = [max_bottleneck + n_portfolio, *self.net_arch]
        self.hidden = nn.ModuleList(
            BranchLinear(n_branches, i, o) for i, o in zip(widths[:-1], widths[1:], strict=True)
        )
        hidden_dim = self.net_arch[-1]
        # One matmul embeds tau for all branches: [n_cos] -> [NB * hidden_dim].
        self.shared_tau_embedding = bool(shared_tau_embedding)
        tau_width = hidden_dim if self.shared_tau_embedding else n_branches * hidden_dim
        self.tau_embedding = nn.Linear(self.n_cos, tau_width)
        self.register_buffer(
            "cos_frequencies", th.arange(self.n_cos, dtype=th.float32) * math.pi, persistent=False
        )
        self.iqn_out = BranchLinear(n_branches, hidden_dim, self.n_ensemble * n_actions)
        self.c51_out = BranchLinear(n_branches, hidden_dim, n_actions * self.n_atoms)
        self.register_buffer(
            "action_mask",
            th.arange(n_actions)[None, :] < th.tensor(self.action_dims)[:, None],
            persistent=False,
        )  # [NB, A] bool, True for real actions
        self.padded_actions = min(self.action_dims) < n_actions  # masking is skipped when False
        self.uneven_bottlenecks = min(self.bottleneck_dims) < max_bottleneck
        iqn_output_mask = self.action_mask[:, None, :].expand(n_branches, self.n_ensemble, n_actions)
        self.register_buffer(
            "iqn_output_mask", iqn_output_mask.reshape(n_branches, 1, -1).float(), persistent=False
        )  # [NB, 1, E * A], matching iqn_out's (ensemble, action) output layout
        self.popart: PopArt | None = None

    def attach_popart(self, popart: PopArt | None) -> None:
        """Use ``popart`` to de-normalise ``action_stats`` (kept as a plain reference, not a submodule).

        :param popart: the policy's PopArt, or None.
        """
        object.__setattr__(self, "popart", popart)

    def branch_features(self, obs: th.Tensor) -> th.Tensor:
        """Per-branch features after bottleneck and MLP.

        :param obs: ``[B, D]`` observations.
        :return: ``[NB, B, H]`` with ``H = net_arch[-1]``.
        """
        if obs.dim() != 2 or obs.shape[1] != self.obs_dim:
            raise ValueError(f"obs.shape={tuple(obs.shape)} must be [B, {self.obs_dim}]")
        market = obs[:, : self.n_market_features]
        portfolio = obs[:, self.n_market_features :]
        x = self.bottleneck(market)  # [NB, B, W]
        if portfolio.shape[1] > 0:
            x = th.cat([x, portfolio.unsqueeze(0).expand(self.n_branches, -1, -1)], dim=-1)
        relu = isinstance(self.activation, nn.ReLU)
        for layer in self.hidden:
            # ReLU in place on the layer's fresh output (the product's backward does not need it): no second
            # [NB, B, H] buffer (one thread, default sizes: 0.3 ms less per pass, with or without autograd)
            x = layer(x).relu_() if relu else self.activation(layer(x))
        return x

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
        features_bhn = features.permute(1, 2, 0).contiguous().unsqueeze(-1)  # [B, H, NB, 1]
        folded = features_bhn * weight.permute(1, 0, 2).contiguous()  # [B, H, NB, E * A], contiguous
        if self.shared_tau_embedding:
            out = th.baddbmm(bias.view(1, 1, -1), embedding, folded.view(batch, hidden_dim, -1))
        else:
            per_branch = embedding.view(batch, n_taus, n_branches, hidden_dim).transpose(1, 2)
            out = th.matmul(per_branch, folded.permute(0, 2, 1, 3))  # [B, NB, N, E * A]
            out = (out + bias[None, :, None, :]).transpose(1, 2)
        out = out.reshape(batch, n_taus, n_branches, self.n_ensemble, self.max_actions)
        return out.permute(3, 0, 2, 4, 1)  # [E, B, NB, A, N]

    def quantiles(self, obs: th.Tensor, taus: th.Tensor) -> th.Tensor:
        """IQN quantile values of every ensemble head, branch and action.

        :param obs: ``[B, D]`` observations.
        :param taus: ``[B, N]`` quantile fractions in [0, 1].
        :return: ``[E, B, NB, A, N]`` in the PopArt-normalised space; padded actions are 0.
        """
        return self._iqn_from_features(self.branch_features(obs), taus)

    def c51_logits(self, obs: th.Tensor) -> th.Tensor:
        """C51 logits of every branch and action.

        :param obs: ``[B, D]`` observations.
        :return: ``[B, NB, A, n_atoms]``; padded actions are all-zero logits.
        """
        features = self.branch_features(obs)
        return self._c51_from_features(features)

    def _c51_from_features(self, features: th.Tensor) -> th.Tensor:
        batch = features.shape[1]
        logits = self.c51_out(features).view(self.n_branches, batch, self.max_actions, self.n_atoms)
        if self.padded_actions:
            logits = logits * self.action_mask[:, None, :, None]
        return logits.transpose(0, 1)

    def quantiles_and_logits(self, obs: th.Tensor, taus: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
        """Both heads from one pass through the shared branch trunk (cheaper than two calls).

        :param obs: ``[B, D]`` observations.
        :param taus: ``[B, N]`` quantile fractions.
        :return: ``(quantiles [E, B, NB, A, N], c51_logits [B, NB, A, n_atoms])``.
        """
        features = self.branch_features(obs)
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

    @staticmethod
    def _block_samples(taus: th.Tensor) -> int:
        """Samples per block of :class:`_TakenQuantileHead`: the whole batch except on the CPU.

        :param taus: ``[B, N]`` quantile fractions of the pass.
        :return: samples per block (at least 1).
        """
        batch, n_taus = taus.shape
        if taus.device.type != "cpu":
            return max(1, batch)
        return max(1, min(batch, CPU_EMBEDDING_ROWS_PER_BLOCK // max(1, n_taus)))

    def taken_quantiles_and_logits(
        self, obs: th.Tensor, taus: th.Tensor, actions: th.Tensor
    ) -> tuple[th.Tensor, th.Tensor]:
        """Quantiles and C51 logits of one action per branch (the training step's pass).

        The same values as gathering ``actions`` from :meth:`quantiles_and_logits`, but the IQN output
        layer is applied to the chosen actions' weight columns only (``A`` times fewer output products).

        :param obs: ``[B, D]`` observations.
        :param taus: ``[B, N]`` quantile fractions.
        :param actions: ``[B, NB]`` int64 action of each branch.
        :return: ``(quantiles [E, B, NB, N], c51_logits [B, NB, n_atoms])``.
        """
        features = self.branch_features(obs)  # [NB, B, H]
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
            block = self._block_samples(taus)
            out = _TakenQuantileHead.apply(
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

        On the CPU without autograd (the target's action choice) it runs in blocks of samples holding
        ``CPU_EMBEDDING_ROWS_PER_BLOCK`` rows, in reused block buffers: each block's embedding is summed while
        it is in the core's cache, and no ``[B, N, H]`` embedding is written to memory and read back (one
        thread, default step: 0.8 to 1.1 ms/step less). The same values: the same products, and the mean is
        the sum divided by ``N``, as ``torch.mean`` computes it.

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
        n_taus, width = taus.shape[1], weight.shape[0]
        block = self._block_samples(taus)  # the CPU's block, as the taken-action head's
        cosines = taus.new_empty(block, n_taus, self.n_cos)
        embedding = taus.new_empty(block, n_taus, width)
        sums = taus.new_empty(batch, width)
        weight_t = weight.t()
        for start in range(0, batch, block):
            stop = min(start + block, batch)
            block_cosines = cosines[: stop - start]
            th.mul(taus[start:stop, :, None], self.cos_frequencies, out=block_cosines).cos_()
            block_embedding = th.matmul(block_cosines, weight_t, out=embedding[: stop - start]).relu_()
            th.sum(block_embedding, dim=1, out=sums[start:stop])
        return sums.div_(n_taus).view(batch, -1, self.net_arch[-1])

    def mean_values(self, obs: th.Tensor, taus: th.Tensor) -> th.Tensor:
        """Ensemble-mean quantile-mean of every branch and action (for greedy choices).

        Equals ``quantiles(obs, taus).mean(dim=(0, -1))`` up to rounding: the output layer is linear, so
        the mean over ``taus`` is taken of the ``tau`` embedding, before it, and the ``[.., N]`` quantiles
        are never formed.

        :param obs: ``[B, D]`` observations.
        :param taus: ``[B, N]`` quantile fractions.
        :return: ``[B, NB, A]`` in the normalised space; padded actions are 0.
        """
        features = self.branch_features(obs)  # [NB, B, H]
        embedding = self._mean_tau_embedding(taus, features.shape[1])  # [B, G, H]
        weight, bias = self._iqn_output_layer()  # [NB, H, E, A], [NB, E, A]
        n_branches, hidden_dim = weight.shape[:2]
        mixed = embedding.permute(1, 0, 2) * features  # [NB, B, H]
        out = th.baddbmm(bias.view(n_branches, 1, -1), mixed, weight.view(n_branches, hidden_dim, -1))
        out = out.view(n_branches, -1, self.n_ensemble, self.max_actions).mean(dim=2)  # [NB, B, A]
        return out.transpose(0, 1)

    def action_stats(self, obs: th.Tensor, taus: th.Tensor) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
        """Action values and uncertainty statistics for action selection.

        :param obs: ``[B, D]`` observations.
        :param taus: ``[B, K]`` quantile fractions.
        :return: ``(q, iqr, ens_std)``, each ``[B, NB, A]``: ``q`` the ensemble mean of the quantile mean,
            ``iqr`` the inter-quartile range of the ensemble-mean quantiles, ``ens_std`` the (population) std
            over the ensemble of the per-head means; all de-normalised when a PopArt is attached (the spreads
            scaled by ``sigma``). Padded actions: ``q = -inf``, ``iqr = ens_std = 0``.
        """
        values = self.quantiles(obs, taus)  # [E, B, NB, A, K]
        head_means = values.mean(dim=-1)  # [E, B, NB, A]
        q = head_means.mean(dim=0)
        iqr = quantile_iqr(values.mean(dim=0))
        ens_std = head_means.std(dim=0, correction=0)
        if self.popart is not None:
            q = self.popart.denormalize(q)
            iqr = iqr * self.popart.sigma
            ens_std = ens_std * self.popart.sigma
        mask = self.action_mask.unsqueeze(0)
        q = q.masked_fill(~mask, -math.inf)
        return q, iqr.masked_fill(~mask, 0.0), ens_std.masked_fill(~mask, 0.0)


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


def branch_action_dims(action_space: spaces.Space) -> list[int]:
    """Number of actions of each branch: ``[n]`` for ``Discrete(n)``, ``nvec`` for a 1-D ``MultiDiscrete``.

    The one check of the action space shared by the policy, the replay buffer and the algorithm.

    :param action_space: the action space; actions must start at 0.
    :return: one action count per branch.
    """
    if isinstance(action_space, spaces.Discrete):
        if int(action_space.start) != 0:
            raise ValueError(f"action_space.start={int(action_space.start)} must be 0")
        return [int(action_space.n)]
    shown = " ".join(str(action_space).split())
    if isinstance(action_space, spaces.MultiDiscrete):
        if action_space.nvec.ndim != 1:
            raise ValueError(f"action_space={shown} is not supported: "
                             f"action_space.nvec.shape={action_space.nvec.shape} must be 1-D")
        if np.any(action_space.start != 0):
            raise ValueError(f"action_space.start={action_space.start.tolist()} must be all 0")
        return [int(n) for n in action_space.nvec]
    raise ValueError(f"action_space={shown} is not supported: it must be MultiDiscrete (1-D) or Discrete")


def resolve_bottleneck_dims(
    n_branches: int, bottleneck_dims: Sequence[int] | Mapping[int | str, int] | None
) -> list[int]:
    """Per-branch bottleneck widths from a sequence, an index/name mapping of overrides, or None (defaults).

    Defaults: ``direction 4, magnitude 8, order 6, urgency 4`` for 4 branches, else 8 per branch. Names
    (``direction``, ``magnitude``, ``order``, ``urgency``) are known when there are 4 branches.

    :param n_branches: number of action branches.
    :param bottleneck_dims: the user's setting.
    :return: one positive width per branch.
    """
    names = TRADING_BRANCH_NAMES if n_branches == len(TRADING_BRANCH_NAMES) else ()
    widths = list(TRADING_BOTTLENECK_DIMS) if names else [DEFAULT_BOTTLENECK_DIM] * n_branches
    if bottleneck_dims is None:
        return widths
    if isinstance(bottleneck_dims, Mapping):
        for key, width in bottleneck_dims.items():
            if isinstance(key, str):
                if key not in names:
                    raise ValueError(f"bottleneck_dims key {key!r} is not a branch name ({list(names)})")
                index = names.index(key)
            elif isinstance(key, (int, np.integer)) and not isinstance(key, bool) and 0 <= key < n_branches:
                index = int(key)
            else:
                raise ValueError(f"bottleneck_dims key {key!r} must be a branch index in [0, {n_branches})")
            _check_positive(f"bottleneck_dims[{key!r}]", width)
            widths[index] = int(width)
        return widths
    if isinstance(bottleneck_dims, str) or len(bottleneck_dims) != n_branches:
        raise ValueError(f"bottleneck_dims={bottleneck_dims!r} must have one width per branch ({n_branches})")
    for b, width in enumerate(bottleneck_dims):
        _check_positive(f"bottleneck_dims[{b}]", width)
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
        statistics before this batch's PopArt update; see :meth:`BranchingIQN._distributional_loss`).
    :param popart_beta: PopArt's moment step size.
    :param optimizer_class: optimizer of the online network.
    :param optimizer_kwargs: optimizer keyword arguments, without the learning rate; Adam and AdamW get
        ``fused=True`` unless these choose ``fused``, ``foreach`` or ``differentiable``
        (see :func:`default_optimizer_kwargs`).
    :param normalize_images: kept for SB3 compatibility (observations are flat vectors; unused).
    :param shared_tau_embedding: share the ``tau`` embedding layer across branches (see
        :class:`BranchingQNetwork`); False gives each branch its own.
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
        _check_positive("n_market_features", n_market_features)
        if n_market_features > obs_dim:
            raise ValueError(f"n_market_features={n_market_features} must be <= observation dim {obs_dim}")
        for name, value in (
            ("n_quantiles", n_quantiles),
            ("n_quantiles_target", n_quantiles_target),
            ("n_quantiles_act", n_quantiles_act),
            ("n_atoms", n_atoms),
        ):
            _check_positive(name, value)
        if n_atoms < 2:
            raise ValueError(f"n_atoms={n_atoms} must be >= 2")
        if not v_min < v_max:
            raise ValueError(f"v_min={v_min} must be < v_max={v_max}")

        self.n_market_features = int(n_market_features)
        self.bottleneck_dims = resolve_bottleneck_dims(len(action_dims), bottleneck_dims)
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

    def sample_taus(self, batch_size: int, n: int) -> th.Tensor:
        """Fresh uniform quantile fractions (global torch RNG, so seeded runs repeat).

        :param batch_size: ``B``.
        :param n: fractions per row.
        :return: ``[B, n]`` on the policy's device.
        """
        return th.rand(batch_size, n, device=self.device)

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

    def action_stats(self, obs: PyTorchObs) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
        """``(q, iqr, ens_std)``, each ``[B, NB, A]``, with fresh ``K = n_quantiles_act`` fractions.

        :param obs: observations ``[B, *obs_shape]``.
        :return: see :meth:`BranchingQNetwork.action_stats`.
        """
        flat = self._flat_obs(obs)
        return self.q_net.action_stats(flat, self.sample_taus(flat.shape[0], self.n_quantiles_act))

    def _get_constructor_parameters(self) -> dict[str, Any]:
        data = super()._get_constructor_parameters()
        data.update(
            dict(
                lr_schedule=self._dummy_schedule,
                n_market_features=self.n_market_features,
                bottleneck_dims=self.bottleneck_dims,
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
            )
        )
        return data

    def set_training_mode(self, mode: bool) -> None:
        """Put the online network in training (True) or evaluation (False) mode; the target stays in eval.

        :param mode: training mode flag.
        """
        self.q_net.train(mode)
        self.training = mode


MlpPolicy = BranchingIQNPolicy
