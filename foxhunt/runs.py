"""Training runs: one :class:`RunConfig` holds every knob of a run; :func:`train` turns it into a run folder.

A run folder holds::

    config.json        the RunConfig (``RunConfig.load`` reads it back)
    model.zip          the trained model (``BranchingIQN.load``)
    diagnostics.jsonl  one line of training diagnostics per interval
    training.png       episode reward, losses, hindsight counts, ε
    tb/                TensorBoard logs
    evaluation.json    the evaluation of the greedy policy and the baselines on held-out data
    evaluations.jsonl  with ``eval_freq``: the evaluations during training (validation data), one a line
    best_model.zip     with ``eval_freq``: the model of the best of them (``eval_metric``)
    report.md          the same as a report, with eval_*.png figures
    checkpoints/       the last checkpoints (see :mod:`foxhunt.checkpoint`); :func:`resume` continues from
                       the newest

A new run never shares a folder: without ``out`` it gets ``runs/<timestamp>-<random>``, and a given
``out`` must be new or empty. :func:`train_concurrently` trains several runs at once in one process.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import InitVar, dataclass, field
from pathlib import Path
from typing import Any

from foxhunt.config import (
    ACTION_FACE,
    ACTION_FACES,
    AUTO,
    NULL_MEANS,
    AlgorithmSettings,
    EnvSettings,
    PolicySettings,
    check_fields,
    resolve,
    section_from_dict,
)

#: what a run can be scored on (:attr:`RunConfig.eval_split`)
EVAL_SPLITS = ("test", "validation")
#: what ``eval_freq``'s evaluations keep the best model by (:attr:`RunConfig.eval_metric`)
EVAL_METRICS = ("sharpe", "pnl", "mean_episode_reward")
#: the sections of the config tree: field of :class:`RunConfig` -> its class
SECTIONS: dict[str, type] = {"env": EnvSettings, "algorithm": AlgorithmSettings, "policy": PolicySettings}
#: the flat keyword arguments that set a section's fields on construction (``RunConfig(model_kwargs=...)``)
KWARGS_SECTIONS: dict[str, str] = {"model_kwargs": "algorithm", "policy_kwargs": "policy",
                                   "env_kwargs": "env"}


def check_eval_split(value: str, field: str) -> str:
    """``value`` if it is one of :data:`EVAL_SPLITS`, else a ``ValueError`` naming ``field``."""
    if value not in EVAL_SPLITS:
        raise ValueError(f"{field}={value!r} must be one of {', '.join(map(repr, EVAL_SPLITS))}")
    return value


def resolve_action_face(action_face: str | None, field: str = "action_face") -> str:
    """The action face ``action_face`` names (``None``: :data:`foxhunt.config.ACTION_FACE`).

    :raises ValueError: naming ``field`` and the value when it is not a face of
        :data:`~foxhunt.config.ACTION_FACES`.
    """
    face = ACTION_FACE if action_face is None else action_face
    if not isinstance(face, str) or face not in ACTION_FACES:
        raise ValueError(f"{field}={action_face!r} must be one of {list(ACTION_FACES)}")
    return face


def unrecorded_fields(values: Mapping[str, Any], ran: bool = False) -> list[str]:
    """The fields a ``config.json``'s content leaves ``null`` where a run uses a value: any field but those of
    :data:`foxhunt.config.NULL_MEANS` and, unless ``ran``, of :data:`foxhunt.config.AUTO` (chosen when the run
    starts). A file written before ``config.json`` recorded every value that ran has such nulls.

    :param values: the file's content.
    :param ran: whether the file is a run's ``config.json`` (it records every choice: no null in ``AUTO``).
    :return: dotted field names.
    """
    nulls = []
    for name, value in values.items():
        if name in SECTIONS and isinstance(value, Mapping):
            nulls += [f"{name}.{key}" for key, item in value.items() if item is None]
        elif value is None:
            nulls.append(name)
    return [name for name in nulls if name not in NULL_MEANS and (ran or name not in AUTO)]


@dataclass
class RunConfig:
    """Every setting of a training run: the root of the config tree. ``foxhunt train`` builds one from its
    options (one per field: ``--n-envs``, ``--algorithm.learning-rate``, ...).

    The run's own settings are fields here; ``env``, ``algorithm`` and ``policy`` are typed sections
    (:mod:`foxhunt.config`). The defaults are ``foxhunt train``'s (:data:`foxhunt.presets.CPU`); the fields
    of :data:`foxhunt.config.AUTO` default to ``None`` and are chosen for the run's device, steps, action face
    and data before it starts (:meth:`resolved`). ``model_kwargs``, ``policy_kwargs`` and ``env_kwargs`` are
    keywords of the constructor only: flat dicts that set the sections' fields of those names (``env_kwargs``
    puts market options in ``env.market``).
    """

    data: str = "synthetic"  # ``"synthetic"`` (the built-in generator) or a folder of LOBSTER files.
    steps: int = 15_000  # Environment steps of training (summed over books).
    n_envs: int = 8  # Books stepped together.
    device: str = "cpu"  # ``"cpu"`` or ``"cuda"`` (``"cuda:K"``).
    seed: int = 0  # Seed of the network, replay, exploration and the training env's episode starts.
    threads: int = 1  # torch CPU threads (1 is fastest for these small networks).
    hindsight: bool | None = None
    """Hindsight replay injections on trade closes (auto: on for the branched action face, off for the joint
    one; ``True`` there relabels the decoded branches of the joint codes)."""
    eval_steps: int = 500  # Vector steps of the final evaluation.
    cuda_graph: bool | None = None  # Each gradient step as one CUDA graph replay (auto: exactly on CUDA).
    progress: bool = True  # Show a progress bar.
    out: str | None = None  # Run folder, new or empty; ``None``: a new ``runs/<timestamp>-<random>``.
    synthetic_market_steps: int = 20_000  # Steps of each generated synthetic market.
    device_loop: bool | None = None
    """Collect through BranchingIQN's device loop (tensors stay on the device, no per-step host sync:
    :mod:`sb3_her_ext.collect`; auto: on when the device is CUDA and with ``algorithm.counterfactual``)."""
    checkpoint_every: int = 5_000
    """Environment steps between checkpoints (and one when training ends; a default CPU run leaves three);
    0: no checkpoints."""
    keep_checkpoints: int = 3  # Checkpoints kept, the newest; 0: all.
    eval_split: str = "test"
    """The held-out data the run is scored on: ``"test"`` (the final evaluation), or ``"validation"`` for
    model selection that must not see the test data (``foxhunt tune``'s trials): a LOBSTER run then trains on
    the train split's first 75 % (``"fit"``) and is scored on the rest of it (``"validation"``); a synthetic
    run is scored on a third market (seed: the training market's + 2; the test market's is + 1)."""
    eval_freq: int = 0
    """Environment steps between evaluations during training (SB3's ``EvalCallback``): the greedy policy is
    scored on the validation data (never the test data), ``eval/<metric>`` is logged, a line is appended to
    ``evaluations.jsonl``, and the best model by ``eval_metric`` is kept as ``best_model.zip``; 0: none.
    Callbacks on a device env (CUDA) run once per rollout, so an evaluation then comes at the first rollout
    end at or after each multiple. On LOBSTER data the validation split is the end of the train
    split, which a run with ``eval_split="test"`` trains on (with ``"validation"`` it does not)."""
    eval_metric: str = "sharpe"  # The metric ``eval_freq`` keeps the best model by.
    action_face: str = ACTION_FACE
    """The action BranchingIQN learns on: ``"branched"`` (foxenv's four branches, with the per-branch
    presets) or ``"joint"`` (one branch of the 81 joint actions, code ``27 d + 9 m + 3 o + u``)."""
    env: EnvSettings = field(default_factory=EnvSettings)  # The env's settings.
    algorithm: AlgorithmSettings = field(default_factory=AlgorithmSettings)  # BranchingIQN's settings.
    policy: PolicySettings = field(default_factory=PolicySettings)  # The policy's settings.
    model_kwargs: InitVar[dict[str, Any] | None] = None
    policy_kwargs: InitVar[dict[str, Any] | None] = None
    env_kwargs: InitVar[dict[str, Any] | None] = None

    def __post_init__(self, model_kwargs: dict[str, Any] | None, policy_kwargs: dict[str, Any] | None,
                      env_kwargs: dict[str, Any] | None) -> None:
        for name, cls in SECTIONS.items():
            setattr(self, name, section_from_dict(cls, getattr(self, name), f"RunConfig.{name}."))
        for keyword, values in zip(KWARGS_SECTIONS, (model_kwargs, policy_kwargs, env_kwargs), strict=True):
            if values is not None:
                self._set_kwargs(keyword, values)
        resolve_action_face(self.action_face, "RunConfig.action_face")
        check_fields(self, "RunConfig.")
        for name in SECTIONS:
            check_fields(getattr(self, name), f"RunConfig.{name}.")
        for name, least in (("checkpoint_every", 0), ("keep_checkpoints", 0), ("eval_freq", 0), ("steps", 1),
                            ("n_envs", 1), ("threads", 1), ("eval_steps", 2), ("synthetic_market_steps", 2)):
            if getattr(self, name) < least:
                raise ValueError(f"RunConfig.{name}={getattr(self, name)} must be >= {least}")
        if not 0 <= self.seed < 2**32:
            raise ValueError(f"RunConfig.seed={self.seed} must lie in [0, 2**32)")
        check_eval_split(self.eval_split, "RunConfig.eval_split")
        if self.eval_metric not in EVAL_METRICS:
            raise ValueError(f"RunConfig.eval_metric={self.eval_metric!r} must be one of "
                             f"{', '.join(map(repr, EVAL_METRICS))}")
        self._check_env()

    def _set_kwargs(self, keyword: str, values: Any) -> None:
        """Set the section fields that a flat dict of the constructor (``model_kwargs``, ...) names."""
        if not isinstance(values, dict):
            raise ValueError(f"RunConfig.{keyword}={values!r} must be a dict")
        values = dict(values)
        if keyword == "model_kwargs" and "hindsight" in values:  # a run-level setting in the tree
            self.hindsight = values.pop("hindsight")
        name = KWARGS_SECTIONS[keyword]
        section = getattr(self, name)
        known = {f.name for f in dataclasses.fields(section)}
        if keyword == "env_kwargs":  # market options go to env.market
            market = {k: v for k, v in values.items() if k not in known}
            values = {k: v for k, v in values.items() if k in known}
            values["market"] = {**section.market, **market}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown RunConfig.{keyword} keys {unknown}; known keys are {sorted(known)}")
        setattr(self, name, dataclasses.replace(section, **values))

    def _check_env(self) -> None:
        """The env section's foxenv settings, checked by foxenv's ``EnvConfig`` (errors name the field), and
        its market's option names."""
        from foxenv.config import EnvConfig

        known = {f.name for f in dataclasses.fields(EnvConfig)}
        try:
            EnvConfig(**{k: v for k, v in self.env.kwargs().items() if k in known})
        except ValueError as error:
            raise ValueError(_in_section("env", error)) from None
        from foxenv.factory import MARKET_KWARGS

        options = [*MARKET_KWARGS, *sorted(known)]
        for key in self.env.market:
            if key not in options:
                close = difflib.get_close_matches(key, options, n=1)
                hint = f"did you mean {close[0]!r}?" if close else f"options: {', '.join(options)}"
                raise ValueError(f"RunConfig.env.market has no option {key!r}; {hint}")

    def check(self) -> None:
        """What the run needs beyond its values' types (checked on construction): its data folder, its
        device (available here), CUDA for its CUDA graphs, BranchingIQN's checks of the resolved arguments
        and its memory (:func:`foxhunt.preflight.check_run`). :func:`train` and ``foxhunt train`` run it
        before a run folder is made (it imports SB3).

        :raises ValueError: naming the field (``RunConfig.algorithm.gamma=2.0 must lie in [0, 1]``).
        """
        import inspect

        import torch as th

        from foxenv.checks import check_device
        from foxhunt.preflight import check_run
        from sb3_her_ext.algorithm import BranchingIQN
        from sb3_her_ext.arguments import check_arguments

        if self.data != "synthetic" and not Path(self.data).is_dir():
            raise ValueError(f"RunConfig.data={self.data!r} must be 'synthetic' or a folder of LOBSTER files")
        check_device(self.device, "RunConfig.device")
        if self.cuda_graph and th.device(self.device).type != "cuda":
            raise ValueError(f"RunConfig.cuda_graph needs RunConfig.device cuda, got RunConfig.device="
                             f"{self.device!r}")
        defaults = {name: parameter.default for name, parameter in
                    inspect.signature(BranchingIQN.__init__).parameters.items()
                    if parameter.default is not inspect.Parameter.empty}
        try:
            check_arguments(**{**defaults, **self.resolved_model_kwargs(), "env": None, "seed": self.seed,
                               "cuda_graph": bool(self.cuda_graph)})
        except ValueError as error:
            raise ValueError(_in_section("algorithm", error)) from None
        check_run(self)

    # ---------------------------------------------------------------- resolved settings

    def resolved(self) -> RunConfig:
        """This config with every field of :data:`foxhunt.config.AUTO` chosen for the run
        (:func:`foxhunt.config.resolve`): the values :func:`train` runs with and writes to
        ``config.json``."""
        return resolve(self)

    def resolved_cuda_graph(self) -> bool:
        """Whether gradient steps run as CUDA graphs (``cuda_graph``, or the device's default)."""
        import torch as th

        if self.cuda_graph and th.device(self.device).type != "cuda":
            raise ValueError(f"RunConfig.cuda_graph=True needs a CUDA device, got device={self.device!r}")
        return bool(self.resolved().cuda_graph)

    def resolved_device_loop(self) -> bool:
        """Whether collection runs through the device loop (``device_loop``; auto: on CUDA and with
        ``algorithm.counterfactual``)."""
        return bool(self.resolved().device_loop)

    def resolved_action_face(self) -> str:
        """The action face (``action_face``)."""
        return resolve_action_face(self.action_face, "RunConfig.action_face")

    def train_split(self) -> str:
        """The LOBSTER split a run trains on: ``"train"``, or ``"fit"`` when it is scored on ``"validation"``
        (the validation steps are then never trained on)."""
        return "fit" if self.eval_split == "validation" else "train"

    def resolved_hindsight(self) -> bool:
        """Whether hindsight replay is on (``hindsight``; auto: on for the branched face only, off on the
        execute task, whose rewards are no trades' PnL)."""
        if self.env.task == "execute" and self.hindsight:
            raise ValueError("hindsight=True with env.task='execute': hindsight replay relabels the "
                             "trading task's trades; train the execute task without it")
        return bool(self.resolved().hindsight)

    def resolved_model_kwargs(self) -> dict[str, Any]:
        """BranchingIQN's keyword arguments: the resolved ``algorithm`` fields (those not ``None``) and
        ``hindsight``."""
        config = self.resolved()
        return {**config.algorithm.kwargs(), "hindsight": self.resolved_hindsight()}

    def resolved_policy_kwargs(self) -> dict[str, Any]:
        """The policy's keyword arguments: the resolved ``policy`` fields (those not ``None``)."""
        return self.resolved().policy.kwargs()

    def resolved_env_kwargs(self) -> dict[str, Any]:
        """The env's keyword arguments: the resolved ``env`` fields (those not ``None``) and its market
        options."""
        return self.resolved().env.kwargs()

    # ---------------------------------------------------------------- dotted names, JSON

    def with_values(self, values: Mapping[str, Any]) -> RunConfig:
        """This config with fields replaced by dotted name (``{"algorithm.gamma": 0.9, "steps": 100}``;
        ``env.market.NAME`` sets a market option).

        :param values: dotted field name -> value.
        :return: the new config (checked as any config).
        :raises ValueError: naming an unknown field, and the closest known names.
        """
        tree = self.to_dict()
        names = field_names()
        for name, value in values.items():
            if name not in names and not name.startswith("env.market."):
                close = difflib.get_close_matches(name, names, n=3)
                raise ValueError(f"unknown RunConfig field {name!r}"
                                 + (f"; did you mean {' or '.join(map(repr, close))}?" if close else ""))
            *path, last = name.split(".")
            node = tree
            for part in path:
                node = node[part]
            node[last] = value
        return RunConfig.from_dict(tree)

    def to_dict(self) -> dict[str, Any]:
        """The config as plain JSON-able values (the sections as nested dicts)."""
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
        """A config from a dict (a ``config.json``'s content: the tree, a field left out takes its default);
        unknown keys raise ``ValueError`` naming them.

        :param values: field values.
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
        nulls = unrecorded_fields(values) if isinstance(values, dict) else []
        if nulls:
            raise ValueError(f"{path}: null for {', '.join(nulls)}, where a run uses a value (a "
                             "config.json written before config.json recorded every value that ran): delete "
                             "those keys to take today's defaults")
        return cls.from_dict(values)


def _in_section(section: str, error: ValueError) -> str:
    """A section's error (``gamma=2.0 must ...``) naming the field by its path (``RunConfig.algorithm.``)."""
    message = str(error)
    named = re.match(r"[a-z_0-9]+[=\[]", message)
    return f"RunConfig.{section}.{message}" if named else f"RunConfig.{section}: {message}"


def field_names() -> list[str]:
    """Every field of the config tree by dotted name (``steps``, ``algorithm.learning_rate``, ...)."""
    names = [f.name for f in dataclasses.fields(RunConfig) if f.name not in SECTIONS]
    for section, cls in SECTIONS.items():
        names += [f"{section}.{f.name}" for f in dataclasses.fields(cls)]
    return names


def make_env(config: RunConfig, seed: int, split: str) -> Any:
    """The SB3 vector env of a run: the synthetic market or a LOBSTER folder's ``split``.

    :param config: the run's config.
    :param seed: the env's seed.
    :param split: a :data:`foxenv.data.SPLITS` name (``"train"``, ``"test"``, ``"fit"``, ``"validation"``).
    :return: a :class:`~foxhunt.envs.LOBVecEnv` (with the device loop a
        :class:`~foxhunt.device_lob_env.DeviceLOBVecEnv`) on the run's action face.
    """
    from foxhunt.device_lob_env import DeviceLOBVecEnv
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
    from foxenv.factory import MARKET_KWARGS

    # the market's own options (messages per step, ...) load it; the rest configure the env
    market_kwargs = {k: env_kwargs.pop(k) for k in MARKET_KWARGS if k in env_kwargs and k != "market_seed"}
    market = load_market(config.data, split=split, device=config.device, **market_kwargs)
    # a short split (the LOBSTER sample's test split has ~300 steps) gets episodes that fit in it
    env_kwargs["episode_length"] = min(env_kwargs["episode_length"], market.num_steps - 1)
    return env_class(config.n_envs, device=config.device, seed=seed, data=market, **env_kwargs)


def eval_seed(config: RunConfig) -> int:
    """The seed of the held-out evaluation's episode windows and random baseline."""
    return config.seed + 1000


def train_market_seed(config: RunConfig) -> int:
    """The synthetic training market's generator seed (``env.market_seed``, default 0)."""
    return config.env.market_seed or 0


def eval_market_seed(config: RunConfig) -> int:
    """The synthetic evaluation market's generator seed: another market than the training one (the test
    market, or with ``eval_split="validation"`` a third one for model selection)."""
    return train_market_seed(config) + (2 if config.eval_split == "validation" else 1)


def held_out_metrics(model: Any, config: RunConfig) -> dict[str, Any]:
    """Score ``model``'s deterministic policy on the run's held-out data for ``config.eval_steps`` steps,
    with random streams of its own (:func:`foxhunt.held_out.score_held_out`): ``foxhunt train
    --eval-freq``'s evaluations and ``foxhunt tune``'s trials.

    :param model: a BranchingIQN (anything with SB3's ``predict``).
    :param config: the run's config (data, books, device, seeds, env settings, ``eval_split``).
    :return: the evaluation's metrics dict (``sharpe``, PnL after fees, ..., ``mean_episode_reward``).
    """
    from foxhunt.held_out import score_held_out

    return score_held_out(model, config, eval_seed(config), eval_market_seed(config))


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


def _restore(out: Path, config: RunConfig, env: Any, diagnostics_path: Path, expected: dict[str, Any],
             allow_market_change: bool = False) -> tuple[Any, dict[str, Any]]:
    """The model of ``out``'s newest checkpoint, on ``env``; the diagnostics file cut back to it. The
    checkpoint's fingerprint must be ``expected`` (:mod:`foxhunt.fingerprint`; the market may differ with
    ``allow_market_change``)."""
    from foxhunt.checkpoint import latest_checkpoint, load_checkpoint, prune_checkpoints

    checkpoint = latest_checkpoint(out)
    if checkpoint is None:
        raise FileNotFoundError(
            f"{out} has no checkpoint to resume from (checkpoint_every={config.checkpoint_every})"
        )
    model, manifest = load_checkpoint(checkpoint, env, config.device, expected_fingerprint=expected,
                                      allow_market_change=allow_market_change,
                                      diagnostics_path=str(diagnostics_path), tensorboard_log=str(out / "tb"))
    prune_checkpoints(out, 0)  # only the leftovers of a killed write
    offset = manifest["diagnostics_offset"]
    size = diagnostics_path.stat().st_size if diagnostics_path.is_file() else 0
    if size < offset:
        raise ValueError(f"{diagnostics_path} has {size} bytes, fewer than the {offset} of {checkpoint}")
    with diagnostics_path.open("ab") as handle:  # lines written after the checkpoint are written again
        handle.truncate(offset)
    return model, manifest


def resume(run_dir: str | Path, callback: Any = None, progress: bool | None = None,
           allow_market_change: bool = False) -> Path:
    """Continue the run in ``run_dir`` from its newest checkpoint to its config's ``steps``, then finish it
    as :func:`train` does. On the CPU the result is bit for bit the uninterrupted run's.

    :param run_dir: a run folder written by :func:`train` (its ``config.json`` and ``checkpoints/``).
    :param callback: SB3 callback(s) passed to ``model.learn``.
    :param progress: show a progress bar (``None``: as the run's config says).
    :param allow_market_change: go on although ``config.json`` now names another market than the checkpoint
        was made on (else a :class:`~foxhunt.fingerprint.FingerprintMismatch` naming the field).
    :return: the run folder.
    """
    run_dir = Path(run_dir)
    if not (run_dir / "config.json").is_file():
        raise FileNotFoundError(
            f"resume={str(run_dir)!r}: no run folder there ({run_dir / 'config.json'} missing)"
        )
    try:
        values = json.loads((run_dir / "config.json").read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{run_dir / 'config.json'}: not valid JSON ({error})") from None
    nulls = unrecorded_fields(values, ran=True) if isinstance(values, dict) else []
    if nulls:
        raise ValueError(f"resume={str(run_dir)!r}: its config.json has null for {', '.join(nulls[:3])}"
                         f"{', ...' if len(nulls) > 3 else ''}: it was written before config.json recorded "
                         "every value that ran, and such a run cannot be resumed; train it again with "
                         "foxhunt train")
    config = RunConfig.from_dict(values)
    if progress is not None:
        config = dataclasses.replace(config, progress=progress)
    return train(config, callback, resume_from=run_dir, allow_market_change=allow_market_change)


def train(config: RunConfig, callback: Any = None, *, resume_from: str | Path | None = None,
          allow_market_change: bool = False) -> Path:
    """Train BranchingIQN as ``config`` says, write the run folder, evaluate the greedy policy.

    :param config: the run's settings.
    :param callback: SB3 callback(s) passed to ``model.learn`` (an Optuna pruning callback, say).
    :param resume_from: continue this run folder from its newest checkpoint (``config`` is its
        ``config.json``; :func:`resume` reads it).
    :param allow_market_change: with ``resume_from``, the market may differ from the checkpoint's.
    :return: the run folder.
    """
    import torch as th

    from foxhunt import fingerprint
    from foxhunt.callbacks import ProgressLineCallback
    from foxhunt.checkpoint import RunCheckpointCallback
    from foxhunt.evaluation.plots import plot_training
    from foxhunt.run_folder import discard_run_folder, lock_run_folder, new_run_folder
    from sb3_her_ext.algorithm import BranchingIQN

    config.check()  # every option and the memory, before anything is made or opened
    config = config.resolved()  # config.json records every value that runs
    expected = fingerprint.run_fingerprint(config)  # what every artefact of the run is stamped with
    out = new_run_folder(config.out) if resume_from is None else Path(resume_from)
    lock = lock_run_folder(out)  # a second process resuming this run while it goes on is refused
    learning = False
    try:
        if resume_from is None:
            config.save(out / "config.json")
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
            model, resumed = _restore(out, config, env, diagnostics_path, expected, allow_market_change)
        fingerprint.stamp(model, expected)
        checkpoints = RunCheckpointCallback(out, config.checkpoint_every, config.keep_checkpoints,
                                            diagnostics_path, resumed_from=resumed)
        callbacks = _callbacks(checkpoints, callback)
        bar = config.progress and sys.stdout.isatty()  # off a terminal (a log file): a line every 30 s
        callbacks += [ProgressLineCallback(config.steps)] if config.progress and not bar else []
        if config.eval_freq:
            from foxhunt.eval_callback import RunEvalCallback

            callbacks.append(RunEvalCallback(config, out, held_out_metrics, resumed=resumed is not None))
        learning = True
        model.learn(max(config.steps - model.num_timesteps, 0), callback=callbacks, progress_bar=bar,
                    reset_num_timesteps=resumed is None)
        model.log_diagnostics()  # the last, partial interval
        model.save(out / "model.zip")
    except BaseException:
        if resume_from is None and not learning:  # a failed start leaves no half-made run folder
            lock.close()
            discard_run_folder(out)
        raise
    finally:
        lock.close()
    plot_training(out / "diagnostics.jsonl", out / "training.png", hindsight=config.resolved_hindsight())

    stopped = next((c.stop_reason for c in callbacks if getattr(c, "stop_reason", None)), None)
    _evaluate_run(config, model, out, stopped)
    print(f"\nrun folder: {out}")
    return out


def train_concurrently(configs: list[RunConfig], callbacks: list[Any] | None = None,
                       processes: bool = False) -> list[Path]:
    """:func:`train` of several runs at once: one thread each in this process, on a CUDA stream of its own
    (:mod:`sb3_her_ext.concurrent`), or with ``processes`` one fresh process each. Each run folder ends as
    :func:`train` alone makes it with the same config (a model's draws come from its own generators). On
    one GPU, threads take about the sum of the runs' walls (their host work shares the GIL); processes
    overlap (``benchmarks/concurrent_seeds.py``). When a run in a thread fails, the others stop at their
    next step; runs in processes run to their end.

    :param configs: the runs (seeded: ``seed`` set, or their results are not reproducible anyway).
    :param callbacks: per run, SB3 callback(s) for its ``learn`` (None: none; threads only).
    :param processes: one spawned process per run instead of a thread.
    :return: the run folders, in order.
    :raises sb3_her_ext.ConcurrentTrainingError: naming the run (index and seed) that failed.
    """
    import threading

    from sb3_her_ext.concurrent import StopOnEvent, run_concurrently, run_in_processes

    callbacks = [None] * len(configs) if callbacks is None else list(callbacks)
    if len(callbacks) != len(configs):
        raise ValueError(f"callbacks has {len(callbacks)} entries for {len(configs)} configs")
    if processes and any(callback is not None for callback in callbacks):
        raise ValueError("train_concurrently: callbacks live in this process; with processes=True pass none")
    _check_fit_together(configs)
    names = [f"run {i} (seed {config.seed})" for i, config in enumerate(configs)]
    if processes:
        return run_in_processes(train, [(config,) for config in configs], names)
    stop = threading.Event()
    tasks = [lambda config=config, callback=callback: train(config, [StopOnEvent(stop), callback])
             for config, callback in zip(configs, callbacks, strict=True)]
    return run_concurrently(tasks, names, [config.device for config in configs], stop.set)


def _check_fit_together(configs: list[RunConfig]) -> None:
    """Each config's checks, then the runs' memory together against each device's free memory.

    :raises ValueError: one line naming the field, or how many runs do not fit at once.
    """
    import torch as th

    from foxhunt.preflight import free_memory, run_memory

    needs: dict[str, float] = {}
    for config in configs:
        config.check()  # each alone first: names its own field
        device = str(th.device(config.device))
        needs[device] = needs.get(device, 0.0) + sum(size for _, size in run_memory(config).values())
    for device, need in needs.items():
        free = free_memory(device)
        if free is not None and need > free:
            runs = sum(str(th.device(config.device)) == device for config in configs)
            raise ValueError(f"train_concurrently: {runs} runs on {device} need about {need / 1e9:,.3g} GB "
                             f"together and it has {free / 1e9:,.3g} GB free; train fewer at once")


def _evaluate_run(config: RunConfig, model: Any, out: Path, stopped: str | None = None) -> None:
    """The final evaluation of ``train``: ``foxhunt evaluate``'s code on the run's held-out data; ``stopped``
    says why training ended before its steps (a time limit), in the report's title and the output."""
    from foxenv.config import split_env_kwargs
    from foxhunt.evaluation.api import evaluate_policies
    from foxhunt.evaluation.report import held_out_line, print_evaluation, write_report

    synthetic = config.data == "synthetic"
    config_kwargs, market_kwargs = split_env_kwargs(config.resolved_env_kwargs())
    market_kwargs.pop("market_seed", None)
    if synthetic:
        market_kwargs.setdefault("num_steps", config.synthetic_market_steps)
    if config.env.task == "execute":  # scored by shortfall against the execution baselines
        from foxhunt.evaluation.execution_report import evaluate_execution_run

        evaluate_execution_run(model, out, config.data, config_kwargs, market_kwargs,
                               fit_seed=train_market_seed(config), held_out_seed=eval_market_seed(config),
                               fit_split=config.train_split(), held_out_split=config.eval_split,
                               device=config.device)
        return
    evaluation = evaluate_policies(
        {"policy": model}, config.data, n_envs=config.n_envs, steps=config.eval_steps,
        seed=eval_seed(config), market_seed=eval_market_seed(config),
        train_market_seed=train_market_seed(config) if synthetic else None,
        split=config.eval_split, env_kwargs=config_kwargs, market_kwargs=market_kwargs, device=config.device,
    )
    note = "; ".join(text for text in (stopped, smoke_test_note(config)) if text)
    title = f"Evaluation of {out / 'model.zip'}" + (f" ({note})" if note else "")
    write_report(evaluation, out, "policy", title)
    held_out = held_out_line(evaluation.setup)
    print_evaluation(evaluation, "policy", f"evaluation: deterministic policy, {held_out}, "
                     f"{evaluation.setup['vector_steps']} steps x {evaluation.setup['books']} books")
    if note:
        print(f"\nnote: {note}")


def smoke_test_note(config: RunConfig) -> str | None:
    """What a run of at most ``foxhunt train``'s CPU budget is, said in its report and output; ``None`` for a
    longer run."""
    if config.steps > RunConfig().steps:
        return None
    return (f"a smoke test: {config.steps:,} env steps check the pipeline end to end, they do not train a "
            "trader (README: What the default run is)")
