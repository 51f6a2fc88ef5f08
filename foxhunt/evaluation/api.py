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

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from foxenv.config import EnvConfig, config_settings, split_env_kwargs
from foxenv.data.market import MarketData
from foxhunt.evaluation import stats
from foxhunt.evaluation.baselines import (
    BASELINES,
    IMBALANCE_ORDERS,
    IMBALANCE_THRESHOLDS,
    SIGNAL_BASELINES,
    ImbalancePolicy,
    OraclePolicy,
    WaveOraclePolicy,
    as_policy,
    make_baseline,
)
from foxhunt.evaluation.metrics import compute_metrics, episode_pnl
from foxhunt.evaluation.names import DEFAULT_BASELINES
from foxhunt.evaluation.recorder import Recording, record

#: Steps of a generated synthetic evaluation market when none is given.
DEFAULT_SYNTHETIC_STEPS = 20_000
#: Books of a synthetic evaluation when none are given.
DEFAULT_SYNTHETIC_BOOKS = 16


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
    """For each non-baseline policy, one :func:`~foxhunt.evaluation.stats.paired_windows` row per baseline
    (per-window differences, block-bootstrap CI, Holm-corrected p-value, verdict and power lines)."""
    setup: dict[str, Any] = field(default_factory=dict)
    """Data, split, market seeds, books, steps, episode length, independent steps, step clock."""

    def to_json(self) -> dict[str, Any]:
        """The metrics, comparisons and setup as plain JSON-able values (no series)."""
        return {
            "setup": self.setup,
            "policies": {name: result.metrics for name, result in self.results.items()},
            "comparisons": self.comparisons,
        }


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


