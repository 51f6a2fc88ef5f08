"""What ``foxhunt evaluate`` scores and, unless told otherwise, how: the settings of a run folder or a model.

A run folder and the ``model.zip`` inside it get the same evaluation: both take the run's config (the
folder's ``config.json``, or the config the model file's fingerprint carries) and from it the data, market
options (``split_times``, fractions, aggregation, synthetic knobs), held-out split, books, evaluation steps,
seed and device. A run folder stopped before it ended (no ``model.zip``) is scored with its newest
checkpoint's model, and the report says so. What could not be restored is said in :attr:`Target.notes`,
which the report prints.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from foxhunt.evaluation import model_file


@dataclass
class Target:
    """A model to evaluate and the evaluation settings it carries (``None``: the evaluation's default)."""

    model: Path  # the model file scored
    home: Path  # where the report folder goes (``evaluations/<stamp>/`` below it)
    env_kwargs: dict[str, Any]  # EnvConfig fields and market options the model was trained with
    data: str | None  # "synthetic" or a LOBSTER folder; None: the model's data must be given (--data)
    market_steps: int  # steps of a generated synthetic market
    split: str  # held-out split
    n_envs: int | None  # books
    steps: int | None  # vector steps per book
    seed: int  # seed of the episode windows and the random baseline
    device: str  # device of the model and envs
    stamped: dict[str, Any] | None  # the model's fingerprint (or the training market its config names)
    source: str  # where the settings come from, for messages
    notes: list[str] = field(default_factory=list)  # said in the report

    @property
    def trained_source(self) -> str | None:
        """``"synthetic"`` or ``"lobster"``: the data the model was trained on (None: not known)."""
        market = (self.stamped or {}).get("market") or {}
        return market.get("source")


def _usable(device: str) -> str:
    """``device`` when it exists here, else ``"cpu"``."""
    import torch

    return device if device == "cpu" or torch.cuda.is_available() else "cpu"


def _from_config(config: Any, model: Path, home: Path, stamped: dict[str, Any] | None, source: str,
                 notes: list[str]) -> Target:
    """A run's evaluation, as its own final evaluation did (``foxhunt.runs._evaluate_run``)."""
    from foxhunt.runs import eval_seed

    return Target(
        model=model, home=home, env_kwargs=config.resolved_env_kwargs(), data=config.data,
        market_steps=config.synthetic_market_steps, split=config.eval_split, n_envs=config.n_envs,
        steps=config.eval_steps, seed=eval_seed(config), device=_usable(config.device), stamped=stamped,
        source=source, notes=notes,
    )


def _newest_model(run_dir: Path) -> tuple[Path, list[str]]:
    """A run folder's ``model.zip``, else (a run stopped before it ended) its newest checkpoint's model."""
    if (run_dir / "model.zip").is_file():
        return run_dir / "model.zip", []
    from foxhunt.checkpoint import latest_checkpoint, read_manifest

    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is None:
        raise ValueError(f"{str(run_dir)!r} holds config.json but neither model.zip nor a checkpoint (the "
                         "run stopped before its first checkpoint): nothing to evaluate")
    step = read_manifest(checkpoint).get("step")
    note = (f"the run has no model.zip (it stopped before it ended): its newest checkpoint, "
            f"{checkpoint.name} (step {step:,}), is evaluated")
    return checkpoint / "model.zip", [note]


def run_folder(run_dir: Path) -> Target:
    """The target of ``foxhunt evaluate RUN_DIR``: its model (or newest checkpoint) and its config's settings.

    :param run_dir: a folder holding ``config.json``.
    :return: the target.
    """
    from foxhunt.runs import RunConfig

    config = RunConfig.load(run_dir / "config.json")
    model, notes = _newest_model(run_dir)
    stamped, source = model_file.run_settings(config, model, run_dir)
    return _from_config(config, model, run_dir, stamped, source, notes)


def _config_of(stamped: Mapping[str, Any]) -> Any:
    """The run config a model's fingerprint carries (its evaluation steps put back), or None (a fingerprint
    without one, or of a config this code cannot read)."""
    from foxhunt.fingerprint import evaluation_settings
    from foxhunt.runs import RunConfig

    values = stamped.get("config")
    if not isinstance(values, dict):
        return None
    try:
        return RunConfig.from_dict({**values, **evaluation_settings(stamped)})
    except (TypeError, ValueError):
        return None


def _model_data(config: Any, stamped: Mapping[str, Any], data: str | None) -> str | None:
    """The data a model file is scored on by default: its run's, when that is synthetic or a LOBSTER folder
    here with the same files (SHA-256); else None (``--data`` must be given)."""
    from foxhunt.fingerprint import lobster_files

    market = stamped.get("market") or {}
    if data is not None or market.get("source") != "lobster":
        return "synthetic" if data is None else data
    if config.data != "synthetic" and Path(config.data).is_dir() and market.get("files") == lobster_files(
            config.data):
        return config.data
    return None


def model_zip(path: Path, data: str | None) -> Target:
    """The target of ``foxhunt evaluate MODEL.zip``: the settings its fingerprint carries (its run's config:
    the same evaluation as ``foxhunt evaluate RUN_DIR``), else the presets'.

    :param path: the model file.
    :param data: ``--data`` (None: not given).
    :return: the target.
    """
    from foxhunt.fingerprint import evaluation_settings
    from foxhunt.runs import RunConfig

    stamped = model_file.saved_fingerprint(path)
    source = "the settings saved in the model file"
    config = _config_of(stamped) if stamped is not None else None
    if config is not None:
        notes = [] if evaluation_settings(stamped) else [
            f"the model file does not record its run's eval_steps (saved before they were): "
            f"{config.eval_steps} steps per book assumed; foxhunt evaluate RUN_DIR uses the run's"]
        target = _from_config(config, path, path.parent, stamped, source, notes)
        target.data = _model_data(config, stamped, data)
        if target.data is None:
            model_file.check_data_given(stamped, data)
        return target
    env_kwargs, market_steps = RunConfig().resolved_env_kwargs(), RunConfig().synthetic_market_steps
    if stamped is not None:  # a model carries its settings (issue 25)
        env_kwargs, steps, _ = model_file.saved_env_kwargs(stamped)
        market_steps = steps or market_steps
        model_file.check_data_given(stamped, data)
    return Target(model=path, home=path.parent, env_kwargs=env_kwargs, data="synthetic",
                  market_steps=market_steps, split="test", n_envs=None, steps=None, seed=0, device="cpu",
                  stamped=stamped, source=source)


def resolve(target: str | Path, data: str | None = None) -> Target:
    """A run folder's or a model file's target.

    :param target: ``foxhunt evaluate``'s argument.
    :param data: ``--data``.
    :return: the target.
    :raises ValueError: one line, for anything else.
    """
    path = Path(target)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"{str(path)!r} is a folder without config.json (not a run folder)")
        return run_folder(path)
    if path.suffix == ".zip" and path.is_file():
        return model_zip(path, data)
    raise ValueError(f"target={str(path)!r} must be a run folder or a model .zip")
