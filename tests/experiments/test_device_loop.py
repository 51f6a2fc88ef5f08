"""Experiments through BranchingIQN's device loop: tiny runs on the CPU (and on CUDA where there is one)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from experiments import runner
from experiments.agents import builtin_agent

#: Two books, a few hundred steps, short episodes (so the training curve gets points), a planted market.
TINY = ["--seeds", "1", "--steps", "300", "--n-envs", "2", "--market-steps", "2000",
        "--signal-strength", "0.5", "--signal-horizon", "3", "--episode-length", "40", "--eval-envs", "2",
        "--eval-steps", "40", "--no-progress"]


@pytest.fixture(autouse=True)
def _keep_threads() -> Iterator[None]:
    """main() sets its own thread count; the session keeps its own."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_train_on_the_device_env(tmp_path: Path) -> None:
    """A BranchingIQN agent under the device loop trains through foxhunt.runs on a DeviceLOBVecEnv; its
    curve gets points from the loop's episode statistics; the record says which loop."""
    torch.set_num_threads(1)  # as the scripts (--threads 1): small nets on a shared CPU
    setup = runner.Setup(market_steps=1000, steps=200, n_envs=2, device_loop=True, eval_envs=2, eval_steps=20,
                         env_kwargs={"episode_length": 20}, model_kwargs={"learning_starts": 50})
    run = runner.train(builtin_agent("iqn_lean"), 0, setup, tmp_path / "run")
    assert run.loop == runner.LOOP_DEVICE and run.model.num_timesteps == 200
    assert run.curve and all(steps <= 200 for steps, _ in run.curve)
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["device_loop"] is True and config["seed"] == 0
    assert json.loads((tmp_path / "run" / "run.json").read_text())["loop"] == "device"
    assert runner.load(builtin_agent("iqn_lean"), 0, setup, tmp_path / "run") is not None
    assert runner.load(builtin_agent("iqn"), 0, setup, tmp_path / "run") is None  # another agent: retrain


@pytest.mark.slow
def test_learning_device_loop_tiny(tmp_path: Path) -> None:
    """--device-loop on: the BranchingIQN agents (a custom one too) train through the device loop, DQN
    through SB3's loop; the records say so; --env-kwargs reaches the evaluation; --reuse keeps a run only
    under the same loop."""
    from experiments.learning import main

    out = tmp_path / "tiny"
    custom = 'iqn_s={"base": "iqn_lean", "model": {"learning_rate": 1e-3}, "policy": {"net_arch": [32, 32]}}'
    argv = ["--out", str(out), "--agents", "iqn_s,dqn", "--agent-kwargs", custom, "--env-kwargs",
            '{"reward_scale": 0.5}', "--device-loop", "on", *TINY]
    payload = main(argv)
    assert payload["loops"] == {"iqn_s/seed0": "device", "dqn/seed0": "sb3"}
    record = json.loads((out / "iqn_s" / "seed0" / "run.json").read_text())
    assert record["loop"] == "device" and record["curve"]
    assert record["agent"]["base"] == "iqn_lean" and record["agent"]["policy"]["net_arch"] == [32, 32]
    written = json.loads((out / "results.json").read_text())
    assert written["loops"] == payload["loops"]
    assert written["env_overrides"] == {"reward_scale": 0.5, "episode_length": 40}
    assert written["agents"]["iqn_s"]["model"]["learning_rate"] == 1e-3
    assert written["evaluation"]["setup"]["env_config"]["reward_scale"] == 0.5
    assert "training loops: iqn_s: device; dqn: sb3" in (out / "results.md").read_text()

    # the same command reuses both runs; with the device loop off the BranchingIQN run trains again
    again = main([*argv, "--reuse"])
    assert again["train_seconds"] == payload["train_seconds"]
    off = main([*argv[:-len(TINY) - 2], "--device-loop", "off", *TINY, "--reuse"])
    assert off["loops"] == {"iqn_s/seed0": "sb3", "dqn/seed0": "sb3"}
    assert off["train_seconds"]["dqn/seed0"] == payload["train_seconds"]["dqn/seed0"]
    assert off["train_seconds"]["iqn_s/seed0"] != payload["train_seconds"]["iqn_s/seed0"]


@pytest.mark.slow
def test_device_loop_on_lobster(lobster_dir: Path, tmp_path: Path) -> None:
    """GOOG's train split (20 messages a step) through the device loop, scored on its test split."""
    from experiments.learning import main

    out = tmp_path / "goog"
    payload = main(["--out", str(out), "--data", str(lobster_dir), "--step-events", "20", "--levels", "5",
                    "--agents", "iqn", "--seeds", "1", "--steps", "300", "--n-envs", "2", "--episode-length",
                    "60", "--eval-envs", "2", "--eval-steps", "40", "--device-loop", "on", "--no-progress"])
    assert payload["loops"] == {"iqn/seed0": "device"}
    assert payload["evaluation"]["setup"]["split"] == "test"
    assert json.loads((out / "iqn" / "seed0" / "run.json").read_text())["curve"]


@pytest.mark.slow
def test_hindsight_arms_under_the_device_loop(tmp_path: Path) -> None:
    """A custom agent's two hindsight arms train through the device loop; --reuse reads their diagnostics
    again, unless the loop changed."""
    from experiments.hindsight import main

    out = tmp_path / "hindsight"
    argv = ["--out", str(out), "--agent", "iqn_s", "--agent-kwargs", 'iqn_s={"policy": {"net_arch": [32]}}',
            "--seeds", "1", "--steps", "300", "--n-envs", "2", "--market-steps", "2000", "--episode-length",
            "40", "--device-loop", "on", "--no-progress"]
    payload = main(argv)
    assert payload["arms"] == {"on": "iqn_s", "off": "iqn_s-no_hindsight"}
    assert payload["loops"] == {"iqn_s": "device", "iqn_s-no_hindsight": "device"}
    assert payload["agents"]["iqn_s-no_hindsight"]["model"]["hindsight"] is False
    assert payload["curves"]["on"][0] and payload["curves"]["off"][0]  # l_q logged at every interval
    diagnostics = out / "iqn_s" / "seed0" / "diagnostics.jsonl"
    written = diagnostics.stat().st_mtime_ns
    again = main([*argv, "--reuse"])
    assert diagnostics.stat().st_mtime_ns == written and again["curves"] == payload["curves"]
    main([*argv[:-3], "--device-loop", "off", "--no-progress", "--reuse"])
    assert diagnostics.stat().st_mtime_ns != written
    assert json.loads((out / "iqn_s" / "seed0" / "run.json").read_text())["loop"] == "sb3"


@pytest.mark.gpu
@pytest.mark.slow
def test_learning_device_loop_on_cuda(tmp_path: Path) -> None:
    """On CUDA the device loop is the default (auto) for BranchingIQN; DQN stays on SB3's loop."""
    from experiments.learning import main

    out = tmp_path / "cuda"
    payload = main(["--out", str(out), "--agents", "iqn_lean,dqn", "--device", "cuda", "--learning-starts",
                    "64", "--batch-size", "32", *TINY])
    assert payload["loops"] == {"iqn_lean/seed0": "device", "dqn/seed0": "sb3"}
    assert json.loads((out / "iqn_lean" / "seed0" / "run.json").read_text())["curve"]
