"""Hand-fused passes of the IQN head for the training step, each with its own backward.

:class:`TakenQuantileHead` is the IQN output of the taken actions (tau embedding, ReLU, the branch features
folded into the taken actions' output weights) as one ``torch.autograd.Function``;
:func:`blocked_mean_tau_embedding` is the tau embedding's mean over the fractions without autograd. On the
CPU both run in blocks of samples sized so that a block's ``[rows, H]`` embedding and its gradient stay in
the core's cache (see benchmarks/RESULTS.md); on a GPU the whole batch is one block. Same values and
gradients as the plain ops (tests/sb3_her_ext/test_train_speedups.py).
"""

from __future__ import annotations

from typing import Any

import torch as th

#: On the CPU the fused passes run in blocks of samples holding this many (sample, tau) rows: a block's
#: ``[rows, H]`` embedding (1 MiB at ``H = 256``) and its gradient stay in the core's cache.
CPU_EMBEDDING_ROWS_PER_BLOCK = 1024


def block_samples(taus: th.Tensor) -> int:
    """Samples per block of the fused passes: the whole batch except on the CPU.

    :param taus: ``[B, N]`` quantile fractions of the pass.
    :return: samples per block (at least 1).
    """
    batch, n_taus = taus.shape
    if taus.device.type != "cpu":
        return max(1, batch)
    return max(1, min(batch, CPU_EMBEDDING_ROWS_PER_BLOCK // max(1, n_taus)))


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


class TakenQuantileHead(th.autograd.Function):
    """IQN output of the taken actions: tau embedding (ReLU), branch features folded into the taken weights.

    ``out[b, k, n] = sum_h folded[b, k, h] * embedding[b, n, h] + bias[b, k]`` for ``k = (branch, head)``,
    with ``folded = weight_rows[rows] * features`` (each sample's taken actions' weights: ``rows`` indexes
    the rows that the one-hot ``selector`` picks, so the gather gives the product ``selector @ weight_rows``
    exactly) and ``embedding = relu(cos(taus[..., None] * frequencies) @ tau_weight.T)``:
    one ``[NB * E, H] @ [H, N]`` product per sample. The samples go through in blocks (on the CPU a few dozen,
    so a block's ``[rows, H]`` embedding, its weights and their gradients stay in the core's cache; on a GPU
    the whole batch is one block); backward forms every gradient contiguous, applies the ReLU's mask in place
    and sums the weights' gradients over the blocks, and no ``[B, NB, E, H]`` weight gradient is formed.
    Why hand-written: autograd through the same ops hands ``H``-strided gradients to the elementwise ops and
    makes the ``[B, N, H]`` embedding and its gradients round-trip through memory several times. Without
    autograd (the target network's pass) nothing is kept. Same values and gradients (the weights' summed
    block by block).
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
            weights are gathered by ``index_select`` (one copy, cheaper than the ``K = NB * A`` one-hot
            product).
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
        # Without autograd on the CPU the embedding is formed transposed, ``[H, N]`` per sample, so the output
        # product reads it with unit stride (same values: the same sums in the same order).
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
        # Every block's views, made up front: one split per tensor, not a dozen slicings per block (the loop's
        # Python and dispatch cost is per block). The taken weights are gathered into the folded buffer's rows
        # and folded with the features in place there.
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
            # The tau weight's gradient is summed transposed, [n_cos, H] += cosines^T @ grad_embedding: the
            # faster product of the two on the CPU, with the same sums in the same order.
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



def blocked_mean_tau_embedding(
    taus: th.Tensor, frequencies: th.Tensor, weight: th.Tensor, hidden_dim: int
) -> th.Tensor:
    """The ReLU tau embedding's mean over the fractions, block by block, without autograd.

    Each block's embedding is summed while it is in the core's cache, in reused block buffers, so no
    ``[B, N, H]`` embedding is written to memory and read back. The same values as
    ``relu(cos(taus[..., None] * frequencies) @ weight.T).mean(dim=1)``: the same products, and the mean is
    the sum divided by ``N``, as ``torch.mean`` computes it.

    :param taus: ``[B, N]`` quantile fractions.
    :param frequencies: ``[n_cos]`` cosine frequencies.
    :param weight: ``[width, n_cos]`` embedding weight, its bias on the first column.
    :param hidden_dim: ``H``; ``width`` is ``G * H``.
    :return: ``[B, G, H]``.
    """
    batch, n_taus = taus.shape
    n_cos, width = frequencies.shape[0], weight.shape[0]
    block = block_samples(taus)
    cosines = taus.new_empty(block, n_taus, n_cos)
    embedding = taus.new_empty(block, n_taus, width)
    sums = taus.new_empty(batch, width)
    weight_t = weight.t()
    for start in range(0, batch, block):
        stop = min(start + block, batch)
        block_cosines = cosines[: stop - start]
        th.mul(taus[start:stop, :, None], frequencies, out=block_cosines).cos_()
        block_embedding = th.matmul(block_cosines, weight_t, out=embedding[: stop - start]).relu_()
        th.sum(block_embedding, dim=1, out=sums[start:stop])
    return sums.div_(n_taus).view(batch, -1, hidden_dim)
