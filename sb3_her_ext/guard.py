"""The NaN guard (``BranchingIQN(nan_guard=True)``): nothing non-finite is stored or learned.

Two checks, both cheap:

* **env data** (:meth:`NanGuard.check_env_arrays` on SB3's host path, :meth:`NanGuard.check_env_tensors` on
  the device loop): a non-finite reward or observation from an env is refused before it reaches the replay
  buffer, with an error naming the env index and the step;
* **the gradient step** (:meth:`NanGuard.check_targets`, :meth:`NanGuard.check_step`, or the masked pair
  :meth:`NanGuard.snapshot` / :meth:`NanGuard.commit`): a non-finite target, loss or gradient norm stops
  training, and the step that met it changes nothing (parameters, optimizer state, PopArt statistics,
  GradVac's state).

Where a host read is free (``immediate``: the CPU), each check raises :class:`NonFiniteError` at once,
before anything is written. On a GPU a read would sync every step, so the checks are tensor ops that record
the first failure (its kind, step and env) in device flags, and :meth:`NanGuard.raise_if_tripped` reads
them at the next sync point: a diagnostics line, a device-loop flush, the end of ``learn`` and
``BranchingIQN.check_finite``. Between the failure and that point:

* the env rows of a failing step, and of every later step, are pushed with each non-finite value
  replaced by 0 (the push cannot skip rows without a sync), so the buffer never holds a non-finite value;
* every gradient step is undone: the guard snapshots the step's state before it and restores it with
  ``torch.where`` after it (exact; the same arithmetic and random draws as without the guard), so nothing
  learned after the failure counts, and the data stored after it is never learned from.

Limits of the masked mode: the optimizer state a step creates (its first step) cannot be restored, and an
optimizer's step count kept on the host (a non-fused, non-capturable optimizer) still advances; the
default fused Adam keeps it on the device. Its cost per step: one multi-tensor copy (the snapshot), one
multi-tensor max-norm (the state's finiteness after the optimizer step) and a ``torch.where`` per state
tensor (the restore), all inside the graph with ``cuda_graph=True``.

What the guard says is good it has checked: PopArt's new statistics are checked before they are written
(:meth:`NanGuard.check_popart`), the state a failing step changed is restored from the snapshot (on the
CPU only the part changed before the optimizer step: PopArt and GradVac), and when it raises it reads the
model's whole state (:meth:`NanGuard.watch`: parameters, optimizer moments, PopArt statistics) and names any
tensor that is not finite, with the gradient step that made it so, instead of calling it the last good one.
:func:`nonfinite_tensors` is the check ``BranchingIQN.save`` refuses a model with.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import torch as th

__all__ = ["NanGuard", "NonFiniteError", "named_state", "nonfinite_tensors", "refuse_nonfinite"]

#: failure kinds recorded in the device flag (0: none)
_KINDS: dict[int, str] = {
    1: "reward",
    2: "observation",
    3: "target (reward + discounted next value)",
    4: "loss",
    5: "gradient",
    6: "PopArt statistics",
    7: "model state after the optimizer step",
}
_REWARD, _OBSERVATION, _TARGET, _LOSS, _GRADIENT, _POPART, _STATE = 1, 2, 3, 4, 5, 6, 7
#: names of PopArt's statistics, in the order :meth:`NanGuard.check_popart` takes them
_POPART_STATS = ("mu", "nu", "sigma")
_ENV_KINDS = (_REWARD, _OBSERVATION)


class NonFiniteError(ValueError, FloatingPointError):
    """A NaN or inf in training data or in a gradient step; training stopped, the last good state kept."""


def named_state(module: th.nn.Module, optimizer: th.optim.Optimizer | None = None) -> (
    list[tuple[str, th.Tensor]]
):
    """A model's floating-point state by name: parameters, buffers (PopArt's statistics, normalizers) and the
    optimizer's per-parameter tensors (``optimizer <param>.exp_avg``, ...).

    :param module: the policy (its parameters and buffers).
    :param optimizer: its optimizer (None: left out).
    :return: ``(name, tensor)`` pairs.
    """
    named = [(name, p.data) for name, p in module.named_parameters()]
    named += [(name, b) for name, b in module.named_buffers() if b.is_floating_point()]
    if optimizer is not None:
        names = {id(p): name for name, p in module.named_parameters()}
        for param, per_param in optimizer.state.items():
            for key, value in per_param.items():
                if isinstance(value, th.Tensor) and value.is_floating_point() and value.numel() > 1:
                    named.append((f"optimizer {names.get(id(param), '?')}.{key}", value))
    return named


def _finite_flags(tensors: Sequence[th.Tensor]) -> th.Tensor:
    """``[len(tensors)]`` bool on the tensors' device: each tensor holds no NaN or inf (no sync)."""
    return th.stack(th._foreach_norm(list(tensors), float("inf"))).isfinite()


