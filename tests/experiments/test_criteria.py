"""experiments.criteria: the action mix (every book-step and the working ones), the verdicts on hand-made
numbers, the oracle's fairness check, the epoch marks, and a tiny end-to-end run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from experiments import criteria
from experiments.criteria import EpochCallback, fairness, judge, needed, sharpe_gap
from experiments.market_mix import action_mix


def _series(actions: list[list[tuple[int, int, int, int]]], position: list[list[float]],
            alive: list[list[bool]] | None = None, starts: tuple[int, ...] = (0,)) -> dict[str, torch.Tensor]:
    """A recording's series of ``N`` steps x ``B`` books from per-step lists."""
    steps, books = len(actions), len(actions[0])
    start = torch.zeros(steps, books, dtype=torch.bool)
    start[list(starts)] = True
    return {"actions": torch.tensor(actions, dtype=torch.int8), "position": torch.tensor(position),
            "alive": torch.tensor(alive) if alive is not None else torch.ones(steps, books, dtype=torch.bool),
            "episode_start": start}


def test_action_mix_counts_every_step_and_the_working_ones() -> None:
    # one book, max_position 100: long Full (target 100) from flat, held, then flat Half (target 0), held
    series = _series([[(2, 2, 0, 2)], [(2, 2, 1, 1)], [(1, 1, 2, 0)], [(1, 1, 0, 0)]],
                     [[100.0], [100.0], [0.0], [0.0]])
    mix = action_mix(series, 100.0)
    assert mix["steps"] == {"all": 4, "working": 2}
    assert mix["all"]["magnitude"] == [0.0, 0.5, 0.5]
    assert mix["all"]["order"] == [0.5, 0.25, 0.25]
    assert mix["working"]["direction"] == [0.0, 0.5, 0.5]
    assert mix["working"]["order"] == [0.5, 0.0, 0.5]  # the held LimitMaker step decided nothing


def test_action_mix_episode_start_is_flat_and_dead_steps_do_not_count() -> None:
    # a new episode at step 1: the position 25 of step 0 is not held into it, so long Quarter works again
    series = _series([[(2, 0, 0, 0), (1, 0, 0, 0)], [(2, 0, 0, 0), (1, 0, 0, 0)]],
                     [[25.0, 0.0], [25.0, 0.0]], alive=[[True, True], [True, False]], starts=(0, 1))
    mix = action_mix(series, 100.0)
    assert mix["steps"] == {"all": 3, "working": 2}
    assert mix["working"]["direction"] == [0.0, 0.0, 1.0]
    empty = action_mix(_series([[(1, 0, 0, 0)]], [[0.0]]), 100.0)
    assert empty["steps"]["working"] == 0 and math.isnan(empty["working"]["order"][0])


def _run(sharpes: list[float], magnitude: list[float], order: list[float]) -> dict:
    mix = {"direction": [0.3, 0.4, 0.3], "magnitude": magnitude, "order": order, "urgency": [0.3, 0.3, 0.4]}
    epochs = [{"sharpe": s, "mix": {"all": mix, "working": mix}} for s in sharpes]
    return {"epochs": epochs}


def test_judge_floors_and_sharpe_band_per_seed() -> None:
    good = _run([0.1, 0.3, 0.35, 0.4, 0.3, 0.5], [0.5, 0.3, 0.2], [0.8, 0.1, 0.1])
    collapsed = _run([0.1, 0.3, 0.35, 0.7, 0.3, 0.3], [0.0, 0.1, 0.9], [0.97, 0.0, 0.03])
    rows = judge([good, good])
    assert [r["pass"] for r in rows] == [True] * 5
    assert rows[-1]["values"] == pytest.approx([0.2, 0.2])  # epoch 0 (warm-up end) is not in the band
    rows = judge([good, collapsed])
    assert [r["passed"] for r in rows] == [[True, False], [True, True], [True, False], [True, False],
                                           [True, False]]
    assert [r["pass"] for r in rows] == [False, True, False, False, False]
    assert rows[0]["mean"] == pytest.approx(0.2) and rows[0]["std"] == pytest.approx(math.sqrt(0.02))
    assert sharpe_gap([0.2, -0.05, 0.45]) == pytest.approx(0.25)
    assert sharpe_gap([0.2, math.nan]) != sharpe_gap([0.2, math.nan])  # NaN, which judge() fails


def test_fairness_names_the_floors_a_reference_does_not_clear() -> None:
    all_in = {"magnitude": [0.0, 0.0, 1.0], "order": [1.0, 0.0, 0.0]}
    graded = {"magnitude": [0.2, 0.3, 0.5], "order": [0.6, 0.3, 0.1]}
    fair = fairness({"oracle": {"mix": {"all": all_in, "working": all_in}},
                     "best rule": {"mix": {"all": all_in, "working": graded}}})
    assert {name for name, v in fair["oracle"]["all"].items() if not v["clears"]} == {"Half", "LimitMaker",
                                                                                       "IoC"}
    assert fair["oracle"]["working"]["Full"] == {"share": 1.0, "clears": True}
    assert needed(fair, "oracle") == (["Full"], ["Half", "LimitMaker", "IoC"])
    assert needed(fair, "best rule") == (["Half", "Full", "LimitMaker", "IoC"], [])
    assert needed(fair, "absent") == ([], [])


