"""Training diagnostics: device-side accumulators, read once per interval into JSONL and SB3's logger.

The train step and action selection add tensors to running sums on the device (no host sync). Every
``diagnostics_interval`` environment steps the algorithm calls :meth:`TrainingDiagnostics.flush`, the
only place these counters are read. One JSON object per line goes to ``diagnostics_path``, and the same
scalars (nested keys joined with ``/`` under ``diagnostics/``) go to SB3's logger.

Keys of every line (see :data:`DIAGNOSTICS_KEYS`): ``step``, ``time``, ``fps``, ``n_updates``,
``l_q`` (IQN loss), ``l_c51`` (C51 loss), ``loss`` (the mixed loss), ``eps`` (per branch),
``action_mix`` (per branch, the fraction of each action taken), ``iqr_mean``, ``ens_std``,
``popart_mu``, ``popart_sigma``, ``per`` (``size``, ``max_priority``, ``mean_weight``, ``beta``),
``hindsight`` (``backward``, ``forward``, ``relabel`` counts in the interval, ``threshold``,
``priority_boost``), ``vaccine`` (``cos``, ``corrections``), ``iqr_bonus``, ``ep_rew_mean``.

Non-finite numbers in a line: a mean with nothing to average in the interval (no gradient step, no vaccine
step, no action selection) is ``null``; a value that is itself non-finite (a NaN loss) is written as the
string ``"nan"``, ``"inf"`` or ``"-inf"``, so that it is never mistaken for a missing value
(:func:`read_diagnostics` turns those strings back into floats). The returned record holds NaN for both.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch as th
from stable_baselines3.common.logger import Logger

#: Top-level keys of every diagnostics line.
DIAGNOSTICS_KEYS: tuple[str, ...] = (
    "step",
    "time",
    "fps",
    "n_updates",
    "l_q",
    "l_c51",
    "loss",
    "eps",
    "action_mix",
    "iqr_mean",
    "ens_std",
    "popart_mu",
    "popart_sigma",
    "per",
    "hindsight",
    "vaccine",
    "iqr_bonus",
    "ep_rew_mean",
)
#: Keys of the ``hindsight`` block.
HINDSIGHT_KEYS: tuple[str, ...] = ("backward", "forward", "relabel", "threshold", "priority_boost")


class TrainingDiagnostics:
    """Running sums on the device, flushed to a JSONL file and SB3's logger at log points.

    :param path: JSONL file to append to (``None``: logger only). Its folder is created.
    :param action_dims: number of actions of each branch.
    :param branch_names: one name per branch, used as keys of ``eps`` and ``action_mix``.
    :param device: device of the accumulators.
    """

    _TRAIN_KEYS: tuple[str, ...] = ("l_q", "l_c51", "loss", "mean_weight", "vaccine_cos")
    _SELECT_KEYS: tuple[str, ...] = ("iqr_mean", "ens_std")

    def __init__(
        self,
        path: str | Path | None,
        action_dims: list[int],
        branch_names: list[str],
        device: th.device | str = "cpu",
    ) -> None:
        if len(action_dims) != len(branch_names):
            raise ValueError(f"branch_names has {len(branch_names)} names for {len(action_dims)} branches")
        self.path = Path(path) if path is not None else None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self.action_dims = list(action_dims)
        self.branch_names = list(branch_names)
        self.device = th.device(device)
        self._last_time = time.time()
        self._last_step = 0
        self._last_hindsight: dict[str, int] = {}
        self.reset()

    def reset(self) -> None:
        """Zero every accumulator (called after each flush).

        The device accumulators are zeroed in place after their first allocation: a captured CUDA graph
        (:mod:`sb3_her_ext.collect.block`) keeps adding to the same tensors.
        """
        if not hasattr(self, "_train_sums"):
            # one tensor each, so that a train step adds to them in one op: sums in _TRAIN_KEYS order,
            # counts of train steps, vaccine steps and vaccine corrections
            self._train_sums = th.zeros(len(self._TRAIN_KEYS), dtype=th.float64, device=self.device)
            self._train_counts = th.zeros(3, dtype=th.int64, device=self.device)
            # the selection sums in one tensor (one add per selection; by key: _select_sums)
            self._select_pair = th.zeros(len(self._SELECT_KEYS), dtype=th.float64, device=self.device)
            self._select_count = th.zeros((), dtype=th.int64, device=self.device)
        else:
            for tensor in self.device_tensors():
                tensor.zero_()
        self._action_counts = [np.zeros(n, dtype=np.int64) for n in self.action_dims]

    @property
    def _select_sums(self) -> dict[str, th.Tensor]:
        """The selection sums by key (views of one tensor)."""
        return {key: self._select_pair[i] for i, key in enumerate(self._SELECT_KEYS)}

    @_select_sums.setter
    def _select_sums(self, sums: dict[str, th.Tensor]) -> None:  # a saved state that kept them apart
        self._select_pair = th.stack([th.as_tensor(sums[key], dtype=th.float64) for key in self._SELECT_KEYS])

    def device_tensors(self) -> tuple[th.Tensor, ...]:
        """The device accumulators (a captured graph adds to them: the same tensors for the model's life)."""
        return (self._train_sums, self._train_counts, self._select_pair, self._select_count)

    def restart(self, step: int, hindsight_totals: dict[str, Any] | None = None) -> None:
        """Start a new interval at ``step`` (the start of ``learn``): rates and hindsight counts of the next
        line then cover only this run, also after ``reset_num_timesteps`` or a ``load``.

        :param step: the algorithm's ``num_timesteps`` when the run starts.
        :param hindsight_totals: the replay's cumulative hindsight counts by kind now (read here: a sync).
        """
        self._last_time = time.time()
        self._last_step = int(step)
        self._last_hindsight = {k: int(v) for k, v in (hindsight_totals or {}).items()}

    def add_train_step(
        self, l_q: th.Tensor, l_c51: th.Tensor, loss: th.Tensor, mean_weight: th.Tensor
    ) -> None:
        """Add one gradient step's losses and mean importance weight (0-dim tensors, no sync).

        :param l_q: IQN loss.
        :param l_c51: C51 loss.
        :param loss: the mixed loss.
        :param mean_weight: mean PER importance weight of the batch.
        """
        values = th.stack((l_q.detach(), l_c51.detach(), loss.detach(), mean_weight.detach()))
        self._train_sums[:4] += values.to(self.device, th.float64)  # l_q, l_c51, loss, mean_weight
        self._train_counts[0] += 1

    def add_vaccine(self, cos: th.Tensor, corrected: th.Tensor) -> None:
        """Add one vaccine step's cosine and whether it corrected the gradient (0-dim tensors).

        :param cos: cosine between the main and the vaccine gradients.
        :param corrected: whether GradVac changed the main gradient.
        """
        self._train_sums[4] += cos.detach().to(self.device, th.float64)  # vaccine_cos
        self._train_counts[1] += 1
        self._train_counts[2] += corrected.detach().to(self.device, th.int64)

    def add_selection(self, iqr: th.Tensor, ens_std: th.Tensor, valid: th.Tensor) -> None:
        """Add the mean IQR and ensemble std over the valid actions of one action selection.

        :param iqr: ``[B, NB, A]`` IQRs.
        :param ens_std: ``[B, NB, A]`` ensemble standard deviations.
        :param valid: ``[NB, A]`` bool mask of the actions that exist (those of :attr:`action_dims`).
        """
        n_valid = sum(self.action_dims) * iqr.shape[0]  # a host number: no kernels per selection
        if min(self.action_dims) != max(self.action_dims):  # padded actions: masked out of the sums
            iqr, ens_std = iqr * valid, ens_std * valid
        self._select_pair += th.stack([iqr.sum(), ens_std.sum()]).to(self.device, th.float64) / n_valid
        self._select_count += 1

    def add_actions(self, actions: np.ndarray) -> None:
        """Count the actions taken in the environments (host arrays, as SB3 stores them).

        :param actions: ``[n_envs, NB]`` or ``[n_envs]`` (one branch) actions.
        """
        actions = np.asarray(actions).reshape(-1, len(self.action_dims))
        for b, n in enumerate(self.action_dims):
            self._action_counts[b] += np.bincount(actions[:, b].astype(np.int64), minlength=n)[:n]

    def add_action_counts(self, counts: Sequence[Any]) -> None:
        """Add counts of actions taken, per branch (e.g. counted on the device and read at a flush).

        :param counts: one array per branch, of length its number of actions.
        """
        if len(counts) != len(self.action_dims):
            raise ValueError(f"counts has {len(counts)} branches: expected {len(self.action_dims)}")
        for b, n in enumerate(self.action_dims):
            branch = np.asarray(counts[b], dtype=np.int64).reshape(-1)
            if branch.shape[0] != n:
                raise ValueError(f"counts[{b}] has {branch.shape[0]} actions: expected {n}")
            self._action_counts[b] += branch

    def flush(self, step: int, logger: Logger | None = None, **extra: Any) -> dict[str, Any]:
        """Read the accumulators (the one host sync), write one JSONL line and the logger scalars, reset.

        :param step: the algorithm's ``num_timesteps``.
        :param logger: SB3 logger to record the scalars in (not dumped here).
        :param extra: values read by the algorithm at this log point: ``eps`` (list per branch),
            ``popart_mu``, ``popart_sigma``, ``per`` (dict), ``hindsight_totals`` (cumulative counts by
            kind), ``threshold``, ``priority_boost``, ``iqr_bonus``, ``ep_rew_mean``, ``n_updates``.
        :return: the record written.
        """
        now = time.time()
        elapsed = max(now - self._last_time, 1e-9)
        n_train, n_vaccine, n_corrections = self._train_counts.tolist()
        n_select = int(self._select_count)
        train_sums = dict(zip(self._TRAIN_KEYS, self._train_sums.tolist(), strict=True))

        missing: set[tuple[str, ...]] = set()  # the paths of means over nothing: null in the line

        def train_mean(key: str, count: int, path: tuple[str, ...] | None = None) -> float:
            if count > 0:
                return train_sums[key] / count
            missing.add(path or (key,))
            return math.nan

        totals = {k: int(v) for k, v in (extra.get("hindsight_totals") or {}).items()}
        hindsight: dict[str, Any] = {
            kind: totals.get(kind, 0) - self._last_hindsight.get(kind, 0) for kind in HINDSIGHT_KEYS[:3]
        }
        hindsight["threshold"] = extra.get("threshold")
        hindsight["priority_boost"] = extra.get("priority_boost")
        self._last_hindsight = totals
        mix = {
            name: (counts / max(int(counts.sum()), 1)).round(6).tolist()
            for name, counts in zip(self.branch_names, self._action_counts, strict=True)
        }
        record: dict[str, Any] = {
            "step": int(step),
            "time": now,
            "fps": (step - self._last_step) / elapsed,
            "n_updates": extra.get("n_updates", 0),
            "l_q": train_mean("l_q", n_train),
            "l_c51": train_mean("l_c51", n_train),
            "loss": train_mean("loss", n_train),
            "eps": dict(zip(self.branch_names, extra.get("eps", []), strict=False)),
            "action_mix": mix,
            "iqr_mean": float(self._select_sums["iqr_mean"]) / n_select if n_select else math.nan,
            "ens_std": float(self._select_sums["ens_std"]) / n_select if n_select else math.nan,
            "popart_mu": extra.get("popart_mu"),
            "popart_sigma": extra.get("popart_sigma"),
            "per": {**(extra.get("per") or {}),
                    "mean_weight": train_mean("mean_weight", n_train, ("per", "mean_weight"))},
            "hindsight": hindsight,
            "vaccine": {
                "cos": train_mean("vaccine_cos", n_vaccine, ("vaccine", "cos")),
                "corrections": n_corrections,
            },
            "iqr_bonus": extra.get("iqr_bonus"),
            "ep_rew_mean": extra.get("ep_rew_mean"),
        }
        if not n_select:
            missing.update({("iqr_mean",), ("ens_std",)})
        if self.path is not None:
            with self.path.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(_json_safe(record, frozenset(missing))) + "\n")
        if logger is not None:
            for key, value in flatten_scalars(record).items():
                if key not in ("step", "time"):
                    logger.record(f"diagnostics/{key}", value)
        self._last_time = now
        self._last_step = step
        self.reset()
        return record