def nonfinite_tensors(named: Sequence[tuple[str, th.Tensor]]) -> list[str]:
    """The names of the tensors that hold a NaN or inf (one read of the device).

    :param named: ``(name, tensor)`` pairs (:func:`named_state`).
    :return: the names, in order.
    """
    named = [(name, t) for name, t in named if t.is_floating_point() and t.numel() > 0]
    if not named:
        return []
    by_device: dict[th.device, list[int]] = {}
    for index, (_, tensor) in enumerate(named):
        by_device.setdefault(tensor.device, []).append(index)
    ok = [True] * len(named)
    for indices in by_device.values():
        for index, flag in zip(indices, _finite_flags([named[i][1] for i in indices]).tolist(), strict=True):
            ok[index] = flag
    return [name for (name, _), flag in zip(named, ok, strict=True) if not flag]


def _first_bad(values: np.ndarray) -> tuple[int, Any] | None:
    """``(env, value)`` of the first env whose row of ``values`` holds a non-finite value, else None."""
    rows = np.asarray(values, dtype=np.float64).reshape(len(values), -1)
    bad = ~np.isfinite(rows).all(axis=1)
    if not bad.any():
        return None
    env = int(np.argmax(bad))
    row = rows[env]
    return env, float(row[~np.isfinite(row)][0])


