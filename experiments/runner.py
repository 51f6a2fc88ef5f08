"""Training an agent through :mod:`foxhunt.runs`: the experiment's shared settings (:class:`Setup`) give each
agent its :class:`~foxhunt.runs.RunConfig`; BranchingIQN agents train with :func:`foxhunt.runs.train` (a run
folder with the model, config, diagnostics, training plot and the run's own held-out evaluation), DQN and
QR-DQN on the env :func:`foxhunt.runs.make_env` builds for the same config on the joint face.

Each run folder ``<out>/<agent>/seed<k>/`` also gets ``run.json`` (agent, config, seconds, learning curve,
loop): a later ``--reuse`` loads the run instead of training it again when agent and config are unchanged.

:func:`train_all` trains a list of runs, BranchingIQN runs up to ``concurrent`` at once
(``--concurrent-seeds``): in this process, one thread and CUDA stream each (:mod:`sb3_her_ext.concurrent`), or
with ``processes`` one fresh process each (``--processes``: their host work overlaps, where threads share the
GIL; on one H200 five seeds in processes took the wall of one, in threads 6x:
``benchmarks/concurrent_seeds.py``); each run ends as it ends trained alone. DQN / QR-DQN always one at a time
(SB3's DQN draws its ε-greedy coin from numpy's process-wide generator).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from stable_baselines3.common.callbacks import BaseCallback

from experiments.agents import SHARED_DQN_KWARGS, Agent, algorithm_classes
from foxhunt.runs import RunConfig

#: The two training loops a run can record: BranchingIQN's device loop, SB3's numpy loop.
LOOP_DEVICE, LOOP_SB3 = "device", "sb3"
#: Learning-curve points per run (and BranchingIQN diagnostics lines: the device loop reads the episode
#: statistics at each).
CURVE_POINTS = 40


@dataclass
class Setup:
    """What every agent of an experiment shares: the markets, the budget and the held-out evaluation.

    :param data: ``"synthetic"`` or a LOBSTER folder (trained on its train split, scored on its test split).
    :param signal_strength: synthetic: the planted signal's strength (0 = none; > 0 adds the oracle).
    :param signal_horizon: synthetic: the planted signal's horizon.
    :param market: synthetic: more :class:`~foxenv.data.SyntheticProfile` knobs of both markets (the waves:
        ``{"wave_rate": 0.02}`` adds the wave oracle).
    :param market_steps: synthetic: steps of each generated market.
    :param train_market_seed: synthetic: the training market's seed.
    :param eval_market_seed: synthetic: the held-out market's seed (``None``: the training one's + 1, the
        market :func:`foxhunt.runs.train` scores on).
    :param step_events: LOBSTER: messages per step (``None``: ``load_market``'s default).
    :param steps: environment steps of training (summed over books).
    :param n_envs: books stepped together.
    :param device: ``"cpu"`` or ``"cuda"``.
    :param threads: torch CPU threads.
    :param device_loop: BranchingIQN agents collect through the device loop (``None``: on exactly on CUDA,
        as ``foxhunt train``); DQN / QR-DQN always run SB3's loop.
    :param model_kwargs: model overrides of every agent (``learning_rate``, ``batch_size``, ...).
    :param net_arch: hidden widths of every agent (``None``: the presets).
    :param env_kwargs: env settings (``foxenv.config.EnvConfig`` fields) over the presets, for training and
        evaluation alike.
    :param eval_envs: held-out books (``None``: synthetic 16, LOBSTER the test split walked once).
    :param eval_steps: held-out vector steps (``None``: one episode).
    :param eval_seed: seed of the held-out windows and the random baseline (the same for every agent).
    """

    data: str = "synthetic"
    signal_strength: float = 0.0
    signal_horizon: int = 1
    market: dict[str, Any] = field(default_factory=dict)
    market_steps: int = 20_000
    train_market_seed: int = 0
    eval_market_seed: int | None = None
    step_events: int | None = None
    steps: int = 20_000
    n_envs: int = 8
    device: str = "cpu"
    threads: int = 1
    device_loop: bool | None = None
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    net_arch: list[int] | None = None
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    eval_envs: int | None = 16
    eval_steps: int | None = None
    eval_seed: int = 1000

    def __post_init__(self) -> None:
        if self.eval_market_seed is None:
            self.eval_market_seed = self.train_market_seed + 1
        if self.synthetic and self.train_market_seed == self.eval_market_seed:
            raise ValueError(f"eval_market_seed={self.eval_market_seed} equals the training market's seed")
        if not self.synthetic and not Path(self.data).is_dir():
            raise ValueError(f"data={self.data!r} must be 'synthetic' or a LOBSTER folder")
        if self.synthetic and self.step_events is not None:
            raise ValueError(f"step_events={self.step_events}: only a LOBSTER market has messages per step")
        if not self.synthetic and (self.signal_strength or self.market):
            raise ValueError(f"signal_strength={self.signal_strength}, market={self.market}: a planted "
                             "signal and profile knobs need synthetic data")
        if self.device_loop is not None and not isinstance(self.device_loop, bool):
            raise ValueError(f"device_loop={self.device_loop!r} must be a bool or None")
        self.config(Agent("check"), 0)  # RunConfig names a bad setting before anything trains

    @property
    def synthetic(self) -> bool:
        """Whether the market is generated."""
        return self.data == "synthetic"

    @property
    def waves(self) -> bool:
        """Whether the market has planted waves (the wave oracle joins the baselines)."""
        return self.synthetic and float(self.market.get("wave_rate", 0.0) or 0.0) > 0

    @property
    def planted(self) -> bool:
        """Whether the market has a planted signal or waves (an oracle joins the baselines)."""
        return self.synthetic and (self.signal_strength > 0 or self.waves)

    def market_kwargs(self) -> dict[str, Any]:
        """The market's options (synthetic: the planted signal and ``market``'s knobs; LOBSTER: messages per
        step)."""
        if not self.synthetic:
            return {} if self.step_events is None else {"step_events": self.step_events}
        return {"signal_strength": self.signal_strength, "signal_horizon": self.signal_horizon, **self.market}

    def config(self, agent: Agent, seed: int, out: Path | None = None) -> RunConfig:
        """The :class:`RunConfig` agent ``agent`` trains with (the peers: the config of their env and of the
        arguments they share with BranchingIQN)."""
        iqn = agent.algorithm == "iqn"
        model = {**self.model_kwargs, **(agent.model if iqn else {})}
        hindsight = model.pop("hindsight", None)
        policy = {"net_arch": list(self.net_arch)} if self.net_arch else {}
        market = {"market_seed": self.train_market_seed} if self.synthetic else {}
        return RunConfig(
            data=self.data, steps=self.steps, n_envs=self.n_envs, device=self.device, seed=seed,
            threads=self.threads,
            hindsight=hindsight, action_face=agent.action_face, progress=False, checkpoint_every=0,
            out=None if out is None else str(out), synthetic_market_steps=self.market_steps,
            device_loop=self.device_loop if iqn else False, eval_steps=self.eval_steps or 500,
            model_kwargs={"diagnostics_interval": max(self.steps // CURVE_POINTS, 1), **model},
            policy_kwargs={**policy, **(agent.policy if iqn else {})},
            env_kwargs={**self.env_kwargs, **self.market_kwargs(), **market},
        )

    def loop_of(self, agent: Agent) -> str:
        """The collection loop ``agent`` trains with: ``"device"`` or ``"sb3"``."""
        return LOOP_DEVICE if self.config(agent, 0).resolved_device_loop() else LOOP_SB3

    def describe(self) -> str:
        """One line naming the markets."""
        if not self.synthetic:
            return f"LOBSTER {self.data}: train split -> test split"
        signal = (f"planted signal strength {self.signal_strength}, horizon {self.signal_horizon}"
                  if self.signal_strength > 0 else "no planted signal")
        if self.market:
            signal += ", " + ", ".join(f"{k} {v:g}" if isinstance(v, int | float) else f"{k} {v}"
                                       for k, v in self.market.items())
        return (f"synthetic ({signal}), markets of {self.market_steps} steps: train market seed "
                f"{self.train_market_seed} -> held-out market seed {self.eval_market_seed}")


class CurveCallback(BaseCallback):
    """Records ``(env steps, mean episode reward of the recent episodes)`` about :data:`CURVE_POINTS` times a
    run and calls ``at_checkpoint(model, k)`` at each of ``checkpoints`` equal fractions of the budget (the
    last one at the end of training). Under the device loop the episode statistics are read at the model's
    diagnostics interval, so a point may lag its step by that much.

    :param total_steps: the run's step budget.
    :param checkpoints: how many checkpoints.
    :param at_checkpoint: called with the model and the checkpoint's index.
    """

    def __init__(self, total_steps: int, checkpoints: int = 0,
                 at_checkpoint: Callable[[Any, int], None] | None = None) -> None:
        super().__init__()
        self.every = max(int(total_steps) // CURVE_POINTS, 1)
        self.next = self.every
        self.curve: list[tuple[int, float]] = []
        self.marks = [round(total_steps * (k + 1) / checkpoints) for k in range(checkpoints)]
        self.at_checkpoint = at_checkpoint
        self.done = 0

    def _on_step(self) -> bool:
        if self.num_timesteps >= self.next:
            self.next += self.every
            episodes = [info["r"] for info in self.model.ep_info_buffer]
            if episodes:
                self.curve.append((int(self.num_timesteps), float(np.mean(episodes))))
        while (self.at_checkpoint is not None and self.done < len(self.marks) - 1
               and self.num_timesteps >= self.marks[self.done]):
            self.at_checkpoint(self.model, self.done)
            self.done += 1
        return True

    def _on_training_end(self) -> None:
        if self.at_checkpoint is not None and self.done < len(self.marks):
            self.at_checkpoint(self.model, self.done)
            self.done += 1


@dataclass
class TrainedRun:
    """One trained agent: the model, its learning curve, training seconds, folder and collection loop."""

    agent: str
    seed: int
    model: Any
    curve: list[tuple[int, float]]
    seconds: float
    folder: Path
    loop: str = LOOP_SB3


def _record(agent: Agent, config: RunConfig) -> dict[str, Any]:
    """What decides whether a finished run can be reused: the agent and its config (JSON values)."""
    return json.loads(json.dumps({"agent": agent.record(), "config": config.to_dict()}))


def train(agent: Agent, seed: int, setup: Setup, folder: Path, callback: BaseCallback | None = None) -> (
    TrainedRun
):
    """Train ``agent`` with ``seed`` into ``folder`` (replaced when it exists).

    :param callback: an SB3 callback (a :class:`CurveCallback` when given; one is made otherwise).
    :return: the trained run.
    """
    from foxhunt import runs

    config = setup.config(agent, seed, folder)
    curve = callback if isinstance(callback, CurveCallback) else CurveCallback(setup.steps)
    callbacks = [curve] if callback is None or callback is curve else [curve, callback]
    if folder.exists():
        shutil.rmtree(folder)
    if agent.algorithm != "iqn":  # BranchingIQN seeds itself when it is built (under the build lock)
        torch.manual_seed(seed)
    start = time.time()
    if agent.algorithm == "iqn":
        runs.train(config, callbacks)
        model = algorithm_classes("iqn")[0].load(folder / "model.zip", device=setup.device)
    else:
        model = build(agent, seed, setup)
        model.learn(config.steps, callback=callbacks)
        folder.mkdir(parents=True)
        model.save(folder / "model.zip")
        config.save(folder / "config.json")
    seconds = time.time() - start
    loop = setup.loop_of(agent)
    (folder / "run.json").write_text(json.dumps(
        {**_record(agent, config), "seed": seed, "seconds": seconds, "curve": curve.curve, "loop": loop},
        indent=2))
    return TrainedRun(agent.name, seed, model, curve.curve, seconds, folder, loop)


def train_in_process(agent: Agent, seed: int, setup: Setup, folder: Path) -> TrainedRun:
    """:func:`train` in a worker process (:func:`sb3_her_ext.concurrent.run_in_processes`): the run without
    its model, which stays in the worker (the caller loads it from ``folder``)."""
    run = train(agent, seed, setup, folder)
    run.model = None
    return run


def train_all(jobs: Sequence[tuple[Agent, int, Path]], setup: Setup, concurrent: int = 1,
              callbacks: Sequence[BaseCallback | None] | None = None,
              on_done: Callable[[TrainedRun], None] | None = None,
              processes: bool = False) -> list[TrainedRun]:
    """:func:`train` of every ``(agent, seed, folder)`` job, in order; BranchingIQN jobs in batches of up to
    ``concurrent`` trained at once (see the module docstring), the others one at a time.

    :param jobs: the runs.
    :param setup: the shared settings.
    :param concurrent: BranchingIQN runs trained at once; >= 1.
    :param callbacks: per job, an SB3 callback (as :func:`train`'s), or None.
    :param on_done: called with each finished run (a batch's runs when the batch has ended).
    :param processes: a batch's runs in fresh processes, one each, instead of threads (no ``callbacks``).
    :return: the trained runs, in the jobs' order.
    :raises sb3_her_ext.ConcurrentTrainingError: a run of a batch failed (naming its agent and seed; raised
        when the batch's other runs have ended).
    """
    from sb3_her_ext.concurrent import run_concurrently, run_in_processes

    if isinstance(concurrent, bool) or not isinstance(concurrent, int) or concurrent < 1:
        raise ValueError(f"concurrent={concurrent!r} must be an integer >= 1")
    callbacks = [None] * len(jobs) if callbacks is None else list(callbacks)
    if processes and any(callback is not None for callback in callbacks):
        raise ValueError("train_all: callbacks live in this process; with processes=True pass none")
    done: dict[int, TrainedRun] = {}
    batch: list[int] = []

    def flush() -> None:
        tasks = [lambda i=i: train(jobs[i][0], jobs[i][1], setup, jobs[i][2], callbacks[i]) for i in batch]
        names = [f"{jobs[i][0].name} seed {jobs[i][1]}" for i in batch]
        if processes:
            arguments = [(jobs[i][0], jobs[i][1], setup, jobs[i][2]) for i in batch]
            trained = run_in_processes(train_in_process, arguments, names)
            for run in trained:
                run.model = algorithm_classes("iqn")[0].load(run.folder / "model.zip", device=setup.device)
        else:
            trained = run_concurrently(tasks, names, [setup.device] * len(batch))
        for i, run in zip(batch, trained, strict=True):
            done[i] = run
            if on_done is not None:
                on_done(run)
        batch.clear()

    for i, (agent, seed, folder) in enumerate(jobs):
        if agent.algorithm == "iqn" and (concurrent > 1 or processes):
            batch.append(i)
            if len(batch) == concurrent:
                flush()
            continue
        done[i] = train(agent, seed, setup, folder, callbacks[i])
        if on_done is not None:
            on_done(done[i])
    if batch:
        flush()
    return [done[i] for i in range(len(jobs))]


def build(agent: Agent, seed: int, setup: Setup) -> Any:
    """An untrained model of ``agent`` on its training env (:func:`foxhunt.runs.make_env` of its config),
    built as :func:`foxhunt.runs.train` builds BranchingIQN; DQN / QR-DQN take the arguments they share with
    BranchingIQN from the same config, then the agent's own (for callers that drive ``learn`` themselves)."""
    from foxhunt.runs import make_env

    config = setup.config(agent, seed)
    model_cls, _ = algorithm_classes(agent.algorithm)
    env = make_env(config, seed, config.train_split())
    model_kwargs, policy_kwargs = config.resolved_model_kwargs(), config.resolved_policy_kwargs()
    if agent.algorithm == "iqn":
        return model_cls("MlpPolicy", env, seed=seed, device=config.device,
                         cuda_graph=config.resolved_cuda_graph(), policy_kwargs=policy_kwargs, **model_kwargs)
    kwargs = {**{k: model_kwargs[k] for k in SHARED_DQN_KWARGS if k in model_kwargs}, **agent.model}
    policy = {"net_arch": list(policy_kwargs["net_arch"]), **agent.policy}
    return model_cls("MlpPolicy", env, seed=seed, device=config.device, policy_kwargs=policy, **kwargs)


def load(agent: Agent, seed: int, setup: Setup, folder: Path) -> TrainedRun | None:
    """The run :func:`train` finished in ``folder`` with the same agent and config, loaded, or None."""
    path = folder / "run.json"
    if not (folder / "model.zip").is_file() or not path.is_file():
        return None
    record = json.loads(path.read_text())
    if {k: record.get(k) for k in ("agent", "config")} != _record(agent, setup.config(agent, seed, folder)):
        return None
    model = algorithm_classes(agent.algorithm)[0].load(folder / "model.zip", device=setup.device)
    return TrainedRun(agent.name, seed, model, [tuple(p) for p in record["curve"]], float(record["seconds"]),
                      folder, record["loop"])
