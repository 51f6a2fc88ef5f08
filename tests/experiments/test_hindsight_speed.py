"""experiments.hindsight_speed: the paired statistics on hand-made runs, the verdict, the wave market's
options, and a CPU smoke run that writes its JSON, table and figure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments import hindsight_speed, options
from foxenv.data import generate_synthetic, load_market


def run(steps: int | None, trained: int = 1000, seconds: float | None = None) -> dict:
    """A scored run that reached the target at ``steps`` (None: not within ``trained`` steps)."""
    return {"reached": steps is not None, "steps": steps, "seconds": seconds if steps else None,
            "trained_steps": trained, "trained_s": 10.0, "best_share": 0.5, "final_share": 0.4, "points": []}


def test_compare_gives_the_speedup_of_mean_steps_with_a_paired_interval() -> None:
    on = [run(100, seconds=1.0), run(200, seconds=2.0), run(150, seconds=1.5)]
    off = [run(300, seconds=3.0), run(500, seconds=5.0), run(400, seconds=4.0)]
    steps = hindsight_speed.compare(on, off, "steps", resamples=2000)
    assert steps["on"]["mean"] == 150 and steps["off"]["mean"] == 400
    assert steps["speedup"] == pytest.approx(400 / 150) and steps["bound"] == "exact"
    low, high = steps["speedup_interval"]
    assert 2.0 < low <= steps["speedup"] <= high < 3.5  # every resample's ratio lies in [2.5, 3]
    assert steps["on"]["interval"][0] >= 100 and steps["on"]["interval"][1] <= 200
    same = hindsight_speed.compare(on, on, "seconds", resamples=500)
    assert same["speedup"] == 1.0 and same["speedup_interval"] == (1.0, 1.0)  # the resample is paired
    decision = hindsight_speed.verdict(steps)
    assert decision["target_met"] and decision["helps"]


def test_censored_runs_count_at_what_they_trained_and_bound_the_speedup() -> None:
    on = [run(100), run(200)]
    off = [run(None, trained=800), run(600)]
    steps = hindsight_speed.compare(on, off, "steps", resamples=500)
    assert steps["off"]["values"] == [800.0, 600.0] and steps["off"]["censored"] == [True, False]
    assert steps["bound"] == "lower" and steps["speedup"] == pytest.approx(700 / 150)
    flipped = hindsight_speed.compare(off, on, "steps", resamples=500)
    assert flipped["bound"] == "upper" and not hindsight_speed.verdict(flipped)["helps"]
    both = hindsight_speed.compare([run(None)], [run(None)], "steps", resamples=100)
    assert both["bound"] == "none" and not hindsight_speed.verdict(both)["helps"]
    with pytest.raises(ValueError, match="pairs are needed"):
        hindsight_speed.compare(on, off[:1], "steps")


def test_verdict_kills_hindsight_without_a_speedup_above_one() -> None:
    slow = hindsight_speed.compare([run(400), run(300)], [run(300), run(400)], "steps", resamples=500)
    decision = hindsight_speed.verdict(slow)
    assert not decision["helps"] and not decision["target_met"]
    assert "stays off by default" in decision["decision"]
    modest = hindsight_speed.compare([run(300), run(310)], [run(450), run(460)], "steps", resamples=500)
    assert hindsight_speed.verdict(modest)["helps"] and not hindsight_speed.verdict(modest)["target_met"]


def test_market_kwargs_reach_the_markets_and_bad_ones_are_named() -> None:
    parser = hindsight_speed.parse_args(["--quick"])
    setup = options.setup_of(parser)
    assert setup.waves and setup.planted and setup.market == {"wave_rate": 0.02}
    assert "wave_rate 0.02" in setup.describe()
    for text, message in (('{"wave_speed": 1}', "market-kwargs.wave_speed is not a synthetic profile knob"),
                          ('{"signal_strength": 1}', "market-kwargs.signal_strength is not"),
                          ("[1]", r"market-kwargs=\[1\] must be a JSON object"),
                          ("{", "market-kwargs='{': not valid JSON")):
        with pytest.raises(ValueError, match=message):
            options.setup_of(hindsight_speed.parse_args(["--quick", "--market-kwargs", text]))
    # the training env's market is the generator's wave market
    market = load_market("synthetic", num_steps=500, seed=3, wave_rate=0.05)
    assert market.name == generate_synthetic(500, seed=3, wave_rate=0.05).name
    with pytest.raises(ValueError, match="unknown option"):
        load_market("synthetic", num_steps=500, wave_speed=1.0)


def test_quick_run_writes_its_table_json_and_figure(tmp_path: Path) -> None:
    payload = hindsight_speed.main(["--quick", "--no-progress", "--out", str(tmp_path)])
    on, off = payload["arms"]["on"], payload["arms"]["off"]
    assert (on, off) == ("iqn_joint+hindsight", "iqn_joint")  # the default face's agent
    data = json.loads((tmp_path / "hindsight_speed.json").read_text())
    assert len(data["runs"][on]) == len(data["runs"][off]) == 2 and data["oracle_pnl"] > 0
    for runs in data["runs"].values():
        assert all(r["points"] and r["trained_steps"] >= 200 for r in runs)
    assert data["agents"][on]["model"]["hindsight"] is True
    assert set(data["steps"]) >= {"on", "off", "speedup", "speedup_interval", "bound"}
    table = (tmp_path / "hindsight_speed.md").read_text()
    assert "Speed-up with hindsight" in table and "iqn_joint+hindsight" in table
    assert (tmp_path / "hindsight_speed.png").stat().st_size > 10_000


def test_concurrent_runs_score_as_the_runs_alone(tmp_path: Path) -> None:
    alone = hindsight_speed.main(["--quick", "--seeds", "1", "--no-progress", "--out", str(tmp_path / "a")])
    both = hindsight_speed.main(["--quick", "--seeds", "1", "--concurrent-seeds", "2", "--no-progress",
                                 "--out", str(tmp_path / "b")])
    spawned = hindsight_speed.main(["--quick", "--seeds", "1", "--concurrent-seeds", "2", "--processes",
                                    "--no-progress", "--out", str(tmp_path / "c")])
    for arm, runs in alone["runs"].items():
        points = [(p["steps"], p["share"]) for p in runs[0]["points"]]
        assert points == [(p["steps"], p["share"]) for p in both["runs"][arm][0]["points"]]
        assert points == [(p["steps"], p["share"]) for p in spawned["runs"][arm][0]["points"]]


def test_a_lower_bar_reads_the_first_crossing_among_the_points() -> None:
    points = [{"steps": 100, "train_s": 1.0, "share": 0.1}, {"steps": 200, "train_s": 2.0, "share": 0.3},
              {"steps": 300, "train_s": 3.0, "share": 0.2}]
    scored = {**run(None, trained=300), "points": points}
    assert hindsight_speed.to_target(scored, "steps", share=0.25) == (200.0, False)
    assert hindsight_speed.to_target(scored, "seconds", share=0.25) == (2.0, False)
    assert hindsight_speed.to_target(scored, "steps", share=0.4) == (300.0, True)
    assert hindsight_speed.to_target(scored, "steps") == (300.0, True)