def plan_windows(market_steps: int, episode_length: int, books: int | None, steps: int | None,
                 default_books: int) -> tuple[int, int, list[str]]:
    """Books and vector steps that keep every episode window disjoint from every other.

    A market of ``T`` rows holds ``(T - 1) // L`` disjoint windows of ``L`` steps. Books beyond that would
    replay the same rows (copies, not evidence), so they are cut to the windows the market holds, and so are
    the episodes per book; steps beyond one episode are cut to whole episodes (a 500-step book of 200-step
    windows is 2 windows, 400 steps, not 3); each cut is reported in the returned notes (and so in the
    report).

    :param market_steps: rows ``T``.
    :param episode_length: steps ``L`` of a window.
    :param books: books asked for (``None``: ``default_books``, cut to the windows).
    :param steps: vector steps asked for (``None``: one episode).
    :param default_books: books when none are asked for.
    :return: ``(books, steps, notes)``.
    """
    capacity = max(1, (market_steps - 1) // episode_length)
    notes: list[str] = []
    wanted_books = default_books if books is None else int(books)
    if wanted_books > capacity:
        if books is not None:
            notes.append(f"{books} books asked for, but the market's {market_steps:,} steps hold {capacity} "
                         f"disjoint window(s) of {episode_length} steps: {capacity} book(s), no copies")
        wanted_books = capacity
    wanted_steps = episode_length if steps is None else int(steps)
    episodes = -(-wanted_steps // episode_length)
    most = max(1, capacity // wanted_books)
    if episodes > most:
        notes.append(f"{wanted_steps:,} steps asked for x {wanted_books} books exceed the {capacity} "
                     f"disjoint window(s) of {episode_length} steps: {most} episode(s) per book")
        wanted_steps = most * episode_length
    elif wanted_steps > episode_length and wanted_steps % episode_length:  # windows are whole
        whole = wanted_steps // episode_length * episode_length
        notes.append(f"{wanted_steps:,} steps asked for are {wanted_steps / episode_length:.3g} windows of "
                     f"{episode_length} steps: {whole:,} steps per book, whole windows only")
        wanted_steps = whole
    return wanted_books, wanted_steps, notes


def _fit_market(data: str | Path | MarketData, split: str, market_seed: int, train_market_seed: int | None,
                device: str | torch.device, market_options: Mapping[str, Any]) -> MarketData:
    """The data a fitted baseline (the imbalance rule) is fitted on: never the evaluation data.

    LOBSTER: the split before the evaluated one (``"fit"`` for ``"validation"``, else ``"train"``); synthetic:
    the training market's seed (or another seed than the evaluation's); a given :class:`MarketData`: refused
    (pass ``fit_data``).
    """
    if isinstance(data, MarketData):
        raise ValueError("baselines holds 'imbalance' and data is a MarketData: pass fit_data= (the data the "
                         "rule is fitted on, not the evaluated one)")
    if str(data) == "synthetic":
        seed = train_market_seed if train_market_seed is not None else market_seed + 1
        return build_market("synthetic", market_seed=seed, device=device, **market_options)
    if split in ("test", "validation", "fit", "train"):
        fit_split = {"test": "train", "validation": "fit"}.get(split)
        if fit_split is None:
            raise ValueError(f"split={split!r}: the imbalance rule needs fit data before it; pass fit_data=")
        return build_market(data, split=fit_split, device=device, **market_options)
    raise ValueError(f"split={split!r}: the imbalance rule needs fit data outside it; pass fit_data=")


def _oracle_for(market_kwargs: Mapping[str, Any], env_config: Mapping[str, Any],
                market_seed: int | None = None, num_steps: int | None = None) -> (
                    OraclePolicy | WaveOraclePolicy | None):
    """The oracle of a synthetic market: on a market with waves (``wave_rate > 0``) the wave oracle, which
    knows the waves' timing (it needs ``market_seed`` and the market's ``num_steps``: ``market_kwargs``'
    or the default), else on a planted signal (``signal_strength > 0``) the signal oracle; None without
    either."""
    if float(market_kwargs.get("wave_rate", 0.0) or 0.0) > 0:
        from foxenv.data.synthetic import SyntheticProfile, wave_schedule

        if market_seed is None:
            raise ValueError("the wave oracle needs the market's seed (market_seed)")
        knobs = {k: v for k, v in market_kwargs.items() if k in SyntheticProfile.__dataclass_fields__}
        steps = num_steps or market_kwargs.get("num_steps") or DEFAULT_SYNTHETIC_STEPS
        return WaveOraclePolicy(wave_schedule(int(steps), int(market_seed), **knobs).hold,
                                grid=EnvConfig(**env_config).grid)
    strength = float(market_kwargs.get("signal_strength", 0.0) or 0.0)
    if strength <= 0:
        return None
    config = EnvConfig(**env_config)
    knobs = {k: market_kwargs[k] for k in ("vol_ticks",) if k in market_kwargs}
    return OraclePolicy(strength, int(market_kwargs.get("signal_horizon", 1)), levels=config.levels,
                        taker_fee_bps=config.taker_fee_bps, grid=config.grid,
                        tick_size=float(market_kwargs.get("tick_size", 0.01)),
                        price=float(market_kwargs.get("start_price", 580.0)), **knobs)


def default_baselines(data: str | Path | MarketData) -> tuple[str, ...]:
    """The baselines run beside a model by default: flat, random and buy-and-hold; on a LOBSTER folder also
    the baselines that read the same signal as the agent (the imbalance rule, fitted on the fit data, and
    the market maker), as ``experiments.real_data`` scores them.

    :param data: ``"synthetic"``, a LOBSTER folder or a :class:`MarketData`.
    :return: baseline names.
    """
    if isinstance(data, MarketData) or str(data) == "synthetic":
        return DEFAULT_BASELINES
    return DEFAULT_BASELINES + SIGNAL_BASELINES


def _named_policies(policies: Mapping[str, Any] | Iterable[Any], oracle: Any, grid: Any) -> dict[str, Any]:
    """The evaluated policies by name, as recorder policies (``"oracle"``: the market's oracle)."""
    if isinstance(policies, Mapping):
        items = [(str(name), policy) for name, policy in policies.items()]
    else:
        items = [(getattr(p, "name", None) or (p if isinstance(p, str) else f"model{i}"), p)
                 for i, p in enumerate(policies)]
    named: dict[str, Any] = {}
    for name, policy in items:
        if isinstance(policy, str) and policy == "oracle":
            if oracle is None:
                raise ValueError("the oracle needs a synthetic market with signal_strength > 0 or "
                                 "wave_rate > 0")
            named[name] = oracle
        else:
            named[name] = as_policy(policy, name=name, grid=grid)
    return named


def _fit_imbalance(fit_market: MarketData, config_kwargs: Mapping[str, Any], seed: int,
                   device: str | torch.device) -> tuple[ImbalancePolicy, dict[str, Any]]:
    """The imbalance rule fitted on ``fit_market`` and what the report says of the fit."""
    rule, scores = fit_imbalance_rule(fit_market, dict(config_kwargs), seed=seed, device=device)
    return rule, {"threshold": rule.threshold, "order": ("market", "limit_maker")[rule.order],
                  "fit_pnl": max(scores.values()), "fit_pnl_by_rule": scores,
                  "fit_market": fit_market.name, "fit_steps": int(fit_market.num_steps)}


def _baseline_policies(baselines: Iterable[str], named: Mapping[str, Any], oracle: Any, grid: Any, seed: int,
                       fit_imbalance: Callable[[], tuple[ImbalancePolicy, dict[str, Any]]]) -> (
                           tuple[dict[str, Any], dict[str, Any]]):
    """The baselines by name and the fitted ones' fit (``fit_imbalance`` is called only when the imbalance
    rule is asked for)."""
    baselines = tuple(baselines)
    for name in baselines:
        if name not in BASELINES:
            raise ValueError(f"baselines holds {name!r}; known baselines are {BASELINES}")
    policies: dict[str, Any] = {}
    fitted: dict[str, Any] = {}
    for name in (b for b in baselines if b != "oracle"):
        if name == "imbalance":
            policies[name], fitted[name] = fit_imbalance()
        else:
            policies[name] = make_baseline(name, seed=seed, grid=grid)
    if oracle is not None and not any(p is oracle for p in named.values()):
        policies["oracle"] = oracle
    elif "oracle" in baselines:
        raise ValueError("baselines holds 'oracle' but the market has no planted signal or waves "
                         "(signal_strength=0, wave_rate=0)")
    clash = sorted(set(named) & set(policies))
    if clash:
        raise ValueError(f"policies named {clash} clash with the baselines' names; rename them")
    return policies, fitted


def _setup(data: Any, market: MarketData, split: str, synthetic: bool, seeds: tuple[int, int | None, int],
           first: Recording, capacity: int, notes: list[str], family: int, level: float,
           fitted: dict[str, Any], config_kwargs: Mapping[str, Any], market_options: Mapping[str, Any],
           device: Any) -> dict[str, Any]:
    """An evaluation's setup (:attr:`Evaluation.setup`); ``seeds``: (market, training market, windows)."""
    market_seed, train_market_seed, seed = seeds
    return {
        "data": str(data) if not isinstance(data, MarketData) else data.name,
        "market": market.name,
        "split": split if not synthetic else None,
        "market_seed": int(market_seed) if synthetic else None,
        "train_market_seed": None if train_market_seed is None or not synthetic else int(train_market_seed),
        "market_steps": int(market.num_steps),
        "books": int(first.num_books),
        "vector_steps": first.num_steps,
        "episode_length": first.episode_length,
        "episodes_per_book": int(first.offsets.shape[0]),
        "book_steps": first.num_steps * first.num_books,
        "independent_steps": first.independent_steps(),
        "windows": int(first.offsets.numel()),
        "window_capacity": int(capacity),
        "notes": notes,
        "comparison_family": family,
        "correction": f"Holm over {family} comparisons" if family > 1 else "none",
        "level": level,
        "fitted_baselines": fitted,
        "seed": int(seed),
        "step_seconds": first.step_seconds,
        "clock": None if synthetic else [float(market.time[0]), float(market.time[-1])],
        "step_seconds_source": "assumed: the synthetic profile's step_seconds" if synthetic
        else "measured: median clock gap between steps of the data",
        "env_config": config_settings(EnvConfig(**config_kwargs)),
        "market_options": dict(market_options),
        "device": str(device),
    }


def _record_and_compare(named: Mapping[str, Any], baselines: Mapping[str, Any], market: MarketData, *,
                        n_envs: int, steps: int, seed: int, config_kwargs: Mapping[str, Any],
                        device: str | torch.device, progress: bool, level: float) -> (
                            tuple[dict[str, EvaluationResult], dict[str, list[dict[str, Any]]]]):
    """Record every policy and baseline on the same windows; compare each policy with each baseline."""
    results: dict[str, EvaluationResult] = {}
    for name, policy in {**named, **baselines}.items():
        rec = record(policy, market, num_books=n_envs, num_steps=steps, seed=seed,
                     env_kwargs=dict(config_kwargs), device=device, progress=progress)
        rec.policy = name
        results[name] = EvaluationResult(name, compute_metrics(rec), rec.series, rec)
    first = next(iter(results.values())).recording
    windows = {name: episode_pnl(result.recording) for name, result in results.items()}
    comparisons = {
        name: [stats.paired_windows(windows[name], windows[b], first.offsets, first.episode_length,
                                    baseline=b, level=level, seed=seed, policy=name)
               for b in baselines]
        for name in named
    }
    return results, comparisons


def evaluate_policies(
    policies: Mapping[str, Any] | Iterable[Any],
    data: str | Path | MarketData = "synthetic",
    *,
    baselines: Iterable[str] | None = None,
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
    fit_data: str | Path | MarketData | None = None,
    level: float = 0.95,
) -> Evaluation:
    """Record every policy and baseline on the same books and windows of one market, score and compare them.

    Every episode window is whole and disjoint from every other (:func:`plan_windows`: never more books than
    disjoint windows); the comparisons are paired over those windows, with block-bootstrap intervals,
    Holm-corrected verdicts over all of them and a power statement (:mod:`foxhunt.evaluation.stats`).

    :param policies: models (anything with ``predict``) or recorder policies, by name (a mapping) or not.
    :param data: ``"synthetic"``, a LOBSTER folder or a :class:`MarketData`.
    :param baselines: names from :data:`~foxhunt.evaluation.baselines.BASELINES` (None:
        :func:`default_baselines`); the oracle is added on a synthetic market with ``signal_strength > 0``
        in ``market_kwargs``; ``"imbalance"`` is fitted on ``fit_data``.
    :param n_envs: books; ``None``: synthetic 16, LOBSTER as many disjoint episode windows as the split
        holds (with ``steps=None`` the split is then walked once, no window scored twice). Never more than
        the disjoint windows the market holds (a cut is noted in ``setup["notes"]``).
    :param steps: vector steps per policy; ``None``: one episode per book; beyond one episode, whole
        episodes (a partial last window is cut, and noted).
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
    :param fit_data: what ``"imbalance"`` is fitted on (default: the LOBSTER split before ``split``, or the
        synthetic training market); a :class:`MarketData`, folder or ``"synthetic"``.
    :param level: confidence level of the intervals and verdicts.
    :return: the :class:`Evaluation`.
    """
    from foxenv.checks import check_device, check_seed

    seed = check_seed(seed, optional=False)
    market_seed = check_seed(market_seed, "market_seed", optional=False)
    device = check_device(device)
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
    capacity = max(1, (market.num_steps - 1) // length)
    n_envs, steps, notes = plan_windows(market.num_steps, length, n_envs, steps,
                                        DEFAULT_SYNTHETIC_BOOKS if synthetic else capacity)

    oracle = (_oracle_for(market_options, config_kwargs, market_seed, market.num_steps) if synthetic
              else None)
    grid = EnvConfig(**config_kwargs).grid
    named = _named_policies(policies, oracle, grid)

    def fit_imbalance() -> tuple[ImbalancePolicy, dict[str, Any]]:
        if fit_data is None:
            fit_market = _fit_market(data, split, market_seed, train_market_seed, device, market_options)
        else:
            fit_market = build_market(fit_data, split="all", market_seed=market_seed, device=device,
                                      **market_options)
        return _fit_imbalance(fit_market, config_kwargs, seed, device)

    chosen = default_baselines(data) if baselines is None else tuple(baselines)
    baseline_policies, fitted = _baseline_policies(chosen, named, oracle, grid, seed, fit_imbalance)
    results, comparisons = _record_and_compare(
        named, baseline_policies, market, n_envs=n_envs, steps=steps, seed=seed, config_kwargs=config_kwargs,
        device=device, progress=progress, level=level)
    first = next(iter(results.values())).recording
    setup = _setup(data, market, split, synthetic, (market_seed, train_market_seed, seed), first, capacity,
                   notes, stats.correct(comparisons), level, fitted, config_kwargs, market_options, device)
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


def fit_imbalance_rule(market: Any, env_kwargs: dict[str, Any] | None = None, *,
                       thresholds: tuple[float, ...] = IMBALANCE_THRESHOLDS,
                       orders: tuple[int, ...] = IMBALANCE_ORDERS, num_books: int | None = None,
                       seed: int = 0, device: str | torch.device = "cpu") -> tuple[ImbalancePolicy,
                                                                                     dict[str, float]]:
    """The imbalance rule with the threshold and order type that made the most PnL after fees on ``market``
    (the fit data).

    Each candidate is scored by the recorder on disjoint episode windows covering ``market`` once.

    :param market: the fit market (never the data the rule is then scored on).
    :param env_kwargs: :class:`~foxenv.config.EnvConfig` fields (``levels``, fees, ``episode_length``).
    :param thresholds: candidates in ``[0, 1)``.
    :param orders: order types tried (0 Market, 1 LimitMaker).
    :param num_books: books (default: every disjoint window of ``market``, at most 64).
    :param seed: seed of the windows.
    :param device: device of the runs.
    :return: ``(rule, {"market@0.5": fit PnL, "limit_maker@0.9": ..., ...})``.
    """
    config = dict(env_kwargs or {})
    length = min(int(config.get("episode_length", EnvConfig().episode_length)), market.num_steps - 1)
    config["episode_length"] = max(length, 1)
    levels = int(config.get("levels", EnvConfig().levels))
    books = num_books or max(1, min(64, (market.num_steps - 1) // config["episode_length"]))
    candidates = {f"{('market', 'limit_maker')[order]}@{float(threshold):g}":
                  ImbalancePolicy(threshold, levels, order, grid=EnvConfig(**config).grid)
                  for order in orders for threshold in thresholds}
    scores: dict[str, float] = {}
    for key, rule in candidates.items():
        recording = record(rule, market, num_books=books, seed=seed, env_kwargs=config, device=device)
        scores[key] = float(recording.series["step_pnl"].sum())
    best = max(scores, key=lambda k: scores[k])
    return candidates[best], scores
