"""The evaluation API: score a model or a baseline (or several, on the same windows) on a held-out market.

Example::

    from foxhunt.evaluation import evaluate, evaluate_policies
    from sb3_her_ext import BranchingIQN

    model = BranchingIQN.load("runs/demo/model.zip")
    result = evaluate(model, data="synthetic", market_seed=1, n_envs=16, steps=1000, seed=0)
    print(result.metrics["pnl"], result.metrics["sharpe"])          # currency, per-step ratio
    equity = result.series["equity"]                                  # [steps, books] on the device

    report = evaluate_policies({"iqn": model}, data="synthetic", market_seed=1,
                               baselines=("flat", "random", "buy_and_hold"))
    print(report.comparisons["iqn"])   # mean per-episode PnL difference vs each baseline, bootstrap CI
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from foxenv.config import EnvConfig
from foxenv.data.market import MarketData
from foxhunt.evaluation.baselines import BASELINES, OraclePolicy, as_policy, make_baseline
from foxhunt.evaluation.metrics import compute_metrics, paired_comparison
from foxhunt.evaluation.recorder import Recording, record

#: Steps of a generated synthetic evaluation market when none is given.
DEFAULT_SYNTHETIC_STEPS = 20_000
#: Baselines run beside every evaluated model by default (the oracle joins on a planted-signal market).
DEFAULT_BASELINES = ("flat", "random", "buy_and_hold")
#: Books of a synthetic evaluation when none are given.
DEFAULT_SYNTHETIC_BOOKS = 16
_CONFIG_FIELDS = {f.name for f in dataclasses.fields(EnvConfig)}


@dataclass
class EvaluationResult:
    """One policy's evaluation: its metrics (see :data:`~foxhunt.evaluation.metrics.UNITS`) and series."""

    name: str
    metrics: dict[str, Any]
    series: dict[str, torch.Tensor]
    """Per-step ``[steps, books]`` device tensors (:data:`~foxhunt.evaluation.recorder.SERIES`)."""
    recording: Recording
    setup: dict[str, Any] = field(default_factory=dict)
    """The evaluation's setup (:attr:`Evaluation.setup`)."""


@dataclass
class Evaluation:
    """Several policies on the same windows: results by name, paired comparisons and the setup."""

    results: dict[str, EvaluationResult]
    comparisons: dict[str, list[dict[str, Any]]]
    """For each non-baseline policy, one :func:`paired_comparison` per baseline."""
    setup: dict[str, Any] = field(default_factory=dict)
    """Data, split, market seeds, books, steps, episode length, independent steps, step clock."""

    def to_json(self) -> dict[str, Any]:
        """The metrics, comparisons and setup as plain JSON-able values (no series)."""
        return {
            "setup": self.setup,
            "policies": {name: result.metrics for name, result in self.results.items()},
            "comparisons": self.comparisons,
        }


