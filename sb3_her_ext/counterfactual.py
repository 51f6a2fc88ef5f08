"""The counterfactual env protocol: an env whose stored transitions can be replayed for any action.

Where an env's dynamics are exogenous to the agent (foxenv's replayed market does not depend on the agent's
orders, and a step draws no random numbers), the outcome of *every* action from a stored state is exactly
computable after the fact. An env that says so implements :class:`CounterfactualEnv`:

* after :meth:`CounterfactualEnv.record_counterfactual_states`, each step's ``infos`` carry
  :data:`STATE_KEY`: ``[N, S]`` float64, each env's state *before* that step (what the replay buffer stores
  beside the row, so the learner can replay the row's state later); off by default, as it costs a copy of
  the state per step;
* :meth:`CounterfactualEnv.counterfactual_step`: for ``B`` stored states and ``K`` actions each, the
  next observation, reward and termination each action gives (``[B, K, ...]``), on the learner's device,
  with no host sync, so it can run inside a captured training block.

``BranchingIQN`` then forms, for every replayed state, the distributional double-Q target of each of the
``K`` actions from that action's own reward and next state, in the same gradient step. ``sb3_her_ext``
never imports an env package: ``foxhunt``'s device LOB env is one implementation, the tests' toy env
another. Like :mod:`sb3_her_ext.device_vec_env`, the protocol is duck-typed; test with
:func:`is_counterfactual_env`.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol, runtime_checkable

import torch

#: Info key of each env's state before the step: ``[N, S]`` float64 (``S`` = ``counterfactual_state_dim``).
STATE_KEY = "counterfactual_state"


class CounterfactualOutcome(NamedTuple):
    """What :meth:`CounterfactualEnv.counterfactual_step` returns for ``B`` states and ``K`` actions each.

    :param next_obs: ``[B, K, D]`` float32, the observation the action leads to, as the agent would have seen
        it (before any autoreset: the transition's next observation).
    :param reward: ``[B, K]`` float32.
    :param terminated: ``[B, K]`` bool: the episode ended by the env's own rule (no bootstrap). A time-limit
        truncation is not a termination (SB3's ``handle_timeout_termination``).
    """

    next_obs: torch.Tensor
    reward: torch.Tensor
    terminated: torch.Tensor


@runtime_checkable
class CounterfactualEnv(Protocol):
    """An env whose transitions can be replayed for any action (see the module docstring).

    :ivar counterfactual_state_dim: ``S``, the width of a stored state (float64 numbers).
    """

    counterfactual_state_dim: int

    def record_counterfactual_states(self, record: bool = True) -> None:
        """From the next step on, put (or stop putting) :data:`STATE_KEY` in each step's infos."""
        ...

    def counterfactual_step(self, states: torch.Tensor, actions: torch.Tensor) -> CounterfactualOutcome:
        """Every given action's outcome from every stored state.

        :param states: ``[B, S]`` float64 states as the env put them in its infos under :data:`STATE_KEY`.
        :param actions: ``[B, K, NB]`` int64 actions in the agent's action space (``NB`` = 1 for
            ``Discrete``), on the same device as ``states``.
        :return: the outcomes, ``[B, K, ...]``, on the same device.
        """
        ...


def is_counterfactual_env(env: Any) -> bool:
    """Whether ``env`` itself (not a wrapper forwarding attributes) implements :class:`CounterfactualEnv`.

    A wrapper that changes observations or rewards (``VecNormalize``) would make the env's outcomes differ
    from what the agent sees, so only the env's own class counts.
    """
    return callable(getattr(type(env), "counterfactual_step", None)) and isinstance(
        getattr(env, "counterfactual_state_dim", None), int
    )
