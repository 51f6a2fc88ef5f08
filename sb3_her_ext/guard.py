"""The NaN guard (``BranchingIQN(nan_guard=True)``): nothing non-finite is stored or learned.

Two checks, both cheap:

* **env data** (:meth:`NanGuard.check_env_arrays` on SB3's host path, :meth:`NanGuard.check_env_tensors` on
  training blocks): a non-finite reward or observation from an env is refused before it reaches the replay
  buffer, with an error naming the env index and the step;
* **the gradient step** (:meth:`NanGuard.snapshot` before it, :meth:`NanGuard.check_targets` and
  :meth:`NanGuard.check_popart` inside it, :meth:`NanGuard.optimizer_step` for its optimizer step): a
  non-finite target, loss or gradient norm stops training, and the step that met it changes nothing
  (parameters, optimizer state, PopArt statistics, GradVac's state).

Where a host read is free (``immediate``: the CPU), each check raises :class:`NonFiniteError` at once,
before anything is written. On a GPU a read would sync every step, so the checks are tensor ops that record
the first failure (its kind, step and env) in device flags, and :meth:`NanGuard.raise_if_tripped` reads
them at the next sync point: a diagnostics line, a device-loop flush, the end of ``learn`` and
``BranchingIQN.check_finite``. Between the failure and that point:

* the env rows of a failing step, and of every later step, are pushed with each non-finite value
  replaced by 0 (the push cannot skip rows without a sync), so the buffer never holds a non-finite value
  (per vector step: a max-norm per env of its reward and of its observations, ``nan_to_num``, the record);
* every gradient step is undone, so nothing learned after the failure counts and the data stored after it
  is never learned from. With an optimizer that skips a step on the device (:func:`skips_steps`: the fused
  Adam and AdamW, BranchingIQN's default, and any optimizer GradScaler drives the same way) the guard sets
  the optimizer's ``found_inf`` flag before ``optimizer.step()``, and the fused kernel leaves parameters,
  moments and step count alone; only the state that changed before the optimizer step (PopArt's statistics
  and rescaled layers, GradVac's buffers: a few small tensors) is snapshot and put back. Any other
  optimizer gets the full path: every parameter and optimizer tensor snapshot before the step and restored
  after it.

Both are exact: the same arithmetic and random draws as without the guard, and a restore that is bit for
bit (``t += (backup - t) * tripped`` on the tensors' bits as integers: three multi-tensor ops, whatever
the number of tensors). Per gradient step the skipping path costs a fixed handful of kernels, whatever the
model's size, all inside the graph with ``cuda_graph=True``: one multi-tensor copy (the snapshot), one
multi-tensor max-norm over the loss, the gradient norm, the small state and what the optimizer wrote
(parameters, moments), the record, the flag, the restore. The flag is
the guard's own tensor (the same one at every replay), set on the optimizer only for the call and removed
after it: it is never in the optimizer's state dict, a pickle or a step the guard does not drive.

Limits of the masked mode. The skipping path checks what an optimizer step wrote at the start of the next
step (and at the next sync point): a non-finite result of an optimizer step with finite gradients (an
overflow in the update itself, e.g. a parameter near the float limit) is recorded ("model state after the
optimizer step", kind 7), later steps are skipped, but that one step cannot be undone without the full
snapshot; the error then says so and names the step that made the state non-finite (with clipped, finite
gradients and a finite learning rate, which BranchingIQN checks on the host, Adam's update is bounded by
about the learning rate, so this needs parameters already near the float limit). The full path cannot
restore the optimizer state a step creates (its first step), and an optimizer's step count kept on the host
(a non-fused, non-capturable optimizer) still advances.

What the guard says is good it has checked: PopArt's new statistics are checked before they are written
(:meth:`NanGuard.check_popart`), the state a failing step changed is restored from the snapshot (on the
CPU only the part changed before the optimizer step: PopArt and GradVac), and when it raises it reads the
model's whole state (:meth:`NanGuard.watch`: parameters, optimizer moments, PopArt statistics) and names any
tensor that is not finite, with the gradient step that made it so, instead of calling it the last good one.
:func:`nonfinite_tensors` is the check ``BranchingIQN.save`` refuses a model with.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import torch as th

__all__ = [
    "NanGuard", "NonFiniteError", "named_state", "nonfinite_tensors", "refuse_nonfinite", "skips_steps",
]

#: failure kinds (0: none), as messages name them
_KINDS: dict[int, str] = {
    1: "reward",
    2: "observation",
    3: "target (reward + discounted next value)",
    4: "loss",
    5: "gradient",
    6: "PopArt statistics",
    7: "model state after the optimizer step",
    8: "model state before the optimizer step",
}
_REWARD, _OBSERVATION, _TARGET, _LOSS, _GRADIENT, _POPART, _STATE, _BEFORE = 1, 2, 3, 4, 5, 6, 7, 8
#: device codes of a failure of one multi-value check, with the index of its first non-finite value (the
#: kind is decoded on the host, :meth:`NanGuard._decode`): a gradient step's check, an env check
_CHECKED, _ENV = 9, 10
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


def skips_steps(optimizer: th.optim.Optimizer) -> bool:
    """Whether ``optimizer.step()`` skips the whole update on the device when the optimizer's ``found_inf``
    tensor is 1: the optimizers with ``_step_supports_amp_scaling`` (``fused=True`` Adam, AdamW, SGD, ...),
    whose kernels leave parameters, moments and step count alone then (the contract ``GradScaler`` uses).

    :param optimizer: the optimizer.
    :return: True when it does.
    """
    return bool(getattr(optimizer, "_step_supports_amp_scaling", False))


def _finite_flags(tensors: Sequence[th.Tensor]) -> th.Tensor:
    """``[len(tensors)]`` bool on the tensors' device: each tensor holds no NaN or inf (no sync)."""
    return th.stack(th._foreach_norm(list(tensors), float("inf"))) < th.inf  # a max-norm is NaN or >= 0