def split_env_kwargs(env_kwargs: Mapping[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split a run's env kwargs into :class:`~foxenv.config.EnvConfig` fields and market options.

    :param env_kwargs: a run's ``resolved_env_kwargs()`` (or any mix of the two).
    :return: ``(config fields, market options)``; ``market_seed`` stays among the market options.
    """
    env_kwargs = dict(env_kwargs or {})
    config = {k: v for k, v in env_kwargs.items() if k in _CONFIG_FIELDS}
    market = {k: v for k, v in env_kwargs.items() if k not in _CONFIG_FIELDS}
    return config, market


def build_market(data: str | Path | MarketData = "synthetic", *, split: str = "test", market_seed: int = 1,
                 device: str | torch.device = "cpu", **market_kwargs: Any) -> MarketData:
    """The evaluation market.

    :param data: ``"synthetic"``, a LOBSTER folder, or a :class:`MarketData` (returned as is).
    :param split: LOBSTER: a :data:`foxenv.data.SPLITS` name (``"test"``, ``"train"``, ``"all"``, and the
        train split's ``"fit"`` / ``"validation"`` parts) (synthetic: ignored; the market seed holds it out).
    :param market_seed: synthetic: the generator's seed (use one the model was not trained on).
    :param device: device of the tensors.
    :param market_kwargs: synthetic: ``num_steps`` (default 20,000), ``levels`` and any
        :class:`~foxenv.data.SyntheticProfile` knob (``signal_strength``, ``signal_horizon``, ...);
        LOBSTER: ``foxenv.data.load_market`` options (``levels``, ``step_events``, ``num_steps``, ...).
    :return: the market on ``device``.
    """
    if isinstance(data, MarketData):
        return data.to(device)
    if str(data) == "synthetic":
        from foxenv.data import generate_synthetic

        kwargs = dict(market_kwargs)
        steps = kwargs.pop("num_steps", None) or DEFAULT_SYNTHETIC_STEPS
        return generate_synthetic(int(steps), seed=int(market_seed), device=device, **kwargs)
    if not Path(data).is_dir():
        raise ValueError(f"data={str(data)!r} must be 'synthetic', a LOBSTER folder or a MarketData")
    from foxenv.data import load_market

    return load_market(str(data), split=split, device=device, **market_kwargs)


def _oracle_for(market_kwargs: Mapping[str, Any], env_config: Mapping[str, Any]) -> OraclePolicy | None:
    strength = float(market_kwargs.get("signal_strength", 0.0) or 0.0)
    if strength <= 0:
        return None
    config = EnvConfig(**env_config)
    knobs = {k: market_kwargs[k] for k in ("vol_ticks",) if k in market_kwargs}
    return OraclePolicy(strength, int(market_kwargs.get("signal_horizon", 1)), levels=config.levels,
                        taker_fee_bps=config.taker_fee_bps,
                        tick_size=float(market_kwargs.get("tick_size", 0.01)),
                        price=float(market_kwargs.get("start_price", 580.0)), **knobs)


def evaluate_policies(
    policies: Mapping[str, Any] | Iterable[Any],
    data: str | Path | MarketData = "synthetic",
    *,
    baselines: Iterable[str] = DEFAULT_BASELINES,
    n_envs: int | None = None,
    steps: int | None = None,
    seed: int = 0,
    market_seed: int = 1,
    train_market_seed: int | None = None,
    split: str = "test",
    env_kwargs: Mapping[str, Any] | None = None,
    market_kwargs: Mapping[str, Any] | None = None,
    device: str | torch.device = "cpu",
    progress: bool = False,
) -> Evaluation:
    """Record every policy and baseline on the same books and windows of one market, score and compare them.

    :param policies: models (anything with ``predict``) or recorder policies, by name (a mapping) or not.
    :param data: ``"synthetic"``, a LOBSTER folder or a :class:`MarketData`.
    :param baselines: names from :data:`~foxhunt.evaluation.baselines.BASELINES`; the oracle is added on a
        synthetic market with ``signal_strength > 0`` in ``market_kwargs``.
    :param n_envs: books; ``None``: synthetic 16, LOBSTER as many disjoint episode windows as the split
        holds (with ``steps=None`` the split is then walked once, no window scored twice).
    :param steps: vector steps per policy; ``None``: one episode per book.
    :param seed: seeds the episode windows, the env and the random baseline.
    :param market_seed: synthetic: the evaluation market's generator seed.
    :param train_market_seed: synthetic: the training market's seed, recorded in the setup (and a
        ``ValueError`` when it equals ``market_seed``: that would not be held out).
    :param split: LOBSTER split.
    :param env_kwargs: :class:`~foxenv.config.EnvConfig` fields (market options found here are moved to
        ``market_kwargs``).
    :param market_kwargs: :func:`build_market`'s options.
    :param device: device of the envs and series.
    :param progress: progress bars.
    :return: the :class:`Evaluation`.
    """
    config_kwargs, extra_market = split_env_kwargs(env_kwargs)
    market_options = {**extra_market, **dict(market_kwargs or {})}
    market_options.pop("market_seed", None)
    synthetic = isinstance(data, str) and data == "synthetic"
    if synthetic and "levels" in config_kwargs:  # as the training env generates its market
        market_options.setdefault("levels", config_kwargs["levels"])
    if synthetic and train_market_seed is not None and int(train_market_seed) == int(market_seed):
        raise ValueError(f"market_seed={market_seed} equals the training market's seed: not held out")
    market = build_market(data, split=split, market_seed=market_seed, device=device, **market_options)
    length = int(config_kwargs.get("episode_length", EnvConfig().episode_length))
    if market.num_steps < length + 1:  # a short split gets episodes that fit in it (as training does)
        length = config_kwargs["episode_length"] = max(market.num_steps - 1, 1)
    if n_envs is None:
        n_envs = DEFAULT_SYNTHETIC_BOOKS if synthetic else max(1, (market.num_steps - 1) // length)

    if isinstance(policies, Mapping):
        items = [(str(name), policy) for name, policy in policies.items()]
    else:
        items = [(getattr(p, "name", None) or (p if isinstance(p, str) else f"model{i}"), p)
                 for i, p in enumerate(policies)]
    oracle = _oracle_for(market_options, config_kwargs) if synthetic else None
    named: dict[str, Any] = {}
    for name, policy in items:
        if isinstance(policy, str) and policy == "oracle":
            if oracle is None:
                raise ValueError("the oracle needs a synthetic market with signal_strength > 0")
            named[name] = oracle
        else:
            named[name] = as_policy(policy, name=name)
    baseline_names = [b for b in baselines if b != "oracle"]
    for name in baseline_names:
        if name not in BASELINES:
            raise ValueError(f"baselines holds {name!r}; known baselines are {BASELINES}")
    baseline_policies = {name: make_baseline(name, seed=seed) for name in baseline_names}
    if oracle is not None and not any(p is oracle for p in named.values()):
        baseline_policies["oracle"] = oracle
    elif "oracle" in tuple(baselines):
        raise ValueError("baselines holds 'oracle' but the market has no planted signal (signal_strength=0)")

    clash = sorted(set(named) & set(baseline_policies))
    if clash:
        raise ValueError(f"policies named {clash} clash with the baselines' names; rename them")
    results: dict[str, EvaluationResult] = {}
    for name, policy in {**named, **baseline_policies}.items():
        rec = record(policy, market, num_books=n_envs, num_steps=steps, seed=seed, env_kwargs=config_kwargs,
                     device=device, progress=progress)
        rec.policy = name
        results[name] = EvaluationResult(name, compute_metrics(rec), rec.series, rec)
    comparisons = {
        name: [paired_comparison(results[name].recording, results[b].recording, seed=seed)
               for b in baseline_policies]
        for name in named
    }
    first = next(iter(results.values())).recording
    setup = {
        "data": str(data) if not isinstance(data, MarketData) else data.name,
        "market": market.name,
        "split": split if not synthetic else None,
        "market_seed": int(market_seed) if synthetic else None,
        "train_market_seed": None if train_market_seed is None or not synthetic else int(train_market_seed),
        "market_steps": int(market.num_steps),
        "books": int(n_envs),
        "vector_steps": first.num_steps,
        "episode_length": first.episode_length,
        "episodes_per_book": int(first.offsets.shape[0]),
        "book_steps": first.num_steps * first.num_books,
        "independent_steps": first.independent_steps(),
        "seed": int(seed),
        "step_seconds": first.step_seconds,
        "step_seconds_source": "assumed: the synthetic profile's step_seconds" if synthetic
        else "measured: median clock gap between steps of the data",
        "env_config": dataclasses.asdict(EnvConfig(**config_kwargs)),
        "market_options": {k: v for k, v in market_options.items()},
        "device": str(device),
    }
    for result in results.values():
        result.setup = setup
    return Evaluation(results, comparisons, setup)


def evaluate(
    policy: Any,
    data: str | Path | MarketData = "synthetic",
    *,
    n_envs: int | None = None,
    steps: int | None = None,
    seed: int = 0,
    market_seed: int = 1,
    split: str = "test",
    env_kwargs: Mapping[str, Any] | None = None,
    market_kwargs: Mapping[str, Any] | None = None,
    device: str | torch.device = "cpu",
    name: str | None = None,
    progress: bool = False,
) -> EvaluationResult:
    """Evaluate one model or baseline (see :func:`evaluate_policies` for the arguments).

    :param policy: a model with ``predict``, a recorder policy, or a baseline name (``"flat"``, ...).
    :param name: its name in the result.
    :return: its :class:`EvaluationResult` (metrics and series).
    """
    label = name or (policy if isinstance(policy, str) else getattr(policy, "name", None) or "model")
    evaluation = evaluate_policies({label: policy}, data, baselines=(), n_envs=n_envs, steps=steps, seed=seed,
                                   market_seed=market_seed, split=split, env_kwargs=env_kwargs,
                                   market_kwargs=market_kwargs, device=device, progress=progress)
    return evaluation.results[label]
