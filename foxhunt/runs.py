"""Training runs: one :class:`RunConfig` holds every knob of a run; :func:`train` turns it into a run folder.

A run folder holds::

    config.json        the RunConfig (``RunConfig.load`` reads it back)
    model.zip          the trained model (``BranchingIQN.load``)
    diagnostics.jsonl  one line of training diagnostics per interval
    training.png       episode reward, losses, hindsight counts, ε
    tb/                TensorBoard logs
    evaluation.json    the evaluation of the greedy policy and the baselines on held-out data
    report.md          the same as a report, with eval_*.png figures
    checkpoints/       the last checkpoints (see :mod:`foxhunt.checkpoint`); :func:`resume` continues from
                       the newest

A new run never shares a folder: without ``out`` it gets ``runs/<timestamp>-<random>``, and a given
``out`` must be new or empty.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch as th

from foxhunt import presets

#: what a run can be scored on (:attr:`RunConfig.eval_split`)
EVAL_SPLITS = ("test", "validation")


def check_eval_split(value: str, field: str) -> str:
    """``value`` if it is one of :data:`EVAL_SPLITS`, else a ``ValueError`` naming ``field``."""
    if value not in EVAL_SPLITS:
        raise ValueError(f"{field}={value!r} must be one of {', '.join(map(repr, EVAL_SPLITS))}")
    return value


@dataclass
class RunConfig:
    """Every setting of a training run. ``foxhunt train`` builds one from its options.

    The model, policy and env dicts are *overrides*: each key replaces the preset of the same name in
    :mod:`foxhunt.presets` (``MODEL_KWARGS``, ``POLICY_KWARGS``, ``ENV_KWARGS``).
    """

    data: str = "synthetic"
    """``"synthetic"`` (the built-in generator) or a folder of LOBSTER files."""
    steps: int = presets.CPU_TRAIN_STEPS
    """Environment steps of training (summed over books)."""
    n_envs: int = presets.CPU_N_ENVS
    """Books stepped together."""
    device: str = "cpu"
    """``"cpu"`` or ``"cuda"`` (``"cuda:K"``)."""
    seed: int = 0
    """Seed of the network, replay, exploration and the training env's episode starts."""
    threads: int = 1
    """torch CPU threads (1 is fastest for these small networks)."""
    hindsight: bool | None = None
    """Hindsight replay injections on trade closes; ``None``: on for the branched action face, off for the
    joint one (``True`` with the joint face is a ``ValueError``: hindsight relabels the branches)."""
    eval_steps: int = 500
    """Vector steps of the final evaluation."""
    cuda_graph: bool | None = None
    """Each gradient step as one CUDA graph replay; ``None``: on exactly when the device is CUDA."""
    progress: bool = True
    """Show a progress bar."""
    out: str | None = None
    """Run folder, new or empty; ``None``: a new ``runs/<timestamp>-<random>``."""
    synthetic_market_steps: int = presets.SYNTHETIC_MARKET_STEPS
    """Steps of each generated synthetic market."""
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    """Overrides of BranchingIQN's arguments (``learning_rate``, ``gamma``, ...)."""
    policy_kwargs: dict[str, Any] = field(default_factory=dict)
    """Overrides of the policy's arguments (``net_arch``, ``n_ensemble``, ...)."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Overrides of the env's arguments (``episode_length``, fees, ...)."""
    device_loop: bool | None = None
    """Collect through BranchingIQN's device loop (tensors stay on the device, no per-step host sync:
    :mod:`sb3_her_ext.device_loop`); ``None``: on exactly when the device is CUDA."""
    checkpoint_every: int = 5_000
    """Environment steps between checkpoints (and one when training ends; a default CPU run leaves three);
    0: no checkpoints."""
    keep_checkpoints: int = 3
    """Checkpoints kept, the newest; 0: all."""
    eval_split: str = "test"
    """The held-out data the run is scored on: ``"test"`` (the final evaluation), or ``"validation"`` for
    model selection that must not see the test data (``foxhunt tune``'s trials): a LOBSTER run then trains on
    the train split's first 75 % (``"fit"``) and is scored on the rest of it (``"validation"``); a synthetic
    run is scored on a third market (seed: the training market's + 2; the test market's is + 1)."""
    action_face: str | None = None
    """The action BranchingIQN learns on: ``"branched"`` (foxenv's four branches, with the per-branch
    presets) or ``"joint"`` (one branch of the 81 joint actions, code ``27 d + 9 m + 3 o + u``);
    ``None``: :data:`foxhunt.presets.ACTION_FACE`."""

    def __post_init__(self) -> None:
        for name in ("steps", "n_envs", "threads", "eval_steps", "synthetic_market_steps", "seed",
                     "checkpoint_every", "keep_checkpoints"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"RunConfig.{name}={value!r} must be an integer")
        for name in ("data", "device"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"RunConfig.{name}={getattr(self, name)!r} must be a string")
        if self.out is not None and not isinstance(self.out, str):
            raise ValueError(f"RunConfig.out={self.out!r} must be a string or None")
        if not isinstance(self.progress, bool):
            raise ValueError(f"RunConfig.progress={self.progress!r} must be a bool")
        for name in ("hindsight", "cuda_graph", "device_loop"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), bool):
                raise ValueError(f"RunConfig.{name}={getattr(self, name)!r} must be a bool or None")
        for name in ("checkpoint_every", "keep_checkpoints"):
            if getattr(self, name) < 0:
                raise ValueError(f"RunConfig.{name}={getattr(self, name)} must be >= 0")
        for name, least in (("steps", 1), ("n_envs", 1), ("threads", 1), ("eval_steps", 2),
                            ("synthetic_market_steps", 2)):
            if getattr(self, name) < least:
                raise ValueError(f"RunConfig.{name}={getattr(self, name)} must be >= {least}")
        if not 0 <= self.seed < 2**32:
            raise ValueError(f"RunConfig.seed={self.seed} must lie in [0, 2**32)")
        for name in ("model_kwargs", "policy_kwargs", "env_kwargs"):
            if not isinstance(getattr(self, name), dict):
                raise ValueError(f"RunConfig.{name}={getattr(self, name)!r} must be a dict")
        check_eval_split(self.eval_split, "RunConfig.eval_split")
        presets.resolve_action_face(self.action_face, "RunConfig.action_face")
        if self.hindsight and self.resolved_action_face() == "joint":
            raise ValueError(
                f"RunConfig.hindsight={self.hindsight!r} cannot be used with RunConfig.action_face="
                f"{self.resolved_action_face()!r}: hindsight relabels the direction and magnitude branches, "
                "which the joint face does not have (hindsight=False or None)"
            )

    # ---------------------------------------------------------------- resolved settings

    def resolved_cuda_graph(self) -> bool:
        """Whether gradient steps run as CUDA graphs (``cuda_graph``, or the device's default)."""
        on_cuda = th.device(self.device).type == "cuda"
        graph = on_cuda if self.cuda_graph is None else self.cuda_graph
        if graph and not on_cuda:
            raise ValueError(f"RunConfig.cuda_graph=True needs a CUDA device, got device={self.device!r}")
        return graph

    def resolved_device_loop(self) -> bool:
        """Whether collection runs through the device loop (``device_loop``, or on exactly on CUDA)."""
        return th.device(self.device).type == "cuda" if self.device_loop is None else self.device_loop

    def resolved_action_face(self) -> str:
        """The action face (``action_face``, or :data:`foxhunt.presets.ACTION_FACE`)."""
        return presets.resolve_action_face(self.action_face, "RunConfig.action_face")

    def train_split(self) -> str:
        """The LOBSTER split a run trains on: ``"train"``, or ``"fit"`` when it is scored on ``"validation"``
        (the validation steps are then never trained on)."""
        return "fit" if self.eval_split == "validation" else "train"

    def resolved_hindsight(self) -> bool:
        """Whether hindsight replay is on (``hindsight``, or the action face's default)."""
        return presets.resolve_hindsight(self.hindsight, self.resolved_action_face())

    def resolved_model_kwargs(self) -> dict[str, Any]:
        """BranchingIQN's keyword arguments: presets (with a GPU's on CUDA) and the action face's trading
        arguments (:func:`foxhunt.presets.face_algorithm_kwargs`, ``hindsight`` included), scaled to short
        runs, then the overrides."""
        base = dict(presets.MODEL_KWARGS)
        if th.device(self.device).type == "cuda":
            base.update(presets.GPU_MODEL_KWARGS)
        model_kwargs = {
            **base,
            **presets.face_algorithm_kwargs(self.resolved_action_face(), self.hindsight),
            "learning_starts": min(base["learning_starts"], max(self.steps // 4, self.n_envs)),
            "diagnostics_interval": min(base["diagnostics_interval"], max(self.steps // 4, 1)),
        }
        model_kwargs.update(self.model_kwargs)
        return model_kwargs

    def resolved_policy_kwargs(self) -> dict[str, Any]:
        """The policy's keyword arguments: presets (and the action face's), then the overrides."""
        return {**presets.POLICY_KWARGS, **presets.face_policy_kwargs(self.resolved_action_face()),
                **self.policy_kwargs}

    def resolved_env_kwargs(self) -> dict[str, Any]:
        """The env's keyword arguments: presets, then the overrides."""
        return {**presets.ENV_KWARGS, **self.env_kwargs}

    # ---------------------------------------------------------------- JSON

    def to_dict(self) -> dict[str, Any]:
        """The config as plain JSON-able values."""
        return dataclasses.asdict(self)

    def save(self, path: str | Path) -> Path:
        """Write the config as JSON (atomically: a temporary file renamed into place).

        :param path: the file (``config.json`` of a run folder).
        :return: the path written.
        """
        path = Path(path)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2))
        os.replace(tmp, path)  # a reader never sees half a file
        return path

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> RunConfig:
        """A config from a dict; unknown keys raise ``ValueError`` naming them.

        :param values: field values (a ``config.json``'s content).
        :return: the config.
        """
        if not isinstance(values, dict):
            raise ValueError(f"a run config must be a JSON object, got {type(values).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown RunConfig fields {unknown}; known fields are {sorted(known)}")
        return cls(**values)

    @classmethod
    def load(cls, path: str | Path) -> RunConfig:
        """Read a config written by :meth:`save` (or by hand).

        :param path: a JSON file.
        :return: the config.
        """
        path = Path(path)
        try:
            values = json.loads(path.read_text())
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}: not valid JSON ({error})") from None
        return cls.from_dict(values)


def make_env(config: RunConfig, seed: int, split: str) -> Any:
    """The SB3 vector env of a run: the synthetic market or a LOBSTER folder's ``split``.

    :param config: the run's config.
    :param seed: the env's seed.
    :param split: a :data:`foxenv.data.SPLITS` name (``"train"``, ``"test"``, ``"fit"``, ``"validation"``).
    :return: a :class:`~foxhunt.envs.LOBVecEnv` (with the device loop a
        :class:`~foxhunt.device_env.DeviceLOBVecEnv`) on the run's action face.
    """
    from foxhunt.device_env import DeviceLOBVecEnv
    from foxhunt.envs import LOBVecEnv

    cls = DeviceLOBVecEnv if config.resolved_device_loop() else LOBVecEnv

    def env_class(*args: Any, **kwargs: Any) -> Any:
        return cls(*args, action_face=config.resolved_action_face(), **kwargs)

    env_kwargs = config.resolved_env_kwargs()
    if config.data == "synthetic":
        return env_class(config.n_envs, device=config.device, seed=seed, data="synthetic",
                         num_steps=config.synthetic_market_steps, **env_kwargs)
    if not Path(config.data).is_dir():
        raise ValueError(f"data={config.data!r} must be 'synthetic' or a folder of LOBSTER files")
    from foxenv.data import load_market

    market = load_market(config.data, split=split, device=config.device)
    # a short split (the LOBSTER sample's test split has ~300 steps) gets episodes that fit in it
    env_kwargs["episode_length"] = min(env_kwargs["episode_length"], market.num_steps - 1)
    return env_class(config.n_envs, device=config.device, seed=seed, data=market, **env_kwargs)


def eval_seed(config: RunConfig) -> int:
    """The seed of the held-out evaluation's episode windows and random baseline."""
    return config.seed + 1000


def train_market_seed(config: RunConfig) -> int:
    """The synthetic training market's generator seed (``env_kwargs["market_seed"]``, default 0)."""
    return int(config.resolved_env_kwargs().get("market_seed", 0) or 0)


def eval_market_seed(config: RunConfig) -> int:
    """The synthetic evaluation market's generator seed: another market than the training one (the test
    market, or with ``eval_split="validation"`` a third one for model selection)."""
    return train_market_seed(config) + (2 if config.eval_split == "validation" else 1)


def _callbacks(*callbacks: Any) -> list[Any]:
    """SB3 callbacks as one flat list (functions wrapped in ``ConvertCallback``, ``None`` dropped)."""
    from stable_baselines3.common.callbacks import BaseCallback, ConvertCallback

    flat: list[Any] = []
    for callback in callbacks:
        if callback is None:
            continue
        for item in callback if isinstance(callback, list | tuple) else [callback]:
            flat.append(item if isinstance(item, BaseCallback) else ConvertCallback(item))
    return flat


def _restore(out: Path, config: RunConfig, env: Any, diagnostics_path: Path) -> tuple[Any, dict[str, Any]]:
    """The model of ``out``'s newest checkpoint, on ``env``; the diagnostics file cut back to it."""
    from foxhunt.checkpoint import latest_checkpoint, load_checkpoint, prune_checkpoints

    checkpoint = latest_checkpoint(out)
    if checkpoint is None:
        raise FileNotFoundError(
            f"{out} has no checkpoint to resume from (checkpoint_every={config.checkpoint_every})"
        )
    model, manifest = load_checkpoint(checkpoint, env, config.device, diagnostics_path=str(diagnostics_path),
                                      tensorboard_log=str(out / "tb"))
    prune_checkpoints(out, 0)  # only the leftovers of a killed write
    offset = manifest["diagnostics_offset"]
    size = diagnostics_path.stat().st_size if diagnostics_path.is_file() else 0
    if size < offset:
        raise ValueError(f"{diagnostics_path} has {size} bytes, fewer than the {offset} of {checkpoint}")
    with diagnostics_path.open("ab") as handle:  # lines written after the checkpoint are written again
        handle.truncate(offset)
    return model, manifest


def resume(run_dir: str | Path, callback: Any = None, progress: bool | None = None) -> Path:
    """Continue the run in ``run_dir`` from its newest checkpoint to its config's ``steps``, then finish it
    as :func:`train` does. On the CPU the result is bit for bit the uninterrupted run's.

    :param run_dir: a run folder written by :func:`train` (its ``config.json`` and ``checkpoints/``).
    :param callback: SB3 callback(s) passed to ``model.learn``.
    :param progress: show a progress bar (``None``: as the run's config says).
    :return: the run folder.
    """
    run_dir = Path(run_dir)
    if not (run_dir / "config.json").is_file():
        raise FileNotFoundError(
            f"resume={str(run_dir)!r}: no run folder there ({run_dir / 'config.json'} missing)"
        )
    config = RunConfig.load(run_dir / "config.json")
    if "action_face" not in json.loads((run_dir / "config.json").read_text()):
        config = dataclasses.replace(config, action_face="branched")  # a run from before the joint face
    if progress is not None:
        config = dataclasses.replace(config, progress=progress)
    return train(config, callback, resume_from=run_dir)


def train(config: RunConfig, callback: Any = None, *, resume_from: str | Path | None = None) -> Path:
    """Train BranchingIQN as ``config`` says, write the run folder, evaluate the greedy policy.

    :param config: the run's settings.
    :param callback: SB3 callback(s) passed to ``model.learn`` (an Optuna pruning callback, say).
    :param resume_from: continue this run folder from its newest checkpoint (``config`` is its
        ``config.json``; :func:`resume` reads it).
    :return: the run folder.
    """
    from foxhunt.checkpoint import CheckpointCallback
    from foxhunt.evaluation.plots import plot_training
    from foxhunt.run_folder import lock_run_folder, new_run_folder
    from sb3_her_ext.algorithm import BranchingIQN

    if resume_from is None:
        # config.json records whether the steps were graphed
        config = dataclasses.replace(config, cuda_graph=config.resolved_cuda_graph(),
                                     device_loop=config.resolved_device_loop(),
                                     action_face=config.resolved_action_face(),
                                     hindsight=config.resolved_hindsight())
        out = new_run_folder(config.out)
        config.save(out / "config.json")
    else:
        out = Path(resume_from)
    lock = lock_run_folder(out)  # a second process resuming this run while it goes on is refused
    try:
        th.set_num_threads(config.threads)
        diagnostics_path = out / "diagnostics.jsonl"

        env = make_env(config, config.seed, split=config.train_split())
        resumed = None
        if resume_from is None:
            model = BranchingIQN(
                "MlpPolicy", env, seed=config.seed, device=config.device,
                cuda_graph=config.cuda_graph, policy_kwargs=config.resolved_policy_kwargs(),
                tensorboard_log=str(out / "tb"), diagnostics_path=str(diagnostics_path),
                **config.resolved_model_kwargs(),
            )
        else:
            model, resumed = _restore(out, config, env, diagnostics_path)
        checkpoints = CheckpointCallback(out, config.checkpoint_every, config.keep_checkpoints,
                                         diagnostics_path, resumed_from=resumed)
        model.learn(max(config.steps - model.num_timesteps, 0), callback=_callbacks(checkpoints, callback),
                    progress_bar=config.progress, reset_num_timesteps=resumed is None)
        model.log_diagnostics()  # the last, partial interval
        model.save(out / "model.zip")
    finally:
        lock.close()
    plot_training(out / "diagnostics.jsonl", out / "training.png", hindsight=config.resolved_hindsight())

    _evaluate_run(config, model, out)
    print(f"\nrun folder: {out}")
    return out


def _evaluate_run(config: RunConfig, model: Any, out: Path) -> None:
    """The final evaluation of ``train``: ``foxhunt evaluate``'s code on the run's held-out data."""
    from foxhunt.evaluation.api import evaluate_policies, split_env_kwargs
    from foxhunt.evaluation.report import held_out_line, print_evaluation, write_report

    synthetic = config.data == "synthetic"
    config_kwargs, market_kwargs = split_env_kwargs(config.resolved_env_kwargs())
    market_kwargs.pop("market_seed", None)
    if synthetic:
        market_kwargs.setdefault("num_steps", config.synthetic_market_steps)
    evaluation = evaluate_policies(
        {"policy": model}, config.data, n_envs=config.n_envs, steps=config.eval_steps,
        seed=eval_seed(config), market_seed=eval_market_seed(config),
        train_market_seed=train_market_seed(config) if synthetic else None,
        split=config.eval_split, env_kwargs=config_kwargs, market_kwargs=market_kwargs, device=config.device,
    )
    write_report(evaluation, out, "policy", f"Evaluation of {out / 'model.zip'}")
    held_out = held_out_line(evaluation.setup)
    print_evaluation(evaluation, "policy", f"evaluation: deterministic policy, {held_out}, "
                     f"{config.eval_steps} steps x {evaluation.setup['books']} books")