def flatten_scalars(record: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """Flatten nested dicts and lists of numbers into ``a/b/0``-keyed scalars (``None`` and NaN dropped).

    :param record: a diagnostics record.
    :param prefix: key prefix of this level.
    :return: a flat mapping key → float.
    """
    flat: dict[str, float] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten_scalars(value, f"{name}/"))
        elif isinstance(value, list | tuple):
            flat.update(flatten_scalars({str(i): v for i, v in enumerate(value)}, f"{name}/"))
        elif isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            flat[name] = float(value)
    return flat


#: how a non-finite value is written (strict JSON has no NaN or infinity)
_NON_FINITE_TEXT: dict[str, float] = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _json_safe(
    value: Any, missing: frozenset[tuple[str, ...]] = frozenset(), path: tuple[str, ...] = ()
) -> Any:
    """Strict JSON: a non-finite float at one of the ``missing`` paths (a mean over nothing) becomes
    ``None``, any other one the string ``"nan"``, ``"inf"`` or ``"-inf"``."""
    if isinstance(value, dict):
        return {k: _json_safe(v, missing, (*path, str(k))) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v, missing, (*path, str(i))) for i, v in enumerate(value)]
    if isinstance(value, float) and not math.isfinite(value):
        if path in missing:
            return None
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def _from_json(value: Any) -> Any:
    """Undo :func:`_json_safe`'s strings for non-finite floats."""
    if isinstance(value, dict):
        return {k: _from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    if isinstance(value, str) and value in _NON_FINITE_TEXT:
        return _NON_FINITE_TEXT[value]
    return value


def read_diagnostics(path: str | Path) -> list[dict[str, Any]]:
    """Read a diagnostics JSONL file.

    :param path: the file written by :class:`TrainingDiagnostics`.
    :return: one dict per line (non-finite values as floats, missing means as None).
    """
    with Path(path).open(encoding="utf-8") as handle:
        return [_from_json(json.loads(line)) for line in handle if line.strip()]
