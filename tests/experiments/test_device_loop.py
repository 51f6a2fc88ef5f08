"""Experiments through BranchingIQN's device loop: tiny runs on the CPU (and on CUDA where there is one)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from experiments import harness

#: Two books, a few hundred steps, short episodes (so the training curve gets points), a planted market.
TINY = ["--seeds", "1", "--steps", "300", "--n-envs", "2", "--market-steps", "2000",
        "--signal-strength", "0.5", "--signal-horizon", "3", "--episode-length", "40", "--eval-envs", "2",
        "--eval-steps", "40", "--no-progress"]


@pytest.fixture(autouse=True)
def _keep_threads_and_agents() -> Iterator[None]:
    """main() sets its own thread count and custom agents; the session keeps its own."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
    harness.clear_custom_agents()


@pytest.mark.slow
def test_learning_device_loop_tiny(tmp_path: Path) -> None:
    """--device-loop on: the BranchingIQN agents (a custom one too) train on a DeviceLOBVecEnv through the
    device loop, DQN through SB3's loop; the records say so; the curve has points; --env-kwargs reaches the
    evaluation; --reuse keeps a run only under the same loop."""
    from experiments.learning import main

    out = tmp_path / "tiny"
    custom = 'iqn_s={"base": "iqn_lean", "model": {"learning_rate": 1e-3}, "policy": {"net_arch": [32, 32]}}'
    argv = ["--out", str(out), "--agents", "iqn_s,dqn", "--agent-kwargs", custom, "--env-kwargs",
            '{"reward_scale": 0.5}', "--device-loop", "on", *TINY]
    payload = main(argv)
    assert payload["loops"] == {"iqn_s/seed0": "device", "dqn/seed0": "sb3"}
    record = json.loads((out / "iqn_s" / "seed0" / "run.json").read_text())
    assert record["loop"] == "device" and record["curve"], "the curve needs the device loop's flushes"
    assert record["spec"]["base"] == "iqn_lean" and record["spec"]["policy_kwargs"]["net_arch"] == [32, 32]
    assert json.loads((out / "dqn" / "seed0" / "run.json").read_text())["loop"] == "sb3"
    written = json.loads((out / "results.json").read_text())
    assert written["loops"] == payload["loops"] and written["env_overrides"] == {"reward_scale": 0.5,
                                                                                 "episode_length": 40}
    assert written["agents"]["iqn_s"]["model_kwargs"]["learning_rate"] == 1e-3
    assert written["evaluation"]["setup"]["env_config"]["reward_scale"] == 0.5
    assert "training loops: iqn_s: device; dqn: sb3" in (out / "results.md").read_text()
    assert (out / "iqn_s" / "seed0" / "diagnostics.jsonl").is_file()

    # the same command reuses both runs; with the device loop off the BranchingIQN run trains again
    again = main([*argv, "--reuse"])
    assert again["train_seconds"] == payload["train_seconds"]
    off = main([*argv[:-len(TINY) - 2], "--device-loop", "off", *TINY, "--reuse"])
    assert off["loops"] == {"iqn_s/seed0": "sb3", "dqn/seed0": "sb3"}
    assert off["train_seconds"]["dqn/seed0"] == payload["train_seconds"]["dqn/seed0"]
    assert off["train_seconds"]["iqn_s/seed0"] != payload["train_seconds"]["iqn_s/seed0"]


def test_train_agent_on_the_device_env() -> None:
    """The harness builds a DeviceLOBVecEnv for a BranchingIQN agent under the device loop (not for DQN),
    and CurveCallback sees episodes read at the loop's flushes."""
    from foxhunt.device_env import DeviceLOBVecEnv
    from foxhunt.envs import LOBVecEnv

    torch.set_num_threads(1)  # as the scripts (--threads 1): small nets on a shared CPU
    setup = harness.MarketSetup(market_steps=1000)
    budget = harness.Budget(steps=200, n_envs=2, device_loop=True, env_overrides={"episode_length": 20},
                            overrides={"learning_starts": 50})
    market = setup.train_market("cpu")
    env = harness.make_train_env(market, setup, budget, 0, budget.loop_of("iqn_lean"))
    assert isinstance(env, DeviceLOBVecEnv)
    model = harness.build_model(harness.agent_spec("iqn_lean"), env, budget, 0, None)
    callback = harness.CurveCallback(budget.steps, points=10)
    harness.configure_device_loop(model, callback, budget.n_envs)
    model.learn(budget.steps, callback=callback)
    assert model.num_timesteps == 200 and len(model.ep_info_buffer) >= 10  # 20-step episodes on 2 books
    assert callback.curve and all(steps <= 200 for steps, _ in callback.curve)
    plain = harness.make_train_env(market, setup, budget, 0, budget.loop_of("dqn"), "joint")
    assert type(plain) is LOBVecEnv and plain.action_face == "joint"
    assert harness.build_model(harness.agent_spec("dqn"), plain, budget, 0, None).env is plain
    with pytest.raises(ValueError, match="loop='gpu'"):
        harness.make_train_env(market, setup, budget, 0, "gpu")


@pytest.mark.slow
def test_device_loop_on_lobster(lobster_dir: Path, tmp_path: Path) -> None:
    """GOOG's train split through the device loop, scored on its test split."""
    from experiments.learning import main

    out = tmp_path / "goog"
    payload = main(["--out", str(out), "--data", str(lobster_dir), "--step-events", "20", "--levels", "5",
                    "--agents", "iqn", "--seeds", "1", "--steps", "300", "--n-envs", "2", "--episode-length",
                    "60", "--eval-envs", "2", "--eval-steps", "40", "--device-loop", "on", "--no-progress"])
    assert payload["loops"] == {"iqn/seed0": "device"}
    assert payload["evaluation"]["setup"]["split"] == "test"
    assert json.loads((out / "iqn" / "seed0" / "run.json").read_text())["curve"]


@pytest.mark.slow
def test_exploration_epochs_under_the_device_loop(tmp_path: Path) -> None:
    """The five evaluation epochs run from the device loop's callbacks, one at or past each mark."""
    from experiments.exploration import EPOCHS, main

    payload = main(["--out", str(tmp_path / "explore"), "--agent", "iqn_lean", "--seeds", "1",
                    "--steps", "400", "--n-envs", "2", "--market-steps", "2000", "--episode-length", "40",
                    "--eval-envs", "2", "--eval-steps", "20", "--device-loop", "on", "--no-progress"])
    assert payload["loop"] == "device"
    marks = payload["epoch_steps"]
    assert len(marks) == EPOCHS and marks[-1] == 400
    assert all(mark >= 400 * (k + 1) // EPOCHS for k, mark in enumerate(marks))


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
    assert payload["agents"]["iqn_s-no_hindsight"]["model_kwargs"]["hindsight"] is False
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
    """On CUDA the device loop is the default (auto) for BranchingIQN, with graphed gradient steps and a
    graphed env step; DQN stays on SB3's loop; no graph is captured twice."""
    from experiments.learning import main

    out = tmp_path / "cuda"
    payload = main(["--out", str(out), "--agents", "iqn_lean,dqn", "--device", "cuda", "--env-cuda-graph",
                    "--learning-starts", "64", "--batch-size", "32", *TINY])
    assert payload["loops"] == {"iqn_lean/seed0": "device", "dqn/seed0": "sb3"}
    record = json.loads((out / "iqn_lean" / "seed0" / "run.json").read_text())
    assert record["curve"] and 1 <= record["graph_captures"] <= 2
