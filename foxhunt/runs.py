"""Training runs: one :class:`RunConfig` holds every knob of a run; :func:`train` turns it into a run folder.

A run folder holds::

    config.json        the RunConfig (``RunConfig.load`` reads it back)
    model.zip          the trained model (``BranchingIQN.load``)
    diagnostics.jsonl  one line of training diagnostics per interval
    training.png       episode reward, losses, hindsight counts, ε
    tb/                TensorBoard logs
    evaluation.json    the evaluation of the greedy policy and the baselines on held-out data
    report.md          the same as a report, with eval_*.png figures
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch as th

from foxhunt import presets


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
    hindsight: bool = True
    """Hindsight replay injections on trade closes."""
    eval_steps: int = 500
    """Vector steps of the final evaluation."""
    cuda_graph: bool | None = None
    """Each gradient step as one CUDA graph replay; ``None``: on exactly when the device is CUDA."""
    progress: bool = True
    """Show a progress bar."""
    out: str | None = None
    """Run folder; ``None``: ``runs/<timestamp>``."""
    synthetic_market_steps: int = presets.SYNTHETIC_MARKET_STEPS
    """Steps of each generated synthetic market."""
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    """Overrides of BranchingIQN's arguments (``learning_rate``, ``gamma``, ...)."""
    policy_kwargs: dict[str, Any] = field(default_factory=dict)
    """Overrides of the policy's arguments (``net_arch``, ``n_ensemble``, ...)."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Overrides of the env's arguments (``episode_length``, fees, ...)."""

    def __post_init__(self) -> None:
        for name in ("steps", "n_envs", "threads", "eval_steps", "synthetic_market_steps", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"RunConfig.{name}={value!r} must be an integer")
        for name, least in (("steps", 1), ("n_envs", 1), ("threads", 1), ("eval_steps", 2),
                            ("synthetic_market_steps", 2)):
            if getattr(self, name) < least:
                raise ValueError(f"RunConfig.{name}={getattr(self, name)} must be >= {least}")
        if not 0 <= self.seed < 2**32:
            raise ValueError(f"RunConfig.seed={self.seed} must lie in [0, 2**32)")
        for name in ("model_kwargs", "policy_kwargs", "env_kwargs"):
            if not isinstance(getattr(self, name), dict):
                raise ValueError(f"RunConfig.{name}={getattr(self, name)!r} must be a dict")

    # ---------------------------------------------------------------- resolved settings

    def resolved_cuda_graph(self) -> bool:
        """Whether gradient steps run as CUDA graphs (``cuda_graph``, or the device's default)."""
        on_cuda = th.device(self.device).type == "cuda"
        graph = on_cuda if self.cuda_graph is None else self.cuda_graph
        if graph and not on_cuda:
            raise ValueError(f"RunConfig.cuda_graph=True needs a CUDA device, got device={self.device!r}")
        return graph

    def resolved_model_kwargs(self) -> dict[str, Any]:
        """BranchingIQN's keyword arguments: presets, scaled to short runs, then the overrides."""
        base = presets.MODEL_KWARGS
        model_kwargs = {
            **base,
            **presets.trading_algorithm_kwargs(),
            "learning_starts": min(base["learning_starts"], max(self.steps // 4, self.n_envs)),
            "diagnostics_interval": min(base["diagnostics_interval"], max(self.steps // 4, 1)),
        }
        model_kwargs.update(self.model_kwargs)
        return model_kwargs

    def resolved_policy_kwargs(self) -> dict[str, Any]:
        """The policy's keyword arguments: presets, then the overrides."""
        return {**presets.POLICY_KWARGS, **presets.trading_policy_kwargs(), **self.policy_kwargs}

    def resolved_env_kwargs(self) -> dict[str, Any]:
        """The env's keyword arguments: presets, then the overrides."""
        return {**presets.ENV_KWARGS, **self.env_kwargs}

    # ---------------------------------------------------------------- JSON

    def to_dict(self) -> dict[str, Any]:
        """The config as plain JSON-able values."""
        return dataclasses.asdict(self)

    def save(self, path: str | Path) -> Path:
        """Write the config as JSON.

        :param path: the file (``config.json`` of a run folder).
        :return: the path written.
        """
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), indent=2))
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
    :param split: ``"train"`` or ``"test"``.
    :return: a :class:`~foxhunt.envs.LOBVecEnv`.
    """
    from foxhunt.envs import LOBVecEnv

    env_kwargs = config.resolved_env_kwargs()
    if config.data == "synthetic":
        return LOBVecEnv(config.n_envs, device=config.device, seed=seed, data="synthetic",
                         num_steps=config.synthetic_market_steps, **env_kwargs)
    if not Path(config.data).is_dir():
        raise ValueError(f"data={config.data!r} must be 'synthetic' or a folder of LOBSTER files")
    from foxenv.data import load_market

    market = load_market(config.data, split=split, device=config.device)
    # a short split (the LOBSTER sample's test split has ~300 steps) gets episodes that fit in it
    env_kwargs["episode_length"] = min(env_kwargs["episode_length"], market.num_steps - 1)
    return LOBVecEnv(config.n_envs, device=config.device, seed=seed, data=market, **env_kwargs)


def eval_seed(config: RunConfig) -> int:
    """The seed of the held-out evaluation's episode windows and random baseline."""
    return config.seed + 1000


def train_market_seed(config: RunConfig) -> int:
    """The synthetic training market's generator seed (``env_kwargs["market_seed"]``, default 0)."""
    return int(config.resolved_env_kwargs().get("market_seed", 0) or 0)


def eval_market_seed(config: RunConfig) -> int:
    """The synthetic evaluation market's generator seed: another market than the training one."""
    return train_market_seed(config) + 1


def train(config: RunConfig, callback: Any = None) -> Path:
    """Train BranchingIQN as ``config`` says, write the run folder, evaluate the greedy policy.

    :param config: the run's settings.
    :param callback: SB3 callback(s) passed to ``model.learn`` (an Optuna pruning callback, say).
    :return: the run folder.
    """
    from foxhunt.evaluation.plots import plot_training
    from sb3_her_ext.algorithm import BranchingIQN

    # config.json records whether the steps were graphed
    config = dataclasses.replace(config, cuda_graph=config.resolved_cuda_graph())
    th.set_num_threads(config.threads)
    out = Path(config.out) if config.out else Path("runs") / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    config.save(out / "config.json")

    env = make_env(config, config.seed, split="train")
    model = BranchingIQN(
        "MlpPolicy", env, seed=config.seed, device=config.device, hindsight=config.hindsight,
        cuda_graph=config.cuda_graph, policy_kwargs=config.resolved_policy_kwargs(),
        tensorboard_log=str(out / "tb"), diagnostics_path=str(out / "diagnostics.jsonl"),
        **config.resolved_model_kwargs(),
    )
    model.learn(config.steps, callback=callback, progress_bar=config.progress)
    model.log_diagnostics()  # the last, partial interval
    model.save(out / "model.zip")
    plot_training(out / "diagnostics.jsonl", out / "training.png")

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
        split="test", env_kwargs=config_kwargs, market_kwargs=market_kwargs, device=config.device,
    )
    write_report(evaluation, out, "policy", f"Evaluation of {out / 'model.zip'}")
    held_out = held_out_line(evaluation.setup)
    print_evaluation(evaluation, "policy", f"evaluation: deterministic policy, {held_out}, "
                     f"{config.eval_steps} steps x {evaluation.setup['books']} books")