#: the integer type of each element size: a tensor's bits as integers (:func:`_bits`)
_INT_OF_SIZE = {1: th.int8, 2: th.int16, 4: th.int32, 8: th.int64}


def _bits(tensor: th.Tensor) -> th.Tensor:
    """``tensor``'s memory as integers of its element size (a view): arithmetic on them is exact for any
    value, NaN included."""
    return tensor.view(_INT_OF_SIZE[tensor.element_size()])


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
        #: ``[code, step, index]`` of the first failure (code 0: none yet; decoded by :meth:`_decode`)
        self.first = th.zeros(3, dtype=th.int64, device=self.device)
        #: gradient steps checked so far (counted on the device: a CUDA graph replay increments it too)
        self.steps = th.zeros((), dtype=th.int64, device=self.device)
        #: every code as a 0-dim device tensor (a record stacks one without a host-to-device copy)
        self._codes = th.arange(_ENV + 1, dtype=th.int64, device=self.device)
        #: 1.0 once a failure is recorded: the ``found_inf`` a skipping optimizer reads
        self._found_inf = th.zeros((), dtype=th.float32, device=self.device)
        #: the same as an int32 0/1: the factor of :meth:`_put_back_if_tripped` on float32 bits
        self._tripped_int = th.zeros((), dtype=th.int32, device=self.device)
        self._backup: list[th.Tensor] = []
        self._retired: list[list[th.Tensor]] = []
        #: the tensors of the last :meth:`snapshot` and their names
        self._state: list[th.Tensor] = []
        self._names: list[str] = []
        self._float_names: list[str] = []
        #: the snapshot's floating-point tensors the last gradient step's check saw before the optimizer step
        self._before: list[th.Tensor] = []
        #: the skipping optimizer the guard drove last (what it writes is checked at the next step)
        self._optimizer: th.optim.Optimizer | None = None
        #: rows of the last env check (its records index ``[reward rows, observation rows]``)
        self._env_rows = 0
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
        """Read the flags (a sync) and raise :class:`NonFiniteError` describing the first failure. With a
        skipping optimizer, what its last step wrote is checked first (the next step would check it)."""
        if self._optimizer is not None:
            self._record(_finite_flags(self._optimizer_output(self._optimizer)), _STATE, self.steps)
        kind, step, index = self._decode(*(int(v) for v in self.first.tolist()))
        if kind != 0:
            raise NonFiniteError(self._message(kind, step, index))

    def _decode(self, code: int, step: int, index: int) -> tuple[int, int, int]:
        """``(kind, step, index)`` of a record: an env check's index runs over ``[reward rows, observation
        rows]``; a gradient step's check's over the loss, the gradient norm, the snapshot state it checked,
        then what an optimizer step wrote (the previous one, or this one on the full path)."""
        if code == _ENV:
            rows = max(self._env_rows, 1)
            return (_REWARD, _OBSERVATION)[min(index // rows, 1)], step, index % rows
        if code != _CHECKED:
            return code, step, index
        if index < 2:
            return (_LOSS, _GRADIENT)[index], step, 0
        if index < 2 + len(self._before):
            return _BEFORE, step, index - 2
        # the skipping path checks an optimizer step's result at the next step; the full path after its own
        return _STATE, step - (self._optimizer is not None), index - 2 - len(self._before)

    def _state_name(self, kind: int, index: int) -> str:
        if kind == _POPART:
            return f"PopArt {_POPART_STATS[index]}"
        if kind == _STATE and self._optimizer is None:
            names = self._float_names
            return names[index] if 0 <= index < len(names) else f"state tensor {index}"
        tensors = self._before if kind == _BEFORE else self._optimizer_output(self._optimizer)
        named = {t.data_ptr(): name for name, t in self._watched()} if self._watched is not None else {}
        found = named.get(tensors[index].data_ptr()) if 0 <= index < len(tensors) else None
        return found or f"state tensor {index}"

    def _message(self, kind: int, step: int, env: int, value: Any = None) -> str:
        what = _KINDS[kind]
        shown = "" if value is None else f" {value!r}"
        if kind in _ENV_KINDS:
            return (f"non-finite {what}{shown} from env {env} at step {step} (num_timesteps): the step was "
                    "not learned from and nothing non-finite was stored; fix the env or its data")
        if kind in (_POPART, _STATE, _BEFORE):
            what = f"{what} ({self._state_name(kind, env)})"
        hint = "lower the learning rate or check the rewards' scale"
        if kind == _STATE and self._optimizer is not None:  # the skipping path: found after the update
            return (f"non-finite {what} at gradient step {step}: its gradients were finite, so the optimizer "
                    f"applied that step (a skipping optimizer cannot undo it), not the later ones; "
                    f"{self._vouch(step)}; {hint}")
        return (f"non-finite {what} at gradient step {step}: that step and any later ones were not applied; "
                f"{self._vouch(step - 1)}; {hint}")

    def _vouch(self, last_applied: int) -> str:
        """What the guard can say of the model's state now: read it (a sync) before calling it good.

        :param last_applied: the last gradient step applied (the one that made any non-finite state so).
        """
        bad = nonfinite_tensors(self._watched()) if self._watched is not None else []
        if not bad:
            checked = "checked finite" if self._watched is not None else "not checked"
            return f"parameters, optimizer moments and PopArt statistics are the last good ones ({checked})"
        # every earlier step passed the checks, so the state went bad in the last step that was applied
        self.went_bad = (bad, last_applied)
        return (f"but the model already holds non-finite values in {', '.join(bad[:3])}"
                f"{f' (+{len(bad) - 3} more)' if len(bad) > 3 else ''}, made so by gradient step "
                f"{last_applied}: it is not usable and BranchingIQN.save refuses it")

    def _record(self, finite: th.Tensor, code: int, step: th.Tensor | int) -> None:
        """Record ``(code, step, i)`` for the first False ``finite[i]``, unless all are True or a failure was
        recorded before (no sync).

        :param finite: ``[n]`` bool flags.
        :param code: what was checked (:meth:`_decode` reads the index with it).
        :param step: the step number (a host int, or a 0-dim int64 device tensor inside a CUDA graph).
        """
        all_finite, first_bad = finite.min(dim=0)  # min returns the index of the first minimum
        # th.full for a host int: a fill kernel, not a host-to-device copy (which would sync)
        step = step if isinstance(step, th.Tensor) else th.full((), step, dtype=th.int64, device=self.device)
        entry = th.stack([self._codes[code], step.to(th.int64).reshape(()), first_bad])
        th.where(all_finite < (self.first[0] == 0), entry, self.first, out=self.first)

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
        """The training blocks' path: check before the push.

        Immediate: raise :class:`NonFiniteError` (nothing is pushed). Else record the first bad
        ``(step, env)`` on the device and return the tensors with every non-finite value replaced by 0
        (:meth:`raise_if_tripped` reports it at the next sync point; the guard undoes every later gradient
        step): a max-norm per env of its reward and of its observations, and ``nan_to_num``.

        :param step: ``num_timesteps`` of the step (a 0-dim int64 device tensor inside a captured CUDA graph,
            where a host number would be frozen at its capture value).
        :param observations: ``[n_envs, D]`` tensors to check.
        :param rewards: ``[n_envs]`` rewards.
        :return: ``(observations, rewards)`` safe to push.
        """
        rows = rewards.shape[0]
        if self.immediate:
            reward_ok = th.isfinite(rewards).reshape(rows)
            if not bool(reward_ok.all()):
                env = int((~reward_ok).nonzero()[0])
                raise NonFiniteError(self._message(_REWARD, int(step), env, float(rewards.reshape(-1)[env])))
            for obs in observations:
                ok = th.isfinite(obs).reshape(rows, -1).all(dim=1)
                if not bool(ok.all()):
                    raise NonFiniteError(self._message(_OBSERVATION, int(step), int((~ok).nonzero()[0])))
            return list(observations), rewards
        # per env, the max-norm of its reward and of its observations: NaN or inf exactly where one is
        norms = [th.linalg.vector_norm(t.reshape(rows, -1), th.inf, dim=1) for t in (rewards, *observations)]
        obs_norm = functools.reduce(th.maximum, norms[1:]) if len(norms) > 1 else th.zeros_like(norms[0])
        self._env_rows = rows
        self._record((th.stack([norms[0], obs_norm]) < th.inf).reshape(-1), _ENV, step)
        safe_obs = [th.nan_to_num(obs, nan=0.0, posinf=0.0, neginf=0.0) for obs in observations]
        return safe_obs, th.nan_to_num(rewards, nan=0.0, posinf=0.0, neginf=0.0)

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
        nothing here: :meth:`optimizer_step` checks PopArt's buffers with the rest of the snapshot state and
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

    def snapshots_all(self, optimizer: th.optim.Optimizer) -> bool:
        """Whether :meth:`snapshot` takes all the state a step changes (the masked mode with an optimizer that
        cannot skip a step, :func:`skips_steps`), or only what changes before the optimizer step.

        :param optimizer: the step's optimizer.
        """
        return not self.immediate and not skips_steps(optimizer)

    def snapshot(self, tensors: Iterable[th.Tensor], names: Sequence[str] | None = None) -> list[th.Tensor]:
        """Copy the state a step changes (no sync; the copies are reused step after step): all of it when
        :meth:`snapshots_all`, else what changes before the optimizer step (PopArt, GradVac).

        :param tensors: parameters, optimizer state, PopArt and GradVac buffers (on the guard's device).
        :param names: their names, for messages (None: looked up in the watched state when needed).
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

    def optimizer_step(self, optimizer: th.optim.Optimizer, loss: th.Tensor, grad_norm: th.Tensor) -> None:
        """The gradient step's ``optimizer.step()``, guarded (after :meth:`snapshot`).

        Immediate: :meth:`check_step` raises before it. Masked, with an optimizer that :func:`skips_steps`:
        one check of the loss, the gradient norm, the snapshot state and what the previous optimizer step
        wrote; on a failure (this step's or an earlier one) the snapshot is put back and the optimizer's
        ``found_inf`` makes it skip the step on the device (the flag is the optimizer's only during the
        call). Masked, with another optimizer: the step, then :meth:`commit`. No sync in the masked mode.

        :param optimizer: the step's optimizer.
        :param loss: the step's loss.
        :param grad_norm: the gradients' total norm (``clip_grad_norm_``'s result).
        """
        if self.immediate:
            self.check_step(loss, grad_norm)
            optimizer.step()
            return
        if not skips_steps(optimizer):
            optimizer.step()
            self.commit(self._state, loss, grad_norm)
            return
        with th.no_grad():
            self.steps += 1
            self._before = [t for t in self._state if t.is_floating_point()]
            checked = [loss.detach(), grad_norm.detach(), *self._before, *self._optimizer_output(optimizer)]
            self._record(_finite_flags(checked), _CHECKED, self.steps)
            self._put_back_if_tripped()
        optimizer.found_inf = self._found_inf  # type: ignore[attr-defined]  # read by the fused kernel
        try:
            optimizer.step()
        finally:
            del optimizer.found_inf  # type: ignore[attr-defined]
        self._optimizer = optimizer

    @staticmethod
    def _optimizer_output(optimizer: th.optim.Optimizer) -> list[th.Tensor]:
        """What an optimizer step writes besides step counts: the parameters and their moments."""
        params = [p.detach() for group in optimizer.param_groups for p in group["params"]]
        return params + [value for state in optimizer.state.values() for value in state.values()
                         if isinstance(value, th.Tensor) and value.is_floating_point() and value.numel() > 1]

    def _put_back_if_tripped(self) -> None:
        """Set :attr:`_found_inf` from the flags and restore the last :meth:`snapshot` if a failure is
        recorded, bit for bit (no sync): on the tensors' bits, ``t += (backup - t) * tripped`` in wrapping
        integer arithmetic, exact for any value (NaN included), in three multi-tensor ops."""
        th.ne(self.first[0], 0, out=self._found_inf)
        if not self._state:
            return
        th.ne(self.first[0], 0, out=self._tripped_int)
        bits = [_bits(t) for t in self._state]
        delta = th._foreach_sub([_bits(b) for b in self._backup], bits)
        th._foreach_mul_(delta, self._tripped_int)
        th._foreach_add_(bits, delta)

    def commit(self, state: list[th.Tensor], loss: th.Tensor, grad_norm: th.Tensor) -> None:
        """Masked mode, the full path: keep the step's changes to ``state`` only if its loss, gradient norm
        and resulting state are finite and no failure was recorded before; else restore the snapshot and
        record the failure (no sync).

        :param state: :meth:`snapshot`'s result, now changed by the step.
        :param loss: the step's loss.
        :param grad_norm: the gradients' total norm.
        """
        with th.no_grad():
            self.steps += 1
            self._before = []
            # the state after the optimizer step: an overflow there passes the loss and gradient check
            checked = [loss.detach(), grad_norm.detach(), *(t for t in state if t.is_floating_point())]
            self._record(_finite_flags(checked), _CHECKED, self.steps)
            self._put_back_if_tripped()


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
