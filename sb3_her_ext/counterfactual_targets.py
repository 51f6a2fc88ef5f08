"""Counterfactual all-action targets: ``BranchingIQN(counterfactual=True)``'s gradient step.

On an env whose dynamics are exogenous to the agent (:mod:`sb3_her_ext.counterfactual`), the replay buffer
keeps each row's pre-step env state, and every action's outcome from it is exact. For each sampled row the
step then learns from ``K`` virtual transitions at once, on one of three faces:

* **joint** (``∏ n_b ≤ counterfactual_actions``): every joint action. With one branch each trains its
  action. With several, BDQ's branch heads are per-branch values: branch ``b``'s value ``v`` learns the
  target of the best joint action with ``v`` on ``b`` (the largest mean target ``r + γ·Z'`` among them),
  so the greedy branches together pick the joint argmax of the targets. (Training each head on every
  joint action would learn the marginals over the other branches' uniform choice: the miscoordination of
  independent branches, which on the tests' toy market held the greedy policy at 30 % of the optimum.)
* **branched** (several branches, more joint actions): per branch ``b`` and value ``v``, the joint action
  greedy on the other branches (the online network's argmax at ``s``) with ``v`` on ``b``, trained on
  ``b``'s head only (a per-branch loss mask);
* **sampled** (one branch of more than ``counterfactual_actions`` actions): that many actions drawn
  uniformly per row.

On the last two faces the logged action is one more virtual row with an all-zero mask: it trains nothing
and gives the priority's TD error. The env's
:meth:`~sb3_her_ext.counterfactual.CounterfactualEnv.counterfactual_step` gives each virtual transition's
reward, termination and next observation; the ``B·K`` transitions then go through the learner's own loss
(:meth:`~sb3_her_ext.learner.Learner.loss`: double-Q target, PopArt, IQN + C51, the ensemble) as one
expanded batch. The per-sample loss is the masked sum over the virtual rows divided by the number of
(branch, value) pairs trained, so the PER importance weights apply per replayed row; the priority is the
logged action's ``Σ_b |δ_b|``. No host sync and no Python loop over rows: it runs inside a captured
training block.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import torch as th

from sb3_her_ext.counterfactual import is_counterfactual_env
from sb3_her_ext.device_vec_env import is_device_vec_env
from sb3_her_ext.losses import DistributionalLoss
from sb3_her_ext.replay import PrioritizedHindsightReplayBuffer

#: default ``counterfactual_actions``: the joint face when the action space has at most this many actions
DEFAULT_JOINT_CAP = 128


class VirtualBatch(NamedTuple):
    """The ``B·K`` virtual transitions, in the replay samples' field names (what the loss reads)."""

    observations: th.Tensor
    actions: th.Tensor
    next_observations: th.Tensor
    dones: th.Tensor
    rewards: th.Tensor


