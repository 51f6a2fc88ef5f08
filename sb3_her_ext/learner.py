"""BranchingIQN's gradient step, read top to bottom in :meth:`Learner.train_step` and :meth:`Learner.step`.

1. sample a batch from the prioritized buffer (importance weights ``w``); on every ``vaccine_interval``-th
   step also a batch stratified by the actions of the vaccine branch;
2. BDQ double-Q target: per branch, the online argmax over the ensemble-mean quantile-mean at ``s'``, the
   target network's quantiles at that action, averaged over branches; ``y = r + γ(1 − done)·Z'``
   (de-normalised). Autoregressive branches (``branch_coupling="autoregressive"``): ``a'`` decoded greedily
   branch by branch, ``Z'`` the last branch's (conditioned on the whole of ``a'``) and the target of the last
   branch only; branch ``b`` before it regresses on the next branch's best value given the taken
   ``a_0 .. a_b`` (Metz et al. 2017; the online network's, :meth:`Learner._within_step_targets`);
3. PopArt update from ``y`` (output-preserving), then ``y`` normalised (and the C51 target projected onto
   the normalised support);
4. IQN quantiles (and C51 logits) of the taken actions; ``L = (1 − c51_alpha)·L_IQN + c51_alpha·L_C51``,
   weighted by ``w``;
5. backward;
6. on a vaccine step: the stratified batch's gradient and GradVac's correction of the main gradient;
7. gradient clipping, optimizer step;
8. PER priorities ``Σ_b |δ_b|`` (per-branch TD errors) and the diagnostics sums.

With ``counterfactual=True`` (a counterfactual env, rows with their env states) steps 2–4 form the loss of
every action's exact outcome from each replayed state instead, through the same :meth:`Learner.loss` on an
expanded batch (:mod:`sb3_her_ext.counterfactual_targets`).

Steps 2–7 are :meth:`Learner.step`. With ``cuda_graph`` they run as one CUDA graph replay
(:mod:`sb3_her_ext.graphed_step`; a second graph for the vaccine steps), their quantile fractions drawn
from the model's generator beforehand in the order the eager step draws them, so both paths see the same
numbers. Nothing here reads a device value on the host.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch as th
from torch import nn

from sb3_her_ext.counterfactual_targets import CounterfactualTargets
from sb3_her_ext.diagnostics import TrainingDiagnostics
from sb3_her_ext.graphed_step import GraphedTrainStep, StaticBatch, StepOutputs
from sb3_her_ext.guard import NanGuard, named_state
from sb3_her_ext.losses import DistributionalLoss, c51_cross_entropy, c51_project, quantile_huber_loss
from sb3_her_ext.policy import BranchingIQNPolicy
from sb3_her_ext.vaccine import GradVac, assign_flat_grad, flat_grad


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


def _mean_values_given(net: th.nn.Module, obs: th.Tensor, taus: th.Tensor, prefix: th.Tensor) -> th.Tensor:
    """``[B, NB, A]`` mean values of an autoregressive network, each branch conditioned on ``prefix``."""
    return net.mean_values(obs, taus, prefix_actions=prefix)


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



class Learner:
    """Runs BranchingIQN's gradient steps on a policy's networks.

    :param policy: the policy: networks, PopArt, C51 support, optimizer and quantile counts.
    :param action_dims: number of actions of each branch.
    :param gamma: discount factor.
    :param c51_alpha: weight of the C51 loss in ``(1 − α)·L_IQN + α·L_C51``.
    :param max_grad_norm: gradient clipping norm.
    :param vaccine: the GradVac module (its target cosine is model state).
    :param vaccine_interval: every this many gradient steps a vaccine step (0: never).
    :param vaccine_branch: index of the branch whose actions stratify the vaccine batch.
    :param diagnostics: the accumulator of the losses, vaccine cosines and priorities' weights.
    :param generator: the model's generator, for the quantile fractions.
    :param device: the model's device.
    :param compile_loss: the quantile-Huber loss through ``torch.compile``.
    :param cuda_graph: run steps 2–7 as CUDA graph replays (the optimizer must be capturable).
    :param guard: the NaN guard (:mod:`sb3_her_ext.guard`): a step with a non-finite target, loss or gradient
        changes nothing (None: no guard).
    """

    def __init__(
        self,
        policy: BranchingIQNPolicy,
        action_dims: list[int],
        *,
        gamma: float,
        c51_alpha: float,
        max_grad_norm: float,
        vaccine: GradVac,
        vaccine_interval: int,
        vaccine_branch: int,
        diagnostics: TrainingDiagnostics,
        generator: th.Generator,
        device: th.device,
        compile_loss: bool = False,
        cuda_graph: bool = False,
        guard: NanGuard | None = None,
    ) -> None:
        self.policy = policy
        self.guard = guard
        if guard is not None:  # what the guard vouches for (and names) when it raises
            guard.watch(lambda: [*named_state(policy, policy.optimizer),
                                 *((f"vaccine.{name}", b) for name, b in vaccine.named_buffers())])
        #: the online and target networks the step trains and reads (the policy's)
        self.q_net: nn.Module = policy.q_net
        self.q_net_target: nn.Module = policy.q_net_target
        self.action_dims = list(action_dims)
        self.gamma = gamma
        self.c51_alpha = c51_alpha
        self.max_grad_norm = max_grad_norm
        self.vaccine = vaccine
        self.vaccine_interval = vaccine_interval
        self.vaccine_branch = vaccine_branch
        self.diagnostics = diagnostics
        self.generator = generator
        self.compile_loss = compile_loss
        self.device = device
        n_actions = th.tensor(self.action_dims, dtype=th.int64, device=device)
        #: ``[NB, A]`` True for the real actions of each branch (the others pad the shorter branches)
        self.valid_actions = th.arange(max(self.action_dims), device=device)[None, :] < n_actions[:, None]
        #: autoregressive branches (more than one): the last branch's target crosses time steps, the earlier
        #: ones regress on the next branch's best value (:meth:`_within_step_targets`)
        coupled = bool(getattr(policy.q_net, "autoregressive", False))
        self.autoregressive = coupled and len(self.action_dims) > 1
        self._rand_queue: list[th.Tensor] | None = None  # set while a graphed step runs: its static draws
        #: the all-action targets of a counterfactual env (``BranchingIQN(counterfactual=True)``), else None
        self.counterfactual: CounterfactualTargets | None = None
        self.graphed_step: GraphedTrainStep | None = None
        self.graphed_vaccine_step: GraphedTrainStep | None = None
        if cuda_graph:
            self.graphed_step = GraphedTrainStep(self._graphable_step, self._step_rand_shapes, generator)
            self.graphed_vaccine_step = GraphedTrainStep(
                self._graphable_step, self._vaccine_rand_shapes, generator
            )

    # ------------------------------------------------------------------ the step

    def train_step(self, replay_buffer: Any, batch_size: int, number: int, env: Any = None) -> None:
        """Gradient step number ``number`` of training (counted from 1): steps 1–8 of the module docstring.

        :param replay_buffer: the buffer to sample (prioritized: priorities are updated; else plain SB3).
        :param batch_size: minibatch size.
        :param number: this step's number, which decides whether it is a vaccine step.
        :param env: SB3's ``VecNormalize`` env for the buffer's ``sample`` (None: none).
        """
        # 1. a prioritized batch and its importance weights (ones for a plain buffer); on a vaccine step the
        #    stratified batch too (after the main batch: the eager and graphed steps draw alike)
        batch = replay_buffer.sample(batch_size, env=env)
        if hasattr(batch, "weights"):
            weights = batch.weights.reshape(-1).float()
        else:
            weights = th.ones_like(batch.rewards.reshape(-1))
        vaccine_batch = None
        if self.vaccine_due(number, replay_buffer):
            vaccine_batch = self.sample_vaccine_batch(replay_buffer, batch_size)
        # 2.-7. target, PopArt, loss, backward, vaccine, clip, optimizer step: eagerly or as one graph replay
        record = functools.partial(self._record, replay_buffer, batch)
        if self.graphed_step is None or self.graphed_vaccine_step is None or self.counterfactual is not None:
            record(self.step(batch, weights, vaccine_batch))  # counterfactual: eager (a block captures it)
        elif vaccine_batch is None:
            self.graphed_step.run((batch,), weights, record)
        else:
            self.graphed_vaccine_step.run((batch, vaccine_batch), weights, record)

    def train_step_in_graph(self, replay_buffer: Any, batch_size: int, vaccine: bool,
                            beta: th.Tensor) -> None:
        """:meth:`train_step` as a training block runs it (:mod:`sb3_her_ext.collect.block`): the
        batch sampled with ``β`` read from a device tensor (``sample_with_beta``), steps 2–7 run eagerly
        (the enclosing capture holds them; their fractions drawn from the model's generator in the same
        order), whether it is a vaccine step decided by the caller.

        :param replay_buffer: a :class:`~sb3_her_ext.replay.PrioritizedHindsightReplayBuffer`.
        :param batch_size: minibatch size.
        :param vaccine: a vaccine step (:meth:`vaccine_due` of its number).
        :param beta: 0-dim float64 PER importance exponent on the device.
        """
        batch = replay_buffer.sample_with_beta(batch_size, beta)
        weights = batch.weights.reshape(-1).float()
        vaccine_batch = self.sample_vaccine_batch(replay_buffer, batch_size) if vaccine else None
        self._record(replay_buffer, batch, self.step(batch, weights, vaccine_batch))

    def step(self, batch: Any, weights: th.Tensor, vaccine_batch: Any = None) -> StepOutputs:
        """Steps 2–7 on one batch: target, PopArt, loss, backward, vaccine, clip, optimizer step.

        :param batch: replay samples (SB3's ``ReplayBufferSamples`` fields).
        :param weights: ``[B]`` importance weights of ``batch``.
        :param vaccine_batch: on a vaccine step the stratified batch (:meth:`sample_vaccine_batch`); else
            None.
        :return: the step's outputs (with the vaccine's cosine and correction flag on a vaccine step).
        """
        params = list(self.q_net.parameters())
        optimizer = self.policy.optimizer
        guard = self.guard
        # the state this step changes, to restore if it meets a NaN or inf: what changes before the optimizer
        # step (PopArt, GradVac; a fused optimizer skips its own step), or all of it (the GPU's masked mode
        # with an optimizer that cannot skip a step)
        if guard is not None:
            guard.snapshot(*self._guarded_state(before_optimizer=not guard.snapshots_all(optimizer)))
        # 2.-4. double-Q target, PopArt update, IQN + C51 loss of the taken actions (or, with counterfactual
        # targets, of every action: sb3_her_ext.counterfactual_targets), weighted
        if self.counterfactual is not None and getattr(batch, "counterfactual_states", None) is not None:
            result = self.counterfactual.loss(self, batch)
        else:
            result = self.loss(batch, update_popart=True)
        loss = (result.per_sample * weights).mean()
        # 5. backward
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        # 6. on a vaccine step: GradVac's correction from the stratified batch's gradient
        cos = corrected = None
        if vaccine_batch is not None:
            cos, corrected = self.vaccinate(params, vaccine_batch)
        # 7. clip, optimizer step
        grad_norm = th.nn.utils.clip_grad_norm_(params, self.max_grad_norm)
        if guard is None:
            optimizer.step()
        else:  # CPU: raises before the optimizer changes anything; GPU: a NaN/inf step skipped or undone
            guard.optimizer_step(optimizer, loss, grad_norm)
        assert result.td_abs is not None
        # Detached outputs: a graph's static outputs live as long as the graph, and an output that kept its
        # autograd graph would keep the parameters' AccumulateGrad nodes (and the capture stream) alive.
        return StepOutputs(
            result.td_abs.sum(dim=1).float(), (result.l_q * weights).mean().detach(),
            (result.l_c51 * weights).mean().detach(), loss.detach(), weights.mean(), cos, corrected,
        )

    def _record(self, replay_buffer: Any, batch: Any, outputs: StepOutputs) -> None:
        """8. the batch's new priorities (a prioritized buffer) and the diagnostics sums."""
        if outputs.vaccine_cos is not None and outputs.vaccine_corrected is not None:
            self.diagnostics.add_vaccine(outputs.vaccine_cos, outputs.vaccine_corrected)
        if hasattr(replay_buffer, "update_priorities"):
            replay_buffer.update_priorities(batch.indices, outputs.td_abs_sum)
        self.diagnostics.add_train_step(outputs.l_q, outputs.l_c51, outputs.loss, outputs.mean_weight)

    # ------------------------------------------------------------------ steps 2-4: the loss

    def loss(self, batch: Any, update_popart: bool, values: bool = True,
             branch_weights: th.Tensor | Callable[[th.Tensor], th.Tensor] | None = None) -> (
        DistributionalLoss
    ):
        """Per-sample loss of one batch, following the module docstring's steps 2–4.

        :param batch: replay samples (SB3's ``ReplayBufferSamples`` fields).
        :param update_popart: update PopArt from this batch's targets (the main batch only).
        :param values: False when only the loss's gradient is used (the vaccine batch): the IQN loss's own
            values are not formed (``l_q`` is zeros carrying its gradient, so ``per_sample`` holds only the
            C51 part's values) and there are no TD errors; the gradients are the same.
        :param branch_weights: ``[B, NB]`` each row's weight of each branch's loss (the per-branch mask of
            counterfactual targets), or a function of the rows' mean targets ``[B]`` (de-normalised) that
            gives them; None: the mean over branches.
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
        autoregressive = self.autoregressive
        with th.no_grad():
            # Double-Q per branch: the online network picks a' on the ensemble-mean quantile-mean (greedy
            # decoding branch by branch when the branches are autoregressive) ...
            next_q = _mean_values(q_net, batch.next_observations, rand(batch_size, n_act))  # [B, NB, A]
            next_actions = next_q.masked_fill(~self.valid_actions, -th.inf).argmax(dim=-1)  # [B, NB]
            # ... the target network evaluates it; BDQ averages the branches, autoregressive branches take
            # the last one (conditioned on the whole of a')
            z_next, next_logits = _taken_quantiles_and_logits(  # [E, B, NB, N'], [B, NB, atoms]
                q_net_target, batch.next_observations, rand(batch_size, n_target), next_actions
            )
            z_next = z_next[:, :, -1] if autoregressive else z_next.mean(dim=2)  # [E, B, N']
            # copies only when PopArt's update below changes the statistics in place
            mu_old, sigma_old = self._popart_stats(copy=update_popart)
            not_done = (1.0 - dones)[None, :, None]
            y = rewards[None, :, None] + self.gamma * not_done * (sigma_old * z_next + mu_old)  # [E, B, N']
            if callable(branch_weights):  # masks chosen by the targets (counterfactual joint face)
                branch_weights = branch_weights(y.mean(dim=(0, 2)))
            next_softmax = th.softmax(next_logits, dim=-1)  # [B, NB, atoms]
            next_probs = next_softmax[:, -1] if autoregressive else next_softmax.mean(dim=1)  # [B, atoms]
            within = self._within_step_targets(batch.observations, actions, batch_size) if autoregressive \
                else None

        # 3. PopArt update from y, then y (and the C51 target) in the normalised space
        if update_popart and self.guard is not None:
            self.guard.check_targets(y)  # on the CPU: raises before PopArt's statistics change
        if update_popart and popart is not None:  # output-preserving: rescales the online output layers
            popart.update(y, check=self.guard.check_popart if self.guard is not None else None)

        with th.no_grad():
            mu, sigma = self._popart_stats(copy=False)  # used right here, before any further update
            y_norm = (y - mu) / sigma
            # C51 target in the (new) normalised space: (r + γ(1-d)(σ_old z + μ_old) - μ) / σ
            c51_rewards = (rewards + self.gamma * (1.0 - dones) * mu_old - mu) / sigma
            target_probs = c51_project(next_probs, c51_rewards, dones, self.gamma * sigma_old / sigma,
                                       policy.support)
            y_norm = y_norm[:, :, None, :].expand(-1, -1, n_branches, -1)  # [E, B, NB, N']
            target_probs = target_probs[:, None, :].expand(-1, n_branches, -1)  # [B, NB, atoms]
            if within is not None:
                # branches before the last: the next branch's best value given their prefix, in the same
                # normalised space (no reward, no discount: the same time step)
                z_within, within_logits = within  # [E, B, NB - 1, N'], [B, NB - 1, atoms]
                y_within = ((sigma_old * z_within + mu_old) - mu) / sigma
                shift = ((mu_old - mu) / sigma) * th.ones_like(rewards)[:, None]  # [B, 1]
                probs_within = c51_project(th.softmax(within_logits, dim=-1), shift,
                                           th.zeros_like(dones)[:, None], sigma_old / sigma, policy.support)
                y_norm = th.cat([y_within, y_norm[:, :, -1:]], dim=2)
                target_probs = th.cat([probs_within, target_probs[:, -1:]], dim=1)

        # 4. quantiles and C51 logits of the taken actions; the mixed per-sample loss and TD errors
        taus = rand(batch_size, n_quantiles)
        z_taken, logits_taken = _taken_quantiles_and_logits(  # [E, B, NB, N], [B, NB, atoms]
            q_net, batch.observations, taus, actions
        )
        l_q = quantile_huber_loss(
            z_taken,
            y_norm,
            taus[None, :, None, :].expand_as(z_taken),
            compiled=self.compile_loss,
            values=values,
        )  # [E, B, NB]
        l_c51 = c51_cross_entropy(logits_taken, target_probs)  # [B, NB]
        if branch_weights is None:
            l_q, l_c51 = l_q.mean(dim=(0, 2)), l_c51.mean(dim=1)  # [B]
        else:
            l_q, l_c51 = (l_q.mean(dim=0) * branch_weights).sum(dim=1), (l_c51 * branch_weights).sum(dim=1)
        per_sample = (1.0 - self.c51_alpha) * l_q + self.c51_alpha * l_c51
        if not values:
            return DistributionalLoss(per_sample, l_q, l_c51, None)
        td = y_norm.mean(dim=-1) - z_taken.detach().mean(dim=-1)  # [E, B, NB]
        td_abs = td.abs().mean(dim=0)  # [B, NB]
        return DistributionalLoss(per_sample, l_q, l_c51, td_abs)

    def uniforms(self, *shape: int) -> th.Tensor:
        """Uniform ``[0, 1)`` draws of ``shape`` from the model's generator (in the step's draw order)."""
        return self._rand(*shape)

    def mean_values(self, obs: th.Tensor) -> th.Tensor:
        """``[B, NB, A]`` the online network's ensemble-mean quantile-mean at ``obs`` (no gradient; its
        fractions drawn from the model's generator)."""
        with th.no_grad():
            return _mean_values(self.q_net, obs, self._rand(obs.shape[0], self.policy.n_quantiles_act))

    def _within_step_targets(self, obs: th.Tensor, actions: th.Tensor, batch_size: int) -> (
        tuple[th.Tensor, th.Tensor]
    ):
        """Autoregressive branches' targets inside one time step (Metz et al. 2017): branch ``b < NB - 1``
        regresses on ``max_a Q_{b+1}(s, a_0 .. a_b, a)``, conditioned on the taken ``a_0 .. a_b``.

        The online network (no gradient) gives these values: a step has no discount and no reward between
        branches, and the target network would add one target-update lag per branch before the first branch
        saw the last one's value (3 lags for 4 branches; measured on the H200, the target network's version
        never left flat within 256k steps). Only the last branch's target crosses time steps, through the
        target network.

        :param obs: ``[B, D]`` the batch's observations.
        :param actions: ``[B, NB]`` the taken actions (the prefixes).
        :param batch_size: ``B``.
        :return: quantiles ``[E, B, NB - 1, N']`` and C51 logits ``[B, NB - 1, atoms]`` of branches
            ``1 .. NB - 1`` at their argmax.
        """
        policy = self.policy
        values = _mean_values_given(self.q_net, obs, self._rand(batch_size, policy.n_quantiles_act), actions)
        best = values.masked_fill(~self.valid_actions, -th.inf).argmax(dim=-1)  # [B, NB], given a_{<b}
        z, logits = self.q_net.taken_quantiles_and_logits(
            obs, self._rand(batch_size, policy.n_quantiles_target), best, prefix_actions=actions
        )
        return z[:, :, 1:].detach(), logits[:, 1:].detach()

    def _guarded_state(self, before_optimizer: bool = False) -> tuple[list[th.Tensor], list[str] | None]:
        """Everything a gradient step changes besides gradients, and the names: both networks' parameters,
        optimizer state, PopArt and GradVac buffers (``before_optimizer``: only what changes before the
        optimizer step, PopArt's statistics and rescaled layers and GradVac's buffers).

        :return: ``(tensors, names)`` (``before_optimizer``: names None).
        """
        popart = self.policy.popart
        if before_optimizer:  # no names: the guard looks them up when a message needs them
            rescaled = popart.rescaled_tensors() if popart is not None else []
            return [*rescaled, *(b.data for b in self.vaccine.buffers())], None
        vaccine = [(f"vaccine.{name}", b.data) for name, b in self.vaccine.named_buffers()]
        names = {id(p): name for name, p in self.policy.named_parameters()}
        optimizer_state = [
            (f"optimizer {names.get(id(param), '?')}.{key}", value)
            for param, per_param in self.policy.optimizer.state.items() for key, value in per_param.items()
            if isinstance(value, th.Tensor)
        ]
        popart_buffers = [(f"popart.{name}", b.data) for name, b in popart.named_buffers()] if popart else []
        # PopArt rescales the output layers of both networks
        params = [(f"q_net.{name}", p.data) for name, p in self.q_net.named_parameters()]
        params += [(f"q_net_target.{name}", p.data) for name, p in self.q_net_target.named_parameters()]
        # the optimizer's state last: it appears after the first step, and the earlier names keep their places
        named = params + popart_buffers + vaccine + optimizer_state
        return [t for _, t in named], [name for name, _ in named]

    def _rand(self, *shape: int) -> th.Tensor:
        """Uniform ``[0, 1)`` quantile fractions from the model's generator (a graphed step's static draws,
        drawn from it beforehand in the same order, while one runs)."""
        if self._rand_queue is not None:
            drawn = self._rand_queue.pop(0)
            if tuple(drawn.shape) != shape:
                raise RuntimeError(f"static draw of shape {tuple(drawn.shape)} where {shape} was drawn")
            return drawn
        return th.rand(shape, generator=self.generator, device=self.device)

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

    # ------------------------------------------------------------------ steps 1 and 6: the vaccine

    def vaccine_due(self, number: int, replay_buffer: Any) -> bool:
        """Whether gradient step ``number`` is a vaccine step (the buffer must sample stratified batches)."""
        return (
            self.vaccine_interval > 0
            and number % self.vaccine_interval == 0
            and hasattr(replay_buffer, "sample_stratified")
        )

    def sample_vaccine_batch(self, replay_buffer: Any, batch_size: int) -> Any:
        """The vaccine batch: ``batch_size`` rows stratified by the vaccine branch's action (an equal share of
        rows for each of its actions)."""
        branch = self.vaccine_branch
        return replay_buffer.sample_stratified(batch_size, branch, self.action_dims[branch])

    def vaccinate(self, params: list[nn.Parameter], batch: Any) -> tuple[th.Tensor, th.Tensor]:
        """GradVac: correct the main gradient (in ``params``' grads) with the vaccine ``batch``'s gradient.

        :param params: the online network's parameters, holding the main gradient.
        :param batch: the stratified vaccine batch (:meth:`sample_vaccine_batch`).
        :return: ``(cos, corrected)``: the gradients' cosine and whether the main one was corrected (0-dim).
        """
        g_main = flat_grad(params)
        self.policy.optimizer.zero_grad()
        # only the gradient is used: no loss values, no TD errors (same gradient)
        self.loss(batch, update_popart=False, values=False).per_sample.mean().backward()
        g_aux = flat_grad(params)
        g_new, cos, corrected = self.vaccine.correct(g_main, g_aux)
        assign_flat_grad(params, g_new)
        return cos, corrected

    # ------------------------------------------------------------------ the graphed step (cuda_graph=True)

    def _step_rand_shapes(self, batch_size: int) -> list[tuple[int, ...]]:
        """Shapes of a gradient step's generator draws, in the order :meth:`loss` draws them."""
        policy = self.policy
        counts: tuple[int, ...] = (policy.n_quantiles_act, policy.n_quantiles_target)
        if self.autoregressive:  # the within-step targets' two draws
            counts += (policy.n_quantiles_act, policy.n_quantiles_target)
        counts += (policy.n_quantiles,)
        return [(batch_size, n) for n in counts]

    def _vaccine_rand_shapes(self, batch_size: int) -> list[tuple[int, ...]]:
        """Shapes of a vaccine step's draws: the main batch's loss, then the vaccine batch's."""
        return 2 * self._step_rand_shapes(batch_size)

    def _graphable_step(
        self, batches: tuple[StaticBatch, ...], weights: th.Tensor, rands: list[th.Tensor]
    ) -> StepOutputs:
        """:meth:`step` on static tensors, the draws taken from ``rands``.

        :param batches: the static main batch, and for a vaccine step the static vaccine batch.
        :param weights: ``[B]`` static importance weights of the main batch.
        :param rands: the step's random fractions, in draw order (all are used).
        :return: the step's outputs.
        """
        self._rand_queue = rands
        try:
            outputs = self.step(batches[0], weights, batches[1] if len(batches) > 1 else None)
        finally:
            left, self._rand_queue = self._rand_queue, None
        if left:
            raise RuntimeError(f"{len(left)} static draws left unused: the loss draws other than expected")
        return outputs
