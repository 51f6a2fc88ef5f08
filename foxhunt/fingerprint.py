"""What an artefact was made on: the fingerprint a checkpoint, a model file and a replay buffer carry.

A fingerprint is a plain JSON-able dict::

    {"format": 1,
     "config": {...},        the run's settings that shape what is learned (RunConfig, less run control)
     "market": {...},        the training market: "synthetic" with its seed and parameters, or LOBSTER files
                             with their SHA-256, the split and the aggregation
     "action_face": "joint", the action the model learns on, and "action_space": "Discrete(81)"
     "env": {...},           the env settings (EnvConfig: levels, episode length, max_position, fees, reward,
                             ...; and the market's step_events / step_seconds)
     "code": {...},          the code version (package version and git commit when known)
     "evaluation": {...}}    how the run is scored (eval_steps): ``foxhunt evaluate MODEL.zip`` scores the
                             model as ``foxhunt evaluate RUN_DIR`` does; never compared

:func:`stamp` puts it on a model (an attribute SB3's ``save`` writes into ``model.zip``'s ``data``) and on its
replay buffer (pickled with it); a checkpoint's manifest records it too. :func:`compare` is the check that
resume, buffer load and evaluation apply: a difference is a :class:`FingerprintMismatch`, one line naming the
field with its old and new value; ``allow_market_change`` lets the market differ (``--allow-market-change``);
another code version only warns.
"""

from __future__ import annotations

import functools
import importlib.metadata
import subprocess
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: Layout version of a fingerprint.
FORMAT = 1
#: The attribute of a model (saved in ``model.zip``'s ``data``) and of a replay buffer that holds it.
ATTRIBUTE = "foxhunt_fingerprint"
#: RunConfig fields that steer a run without changing what it learns on (left out of the fingerprint).
RUN_CONTROL = ("steps", "eval_steps", "progress", "out", "checkpoint_every", "keep_checkpoints", "threads",
               "eval_freq", "eval_metric")
#: Fingerprint parts that say how an artefact is used, not what it was made on (:func:`compare` skips them).
NOT_COMPARED = ("code", "evaluation")
#: Fields whose change is a change of market (allowed by ``allow_market_change``).
MARKET_CONFIG_FIELDS = ("data", "synthetic_market_steps")


class FingerprintMismatch(ValueError):
    """An artefact was made on something else than what it is used with (the message names the field)."""


@functools.cache
def code_version() -> dict[str, str | None]:
    """The code's version: the ``foxhunt`` distribution's version and the git commit of this checkout.

    :return: ``{"version": ..., "commit": ... or None}``.
    """
    try:
        version: str | None = importlib.metadata.version("foxhunt")
    except importlib.metadata.PackageNotFoundError:
        version = None
    try:
        commit: str | None = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent, capture_output=True, text=True,
            timeout=10, check=True,
        ).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"version": version, "commit": commit}


def _plain(value: Any) -> Any:
    """``value`` as JSON-able data (tuples as lists, other objects as their ``repr``)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return repr(value)


def lobster_files(folder: str | Path) -> dict[str, str]:
    """The SHA-256 of a LOBSTER folder's message and orderbook files, by file name.

    :param folder: the folder.
    :return: ``{file name: sha256}``.
    """
    from foxenv.data.cache import file_sha256
    from foxenv.data.lobster import find_lobster_files

    return {path.name: file_sha256(path) for path in find_lobster_files(folder)}


def market_fingerprint(data: str, env_kwargs: Mapping[str, Any], *, split: str,
                       synthetic_market_steps: int) -> dict[str, Any]:
    """The training market of a run.

    :param data: ``"synthetic"`` or a LOBSTER folder.
    :param env_kwargs: the run's resolved env kwargs (EnvConfig fields and market options).
    :param split: the LOBSTER split trained on.
    :param synthetic_market_steps: steps of the generated synthetic market.
    :return: ``{"source": "synthetic", "seed", "num_steps", "params"}`` or ``{"source": "lobster", "files",
        "split", "options"}``.
    """
    from foxenv.config import split_env_kwargs

    _, options = split_env_kwargs(env_kwargs)
    options = dict(options)
    if data == "synthetic":
        seed = options.pop("market_seed", 0) or 0
        return {"source": "synthetic", "seed": _plain(seed), "num_steps": int(synthetic_market_steps),
                "params": _plain(dict(sorted(options.items())))}
    options.pop("market_seed", None)
    return {"source": "lobster", "files": lobster_files(data), "split": split,
            "options": _plain(dict(sorted(options.items())))}


def env_settings(env_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The env settings a model's observations and actions depend on: every :class:`~foxenv.config.EnvConfig`
    field (levels, episode length, max_position, fees, reward scale, ..., the action grid where it is not the
    default) and the step clock.

    :param env_kwargs: a run's resolved env kwargs.
    :return: the settings.
    """
    from foxenv.config import EnvConfig, config_settings, split_env_kwargs

    config, options = split_env_kwargs(env_kwargs)
    settings = config_settings(EnvConfig(**config))
    for name in ("step_events", "step_seconds"):
        if name in options:
            settings[name] = options[name]
    return _plain(settings)