class NanGuard:
    """Device flags of the first non-finite value met in training, and the checks that set them.

    :param device: the model's device.
    :param immediate: raise at once (a host read per check); default: on the CPU only.
    """

    def __init__(self, device: th.device | str, immediate: bool | None = None) -> None:
        self.device = th.device(device)
        self.immediate = self.device.type == "cpu" if immediate is None else bool(immediate)
        #: ``[kind, step, env]`` of the first failure (kind 0: none yet)
        self.first = th.zeros(3, dtype=th.int64, device=self.device)
        #: gradient steps checked so far (counted on the device: a CUDA graph replay increments it too)
        self.steps = th.zeros((), dtype=th.int64, device=self.device)
        self._backup: list[th.Tensor] = []
        self._retired: list[list[th.Tensor]] = []
        #: the tensors of the last :meth:`snapshot` and their names
        self._state: list[th.Tensor] = []
        self._names: list[str] = []
        #: the model's whole named state, read when the guard raises (:meth:`watch`)
        self._watched: Callable[[], Sequence[tuple[str, th.Tensor]]] | None = None
        #: ``(tensor names, gradient step)`` of model state found non-finite when the guard raised
        self.went_bad: tuple[list[str], int] | None = None

    def watch(self, named_state: Callable[[], Sequence[tuple[str, th.Tensor]]]) -> None:
        """The model state the guard vouches for when it raises (read then, and only then).

        :param named_state: returns ``(name, tensor)`` pairs: parameters, optimizer moments, PopArt buffers.
        """
        self._watched = named_state

    # ------------------------------------------------------------------ reading the flags

    @property
    def tripped(self) -> th.Tensor:
        """0-dim bool tensor: a failure has been recorded (no sync)."""
        return self.first[0] != 0

    def raise_if_tripped(self) -> None:
        """Read the flags (a sync) and raise :class:`NonFiniteError` describing the first failure."""
        kind, step, env = (int(v) for v in self.first.tolist())
        if kind != 0:
            raise NonFiniteError(self._message(kind, step, env))

    def _state_name(self, kind: int, index: int) -> str:
        if kind == _POPART:
            return f"PopArt {_POPART_STATS[index]}"
        names = getattr(self, "_float_names", [])
        return names[index] if 0 <= index < len(names) else f"state tensor {index}"

    def _message(self, kind: int, step: int, env: int, value: Any = None) -> str:
        what = _KINDS[kind]
        shown = "" if value is None else f" {value!r}"
        if kind in _ENV_KINDS:
            return (f"non-finite {what}{shown} from env {env} at step {step} (num_timesteps): the step was "
                    "not learned from and nothing non-finite was stored; fix the env or its data")
        if kind in (_POPART, _STATE):
            what = f"{what} ({self._state_name(kind, env)})"
        return (f"non-finite {what} at gradient step {step}: that step and any later ones were not applied; "
                f"{self._vouch(step)}; lower the learning rate or check the rewards' scale")

    def _vouch(self, step: int) -> str:
        """What the guard can say of the model's state now: read it (a sync) before calling it good."""
        bad = nonfinite_tensors(self._watched()) if self._watched is not None else []
        if not bad:
            checked = "checked finite" if self._watched is not None else "not checked"
            return f"parameters, optimizer moments and PopArt statistics are the last good ones ({checked})"
        # every earlier step passed the checks, so the state went bad in the last step that was applied
        self.went_bad = (bad, step - 1)
        return (f"but the model already holds non-finite values in {', '.join(bad[:3])}"
                f"{f' (+{len(bad) - 3} more)' if len(bad) > 3 else ''}, made so by gradient step {step - 1}: "
                "it is not usable and BranchingIQN.save refuses it")

    def _record(self, bad: th.Tensor, kind: int, step: th.Tensor | int, env: th.Tensor | int) -> None:
        """Record ``(kind, step, env)`` where ``bad`` and nothing was recorded before (no sync)."""
        # th.full for host ints: a fill kernel, not a host-to-device copy (which would sync)
        entry = th.stack([v.to(th.int64).reshape(()) if isinstance(v, th.Tensor)
                          else th.full((), v, dtype=th.int64, device=self.device) for v in (kind, step, env)])
        self.first.copy_(th.where(bad & (self.first[0] == 0), entry, self.first))

    # ------------------------------------------------------------------ env data

    def check_env_arrays(self, step: int, observations: Sequence[Any], rewards: Any) -> None:
        """SB3's host path: raise :class:`NonFiniteError` for a non-finite reward or observation.

        :param step: ``num_timesteps`` of the step.
        :param observations: ``[n_envs, ...]`` arrays to check (next observations, terminal observations).
        :param rewards: ``[n_envs]`` rewards.
        """
        found = _first_bad(np.asarray(rewards).reshape(-1, 1))
        if found is not None:
            raise NonFiniteError(self._message(_REWARD, step, found[0], found[1]))
        for obs in observations:
            found = _first_bad(np.asarray(obs))
            if found is not None:
                raise NonFiniteError(self._message(_OBSERVATION, step, found[0], found[1]))

    def check_env_tensors(self, step: int | th.Tensor, observations: Sequence[th.Tensor],
                          rewards: th.Tensor) -> tuple[list[th.Tensor], th.Tensor]:
        """The device loop's path: check before the push.

        Immediate: raise :class:`NonFiniteError` (nothing is pushed). Else record the first bad
        ``(step, env)`` on the device and return the tensors with every non-finite value replaced by 0
        (:meth:`raise_if_tripped` reports it at the next sync point; the guard undoes every later gradient
        step).

        :param step: ``num_timesteps`` of the step (a 0-dim int64 device tensor inside a captured CUDA graph,
            where a host number would be frozen at its capture value).
        :param observations: ``[n_envs, D]`` tensors to check.
        :param rewards: ``[n_envs]`` rewards.
        :return: ``(observations, rewards)`` safe to push.
        """
        reward_ok = th.isfinite(rewards).reshape(rewards.shape[0])
        obs_ok = [th.isfinite(obs).reshape(obs.shape[0], -1).all(dim=1) for obs in observations]
        if self.immediate:
            if not bool(reward_ok.all()):
                env = int((~reward_ok).nonzero()[0])
                raise NonFiniteError(self._message(_REWARD, int(step), env, float(rewards.reshape(-1)[env])))
            for ok in obs_ok:
                if not bool(ok.all()):
                    raise NonFiniteError(self._message(_OBSERVATION, int(step), int((~ok).nonzero()[0])))
            return list(observations), rewards
        all_obs_ok = th.stack(obs_ok).all(dim=0) if obs_ok else th.ones_like(reward_ok)
        for ok, kind in ((reward_ok, _REWARD), (all_obs_ok, _OBSERVATION)):
            self._record(~ok.all(), kind, step, (~ok).to(th.int64).argmax())
        zero = th.zeros((), dtype=rewards.dtype, device=rewards.device)
        safe_obs = [th.where(th.isfinite(obs), obs, th.zeros((), dtype=obs.dtype, device=obs.device))
                    for obs in observations]
        return safe_obs, th.where(th.isfinite(rewards), rewards, zero)

    # ------------------------------------------------------------------ the gradient step

    def check_targets(self, targets: th.Tensor) -> None:
        """Immediate only: raise before PopArt's update when the step's targets are non-finite.

        :param targets: the de-normalised targets ``y``.
        """
        if self.immediate and not bool(th.isfinite(targets).all()):
            raise NonFiniteError(self._message(_TARGET, int(self.steps) + 1, 0))

    def check_popart(self, mu: th.Tensor, nu: th.Tensor, sigma: th.Tensor) -> None:
        """PopArt's new statistics, before they are written (:meth:`PopArt.update`'s ``check``): immediate,
        raise :class:`NonFiniteError` naming the first non-finite one (nothing has changed yet). Masked,
        nothing here: :meth:`commit` checks PopArt's buffers with the rest of the state after the step and
        restores them.

        :param mu: the new first moment.
        :param nu: the new second moment.
        :param sigma: the new scale.
        """
        if not self.immediate:
            return
        if not bool(th.isfinite(mu * 0.0 + nu * 0.0 + sigma * 0.0)):  # x * 0 is NaN exactly for NaN and inf
            finite = [bool(th.isfinite(v)) for v in (mu, nu, sigma)]
            raise NonFiniteError(self._message(_POPART, int(self.steps) + 1, finite.index(False)))

    def restore(self) -> None:
        """Put the last :meth:`snapshot` back (no sync)."""
        if self._state:
            th._foreach_copy_(self._state, self._backup)

    def check_step(self, loss: th.Tensor, grad_norm: th.Tensor) -> None:
        """Immediate only: raise before the optimizer step for a non-finite loss or gradient norm, after
        restoring what the step changed so far (the last :meth:`snapshot`: PopArt, GradVac).

        :param loss: the step's loss.
        :param grad_norm: the gradients' total norm (``clip_grad_norm_``'s result).
        """
        if not self.immediate:
            return
        step = int(self.steps) + 1
        for value, kind in ((loss, _LOSS), (grad_norm, _GRADIENT)):
            if not bool(th.isfinite(value)):
                self.restore()
                raise NonFiniteError(self._message(kind, step, 0))
        self.steps += 1

    def snapshot(self, tensors: Iterable[th.Tensor], names: Sequence[str] | None = None) -> list[th.Tensor]:
        """Copy the state a step changes (no sync; the copies are reused step after step): masked mode, all
        of it; immediate mode, what changes before the optimizer step (PopArt, GradVac).

        :param tensors: parameters, optimizer state, PopArt and GradVac buffers (on the guard's device).
        :param names: their names, for messages.
        :return: the tensors, in the order :meth:`commit` expects them.
        """
        # device types, not devices ("cuda" != "cuda:0"); a host tensor (a non-fused optimizer's step count)
        # is left out: a skipped step still advances it
        tensors = list(tensors)
        kept = [i for i, t in enumerate(tensors) if t.device.type == self.device.type]
        state = [tensors[i] for i in kept]
        self._names = [names[i] for i in kept] if names is not None else [f"state tensor {i}" for i in kept]
        if [(b.shape, b.dtype) for b in self._backup] != [(t.shape, t.dtype) for t in state]:
            # the old copies stay alive: a captured CUDA graph may still write to them
            self._retired.append(self._backup)
            self._backup = [th.empty_like(t) for t in state]
        if state:
            th._foreach_copy_(self._backup, state)  # one multi-tensor launch where the device has one
        self._state = state
        #: names of the floating-point tensors of ``state``, the ones :meth:`commit` checks, in order
        self._float_names = [name for name, t in zip(self._names, state, strict=True)
                             if t.is_floating_point()]
        return state

    def commit(self, state: list[th.Tensor], loss: th.Tensor, grad_norm: th.Tensor) -> None:
        """Masked mode: keep the step's changes to ``state`` only if its loss and gradient norm are finite
        and no failure was recorded before; else restore the snapshot and record the failure (no sync).

        :param state: :meth:`snapshot`'s result, now changed by the step.
        :param loss: the step's loss.
        :param grad_norm: the gradients' total norm.
        """
        self.steps += 1
        loss_ok, grad_ok = th.isfinite(loss).reshape(()), th.isfinite(grad_norm).reshape(())
        self._record(~loss_ok, _LOSS, self.steps, 0)
        self._record(loss_ok & ~grad_ok, _GRADIENT, self.steps, 0)
        floats = [t for t in state if t.is_floating_point()]
        if floats:  # the state after the optimizer step: an overflow there passes the loss and gradient check
            finite = _finite_flags(floats)
            self._record(~finite.all(), _STATE, self.steps, (~finite).to(th.int64).argmax())
        keep = ~self.tripped
        for tensor, backup in zip(state, self._backup, strict=True):
            tensor.copy_(th.where(keep, tensor, backup))


def refuse_nonfinite(named: Sequence[tuple[str, th.Tensor]], guard: NanGuard | None, gradient_steps: int,
                     action: str = "save") -> None:
    """Raise :class:`NonFiniteError` when a tensor of ``named`` holds a NaN or inf, naming the tensors and
    the gradient step the state went bad (as far as the guard knows it).

    :param named: the model's named state (:func:`named_state`).
    :param guard: the model's NaN guard (None: it ran without one).
    :param gradient_steps: gradient steps the model has taken.
    :param action: what is refused, for the message.
    """
    bad = nonfinite_tensors(named)
    if not bad:
        return
    shown = ", ".join(bad[:3]) + (f" (+{len(bad) - 3} more)" if len(bad) > 3 else "")
    if guard is not None and guard.went_bad is not None:
        when = f"it went bad at gradient step {guard.went_bad[1]}"
    elif guard is None:
        when = (f"the NaN guard was off (nan_guard=False), so the step it went bad is unknown: found after "
                f"gradient step {gradient_steps}")
    else:
        when = (f"every gradient step the NaN guard checked left it finite: it changed outside training, "
                f"found after gradient step {gradient_steps}")
    raise NonFiniteError(f"refusing to {action} a model with non-finite values in {shown}; {when}")