def test_epoch_marks_and_default_agent() -> None:
    callback = EpochCallback(warmup=1000, epoch_steps=300, epochs=5, at_checkpoint=lambda m, k: None)
    assert callback.marks == [1000, 1300, 1600, 1900, 2200, 2500]
    from foxhunt.presets import ACTION_FACE

    assert criteria.default_agent().action_face == ACTION_FACE
    assert criteria.default_agent().model == {}  # foxhunt train's settings: the presets, nothing over them
    with pytest.raises(SystemExit):
        criteria.parse_args(["--epochs", "1"])


def test_best_rule_only_on_a_planted_signal() -> None:
    import argparse

    from experiments.runner import Setup

    waves = Setup(market={"wave_rate": 0.02})
    assert waves.planted and criteria.best_rule(argparse.Namespace(rules=None), waves, {}, {}) is None
    planted = Setup(signal_strength=2.0, signal_horizon=5)
    assert criteria.best_rule(argparse.Namespace(rules="none"), planted, {}, {}) is None


SMOKE = ["--seeds", "1", "--steps", "200", "--epoch-steps", "40", "--epochs", "2", "--n-envs", "2",
         "--market-steps", "1000", "--signal-strength", "2", "--signal-horizon", "5", "--eval-envs", "2",
         "--eval-steps", "40", "--episode-length", "40", "--no-progress",
         "--rules", "graded_1.5_2.5/by_edge/maker_touch"]


def test_criteria_smoke_end_to_end(tmp_path: Path) -> None:
    """A few hundred steps, one seed, two epochs: the default agent trains through foxhunt.runs and is scored
    after the warm-up and after each epoch on the held-out market beside the oracle; every file appears."""
    out = tmp_path / "criteria"
    threads = torch.get_num_threads()
    try:
        payload = criteria.main(["--out", str(out), *SMOKE])
    finally:
        torch.set_num_threads(threads)
    for name in ("criteria.json", "criteria.md", "criteria.png"):
        assert (out / name).is_file(), name
    assert (out / "default" / "seed0" / "model.zip").is_file()
    assert json.loads((out / "default" / "seed0" / "config.json").read_text())["steps"] == 200 + 2 * 40
    run = payload["runs"][0]
    assert run["marks"][0] >= 200 and len(run["epochs"]) == 3  # warm-up end, epochs 1 and 2
    assert all(a < b for a, b in zip(run["marks"], run["marks"][1:], strict=False))
    assert [r["criterion"] for r in payload["criteria"]][-1] == "Sharpe of epochs 2-2 within ±0.3 of epoch 1"
    oracle, best = payload["references"]["oracle"], payload["references"]["best rule"]
    assert oracle["mix"]["all"]["magnitude"] == [0.0, 0.0, 1.0]  # the oracle goes all in, with Market orders
    assert not payload["fairness"]["oracle"]["all"]["LimitMaker"]["clears"]
    assert set(best["fit"]) == {"all_in/market/market", "graded_1.5_2.5/by_edge/maker_touch"}
    assert best["rule"] in best["fit"] and "mix" in best
    assert sum(run["epochs"][-1]["mix"]["all"]["order"]) == pytest.approx(1.0)
    text = (out / "criteria.md").read_text()
    assert "| Half > 15 % |" in text and "epoch 0 (warm-up end)" in text and "| best rule |" in text


@pytest.mark.gpu
@pytest.mark.slow
def test_criteria_on_cuda_through_the_device_loop(tmp_path: Path) -> None:
    """On CUDA the default agent trains through the device loop; the evaluations land after the warm-up
    and after each epoch (at block granularity: at or after each mark), in increasing order."""
    out = tmp_path / "cuda"
    args = [a for a in SMOKE if a != "--no-progress"]
    payload = criteria.main(["--out", str(out), "--device", "cuda", "--learning-starts", "64",
                             "--batch-size", "32", "--no-progress", *args])
    assert payload["loop"] == "device"
    run = payload["runs"][0]
    assert len(run["epochs"]) == 3
    assert all(mark >= 200 + 40 * k for k, mark in enumerate(run["marks"]))
    assert all(a <= b for a, b in zip(run["marks"], run["marks"][1:], strict=False))
    assert (out / "criteria.png").is_file()


def test_warmup_schedule_puts_the_whole_decay_of_epsilon_in_the_warm_up() -> None:
    from experiments.runner import Setup

    setup = Setup(signal_strength=2.0, signal_horizon=5, steps=5000)
    agent = criteria.default_agent()
    fraction = setup.config(agent, 0).resolved_model_kwargs()["exploration_fraction"]
    scheduled = criteria.warmup_schedule(agent, setup, 1000)
    assert scheduled.model["exploration_fraction"] == pytest.approx(fraction / 5)
    assert setup.config(scheduled, 0).resolved_model_kwargs()["exploration_fraction"] == pytest.approx(
        fraction / 5)  # what the run trains with