def action_space_name(space: Any) -> str:
    """A space as the fingerprint writes it: ``"Discrete(81)"``, ``"MultiDiscrete([3, 3, 3, 3])"``."""
    nvec = getattr(space, "nvec", None)
    if nvec is not None:
        return f"MultiDiscrete({[int(n) for n in nvec]})"
    n = getattr(space, "n", None)
    return f"Discrete({int(n)})" if n is not None else str(space)


def run_fingerprint(config: Any, split: str | None = None) -> dict[str, Any]:
    """The fingerprint of a run's artefacts.

    :param config: the run's :class:`~foxhunt.runs.RunConfig`.
    :param split: the LOBSTER split trained on (default: the config's train split).
    :return: the fingerprint.
    """
    from foxenv.config import EnvConfig, split_env_kwargs

    face = config.resolved_action_face()
    values = config.to_dict()
    env_kwargs = config.resolved_env_kwargs()
    joint = face == "joint"
    grid = EnvConfig(**split_env_kwargs(env_kwargs)[0]).grid
    return {
        "format": FORMAT,
        "config": _plain({k: v for k, v in values.items() if k not in RUN_CONTROL}),
        "market": market_fingerprint(config.data, env_kwargs, split=split or config.train_split(),
                                     synthetic_market_steps=config.synthetic_market_steps),
        "action_face": face,
        "action_space": f"Discrete({grid.joint_actions})" if joint else f"MultiDiscrete({list(grid.nvec)})",
        "env": env_settings(env_kwargs),
        "code": code_version(),
        "evaluation": {"eval_steps": int(config.eval_steps)},
    }


def evaluation_settings(fingerprint: Mapping[str, Any]) -> dict[str, Any]:
    """The run's evaluation settings a fingerprint records (``{"eval_steps": ...}``; ``{}`` in one made
    before they were recorded).

    :param fingerprint: a fingerprint.
    :return: RunConfig fields by name.
    """
    values = fingerprint.get("evaluation")
    return {k: v for k, v in values.items() if k == "eval_steps"} if isinstance(values, Mapping) else {}


def stamp(model: Any, fingerprint: Mapping[str, Any]) -> None:
    """Put ``fingerprint`` on a model (saved by ``model.save`` in ``model.zip``) and its replay buffer.

    :param model: an SB3 algorithm.
    :param fingerprint: the fingerprint.
    """
    setattr(model, ATTRIBUTE, dict(fingerprint))
    buffer = getattr(model, "replay_buffer", None)
    if buffer is not None:
        setattr(buffer, ATTRIBUTE, dict(fingerprint))


def of(obj: Any) -> dict[str, Any] | None:
    """The fingerprint an object (a model, a replay buffer) carries, or None."""
    value = getattr(obj, ATTRIBUTE, None)
    return dict(value) if isinstance(value, Mapping) else None


def read_model_file(path: str | Path) -> dict[str, Any] | None:
    """The fingerprint in a ``model.zip`` (read from its ``data`` member: no model is built), or None.

    :param path: the file.
    :return: the fingerprint, or None when the file has none (saved by another program, or before
        fingerprints).
    :raises ValueError: when the file is not a readable SB3 zip.
    """
    import json
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            data = json.loads(archive.read("data"))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile) as error:
        raise ValueError(f"model={str(path)!r} is not a readable SB3 model file ({error})") from None
    value = data.get(ATTRIBUTE) if isinstance(data, dict) else None
    return dict(value) if isinstance(value, dict) else None