class CounterfactualTargets:
    """Forms the all-action loss of a replayed batch (the module docstring).

    :param env: a callable returning the env (read at each step: a model can get its env after loading).
    :param action_dims: actions of each branch.
    :param cap: ``counterfactual_actions``: the joint face when ``∏ action_dims ≤ cap``, else the
        branched face (several branches) or ``cap`` sampled actions (one branch).
    :param device: the learner's device.
    """

    def __init__(self, env: Callable[[], Any], action_dims: list[int], cap: int, device: th.device) -> None:
        self._env = env
        self.action_dims = list(action_dims)
        n_branches, n_joint = len(action_dims), math.prod(action_dims)
        self.face = "joint" if n_joint <= cap else "branched" if n_branches > 1 else "sampled"
        if self.face == "joint":  # every joint action, the last branch fastest
            combos = list(itertools.product(*(range(n) for n in action_dims)))
            weights = th.ones(len(combos), n_branches)  # replaced by the best responses (_joint_weights)
            strides = [math.prod(action_dims[b + 1:]) for b in range(n_branches)]
            self.strides = th.tensor(strides, dtype=th.int64, device=device)
            n_trained = sum(action_dims)
        elif self.face == "branched":  # (branch, value) pairs, then the logged action with no weight
            combos = [(b, v) for b in range(n_branches) for v in range(action_dims[b])]
            weights = th.zeros(len(combos) + 1, n_branches)
            weights[th.arange(len(combos)), th.tensor([b for b, _ in combos])] = 1.0
            n_trained = len(combos)
        else:  # cap draws, then the logged action with no weight
            combos = []
            weights = th.cat([th.ones(cap, 1), th.zeros(1, 1)])
            n_trained = cap
        #: ``[K, NB]`` joint actions (joint face) or ``(branch, value)`` pairs (branched face)
        self.combos = th.tensor(combos, dtype=th.int64, device=device).reshape(len(combos), n_branches)
        #: ``[K', NB]`` each virtual row's weight per branch (``K' = K + 1`` with the logged row)
        self.branch_weights = weights.to(device)
        #: the (branch, value) pairs (or sampled actions) trained per replayed row: the loss's divisor
        self.n_trained = n_trained
        self.cap = cap

    @property
    def joint(self) -> bool:
        """Whether every joint action is evaluated."""
        return self.face == "joint"

    @property
    def env(self) -> Any:
        """The env that replays the rows (a ValueError naming its type unless it is a counterfactual env)."""
        env = self._env()
        if not is_counterfactual_env(env):
            raise ValueError(f"counterfactual=True needs an env implementing sb3_her_ext.counterfactual."
                             f"CounterfactualEnv; the model's env is a {type(env).__name__}")
        return env

    def actions(self, learner: Any, observations: th.Tensor, logged: th.Tensor) -> th.Tensor:
        """``[B, K', NB]`` int64 actions of the virtual transitions of each row.

        :param learner: the learner (its online network picks the other branches' greedy values; its
            generator draws the sampled face's actions).
        :param observations: ``[B, D]`` the rows' observations.
        :param logged: ``[B, NB]`` the logged actions.
        """
        batch = observations.shape[0]
        if self.face == "joint":
            return self.combos[None].expand(batch, -1, -1)
        if self.face == "sampled":
            drawn = (learner.uniforms(batch, self.cap) * self.action_dims[0]).long()
            drawn = drawn.clamp(max=self.action_dims[0] - 1)[:, :, None]  # [B, cap, 1]
        else:
            values = learner.mean_values(observations)  # [B, NB, A]
            greedy = values.masked_fill(~learner.valid_actions, -th.inf).argmax(dim=-1)  # [B, NB]
            branch, value = self.combos[:, 0], self.combos[:, 1]  # [K]
            own = branch[:, None] == th.arange(len(self.action_dims), device=branch.device)  # [K, NB]
            drawn = th.where(own[None], value[None, :, None], greedy[:, None, :])  # [B, K, NB]
        return th.cat([drawn, logged[:, None, :]], dim=1)

    def _joint_weights(self, target_means: th.Tensor) -> th.Tensor:
        """``[B·K, NB]`` the joint face's masks: branch ``b`` trains on the row of each of its values ``v``
        whose mean target is the largest among the joint actions with ``v`` on ``b`` (one branch: all).

        :param target_means: ``[B·K]`` each virtual row's mean target (any increasing map of it).
        """
        dims = self.action_dims
        grid = target_means.view(-1, *dims)  # [B, n_0, ..., n_{NB-1}]
        batch, columns = grid.shape[0], []
        for b in range(len(dims)):  # over branches (a few), not rows
            moved = grid.movedim(b + 1, 1)
            flat = moved.reshape(batch, dims[b], -1)  # [B, n_b, rest]
            columns_of_rest = th.arange(flat.shape[-1], device=flat.device)
            best = (columns_of_rest == flat.argmax(dim=-1, keepdim=True)).to(flat.dtype)  # one-hot
            columns.append(best.view(moved.shape).movedim(1, b + 1).reshape(-1))
        return th.stack(columns, dim=1)

    def loss(self, learner: Any, batch: Any, update_popart: bool = True) -> DistributionalLoss:
        """The all-action loss of ``batch`` (replay samples with ``counterfactual_states``).

        :param learner: the learner whose loss path forms the targets and losses.
        :param batch: replay samples; ``counterfactual_states`` ``[B, S]`` float64.
        :param update_popart: update PopArt from the virtual transitions' targets.
        :return: ``per_sample``, ``l_q``, ``l_c51`` ``[B]`` (masked sums over the virtual rows divided by
            :attr:`n_trained`) and the logged action's per-branch TD errors ``[B, NB]``.
        """
        observations = batch.observations
        batch_size, n_branches = observations.shape[0], len(self.action_dims)
        logged = batch.actions.long().reshape(batch_size, n_branches)
        actions = self.actions(learner, observations, logged)  # [B, K', NB]
        k = actions.shape[1]
        outcome = self.env.counterfactual_step(batch.counterfactual_states, actions)
        virtual = VirtualBatch(
            observations=observations[:, None, :].expand(-1, k, -1).reshape(batch_size * k, -1),
            actions=actions.reshape(batch_size * k, n_branches),
            next_observations=outcome.next_obs.reshape(batch_size * k, -1),
            dones=outcome.terminated.reshape(batch_size * k, 1).float(),
            rewards=outcome.reward.reshape(batch_size * k, 1).float(),
        )
        weights = self._joint_weights if self.joint else self.branch_weights.repeat(batch_size, 1)
        result = learner.loss(virtual, update_popart=update_popart, branch_weights=weights)

        def per_row(x: th.Tensor) -> th.Tensor:
            return x.view(batch_size, k).sum(dim=1) / self.n_trained

        assert result.td_abs is not None
        td_abs = result.td_abs.view(batch_size, k, n_branches)
        if self.joint:  # the logged action's row among the joint actions
            index = (logged * self.strides).sum(dim=1)
            td_logged = td_abs.gather(1, index[:, None, None].expand(-1, 1, n_branches)).squeeze(1)
        else:  # the extra last row
            td_logged = td_abs[:, -1]
        return DistributionalLoss(per_row(result.per_sample), per_row(result.l_q), per_row(result.l_c51),
                                  td_logged)