def _differences(old: Any, new: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """Leaf paths where ``old`` and ``new`` differ (a key missing on one side counts as ``None``)."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        found = []
        for key in sorted(set(old) | set(new), key=str):
            found += _differences(old.get(key), new.get(key), f"{path}.{key}" if path else str(key))
        return found
    return [] if old == new else [(path, old, new)]


def _is_market(path: str) -> bool:
    """Whether a differing fingerprint field is the market's (``market.*``, the data, the market options)."""
    parts = path.split(".")
    if parts[0] == "market":
        return True
    if parts[0] != "config" or len(parts) < 2:
        return False
    if parts[1] in MARKET_CONFIG_FIELDS:
        return True
    if parts[1:3] == ["env", "market"] or parts[1:3] == ["env", "market_seed"]:  # env.market.<option>
        return True
    if parts[1] == "env_kwargs" and len(parts) > 2:  # a config of the flat layout
        from foxenv.config import split_env_kwargs

        return parts[2] != "levels" and parts[2] in split_env_kwargs({parts[2]: None})[1]
    return False


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def compare(saved: Mapping[str, Any] | None, current: Mapping[str, Any], *, what: str, fix: str,
            allow_market_change: bool = False) -> list[str]:
    """Refuse an artefact made on something else than ``current``.

    :param saved: the artefact's fingerprint (None: made before fingerprints; a warning, then accepted).
    :param current: the fingerprint of what it is used with now.
    :param what: the artefact, for the message (``"checkpoint runs/x/checkpoints/step_000004000"``).
    :param fix: how to put it right, for the message.
    :param allow_market_change: the market (``market.*``, ``data``, market options) may differ.
    :return: the market fields that differ and were allowed.
    :raises FingerprintMismatch: one line naming the first differing field, old → new.
    """
    if saved is None:
        warnings.warn(f"{what} carries no fingerprint (made before fingerprints): not checked", stacklevel=2)
        return []
    differences = _differences({k: v for k, v in saved.items() if k not in NOT_COMPARED},
                               {k: v for k, v in current.items() if k not in NOT_COMPARED})
    allowed = [path for path, _, _ in differences if allow_market_change and _is_market(path)]
    refused = [(path, old, new) for path, old, new in differences if path not in allowed]
    if refused:
        path, old, new = refused[0]
        others = ", ".join(p for p, _, _ in refused[1:4])
        more = f" (and {len(refused) - 1} more: {others})" if refused[1:] else ""
        hint = "; or pass --allow-market-change to go on on the new market" if _is_market(path) else ""
        raise FingerprintMismatch(f"{what} was made with another {path}: {_shown(old)} -> {_shown(new)}"
                                  f"{more}; {fix}{hint}")
    old_code, new_code = saved.get("code"), current.get("code")
    if old_code != new_code:
        warnings.warn(f"{what} was made by code {old_code}, this is {new_code}: results may differ",
                      stacklevel=2)
    return allowed


# ---------------------------------------------------------------------------------------------- env state


def env_identity(env: Any) -> dict[str, Any]:
    """What an env's saved state belongs to: its books, settings and market (a digest of the market's
    prices and sizes, computed once per env).

    :param env: a :class:`~foxhunt.envs.LOBVecEnv` (its ``lob`` core).
    :return: ``{"num_envs", "config", "market"}``.
    """
    import hashlib

    from foxenv.config import config_settings

    identity = getattr(env, "_fingerprint_identity", None)
    if identity is None:
        lob = env.lob
        market = lob.market
        digest = hashlib.sha256()
        for tensor in (market.bid_price, market.ask_price, market.bid_size, market.ask_size):
            digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
        identity = {
            "num_envs": int(env.num_envs),
            "config": _plain(config_settings(lob.config)),
            "market": {"name": market.name, "num_steps": market.num_steps, "levels": market.num_levels,
                       "tick_size": float(market.tick_size), "sha256": digest.hexdigest()},
        }
        env._fingerprint_identity = identity
    return identity


def check_env_identity(saved: Mapping[str, Any] | None, env: Any) -> None:
    """Refuse an env state taken from another env (another market, ``market_seed``, ``max_position``, ...).

    :param saved: the state's identity (None: a state from before identities; accepted).
    :param env: the env it is loaded into.
    :raises FingerprintMismatch: naming the first field that differs, old -> new.
    """
    if saved is None:
        return
    differences = _differences(saved, env_identity(env))
    if differences:
        path, old, new = differences[0]
        more = f" (and {len(differences) - 1} more)" if differences[1:] else ""
        raise FingerprintMismatch(f"the env state was taken from another env: {path} {_shown(old)} -> "
                                  f"{_shown(new)}{more}; load it into an env of the same market, settings "
                                  "and size")