def configure(algorithm: Any) -> None:
    """``BranchingIQN(counterfactual=True)``'s setup, before the replay buffer is built: checks what it
    supports (a ValueError naming the rest), turns on the env's state recording, and asks the replay buffer
    to keep the states.

    :param algorithm: the :class:`~sb3_her_ext.algorithm.BranchingIQN` being set up.
    """
    cap = algorithm.counterfactual_actions
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise ValueError(f"counterfactual_actions={cap!r} must be an integer >= 1")
    if algorithm.hindsight_config is not None:
        raise ValueError("counterfactual=True does not support the plan's hindsight relabels (hindsight="
                         f"{algorithm.hindsight_config}): pass hindsight=False")
    if algorithm.policy_kwargs.get("branch_coupling", "independent") == "autoregressive":
        raise ValueError("counterfactual=True does not support branch_coupling='autoregressive'")
    buffer_class = algorithm.replay_buffer_class
    if buffer_class is None or not issubclass(buffer_class, PrioritizedHindsightReplayBuffer):
        raise ValueError(f"counterfactual=True needs the PrioritizedHindsightReplayBuffer, not "
                         f"replay_buffer_class={getattr(buffer_class, '__name__', buffer_class)}")
    env = algorithm.env
    if env is None:  # a model being loaded without an env: the saved buffer arguments hold the state width
        return
    if algorithm.cuda_graph and not is_device_vec_env(env):
        raise ValueError(f"counterfactual=True with cuda_graph=True needs a device vector env (its training "
                         f"blocks); the env is a {type(env).__name__}")
    enable(algorithm, env)


def enable(algorithm: Any, env: Any) -> None:
    """Check ``env`` is a counterfactual env (a ValueError naming its type), turn on its state recording and
    set the replay buffer's ``counterfactual_state_dim`` argument."""
    if not is_counterfactual_env(env):
        raise ValueError(f"counterfactual=True needs an env implementing sb3_her_ext.counterfactual."
                         f"CounterfactualEnv (its own class, not a wrapper); the env is a "
                         f"{type(env).__name__}")
    env.record_counterfactual_states(True)
    algorithm.replay_buffer_kwargs = {**algorithm.replay_buffer_kwargs,
                                      "counterfactual_state_dim": int(env.counterfactual_state_dim)}
