"""BranchingIQN on the joint face (one branch of the 81 joint actions) in the experiments."""

from __future__ import annotations

from pathlib import Path

import pytest
from gymnasium import spaces

from experiments import runner
from experiments.agents import Roster
from tests.experiments.test_device_loop import TINY, _keep_threads  # noqa: F401 (autouse fixture)


def test_iqn_joint_is_one_branch_of_81_actions_without_the_per_branch_settings() -> None:
    from foxhunt.device_lob_env import DeviceLOBVecEnv

    roster = Roster()
    joint = roster.get("iqn_joint")
    custom = roster.define("j2", {"base": "iqn_joint", "model": {"per_alpha": 0.0}})
    assert custom.action_face == "joint" and custom.model == {"per_alpha": 0.0}
    setup = runner.Setup(signal_strength=0.5, signal_horizon=3, market_steps=2000, steps=100, n_envs=2)
    model = runner.build(joint, 0, setup)
    assert model.action_space == spaces.Discrete(81) and model.branch_names == ["action"]
    assert model.hindsight_config is None and model.vaccine_interval == 0
    # the device loop steps a joint DeviceLOBVecEnv (it decodes the codes itself)
    on_device = runner.Setup(market_steps=2000, steps=100, n_envs=2, device_loop=True)
    assert on_device.loop_of(joint) == runner.LOOP_DEVICE
    model = runner.build(custom, 0, on_device)
    assert isinstance(model.get_env(), DeviceLOBVecEnv) and model.action_space == spaces.Discrete(81)


def test_iqn_fast_is_the_joint_agent_of_the_fast_recipe() -> None:
    fast = Roster().get("iqn_fast")
    assert fast.action_face == "joint" and fast.policy == {"n_ensemble": 1}
    assert fast.model == {"learning_rate": 1e-3, "gamma": 0.9, "c51_alpha": 0.0, "train_freq": 8,
                          "gradient_steps": 8, "batch_size": 256, "learning_starts": 20_000,
                          "target_update_interval": 20_000, "buffer_size": 500_000}
    model = runner.build(fast, 0, runner.Setup(market_steps=2000, steps=100, n_envs=2))
    assert (model.batch_size, model.learning_starts, model.buffer_size) == (256, 20_000, 500_000)
    assert (model.learning_rate, model.gamma, model.c51_alpha, model.gradient_steps) == (1e-3, 0.9, 0.0, 8)
    assert model.train_freq.frequency == 8 and model.policy.n_ensemble == 1
    assert model.action_space == spaces.Discrete(81)


@pytest.mark.slow
def test_learning_runs_and_scores_a_joint_agent(tmp_path: Path) -> None:
    from experiments.learning import main

    for loop in ("off", "on"):
        payload = main(["--out", str(tmp_path / loop), "--agents", "iqn_joint", "--device-loop", loop, *TINY])
        assert payload["loops"] == {"iqn_joint/seed0": "sb3" if loop == "off" else "device"}
        metrics = payload["evaluation"]["policies"]["iqn_joint/seed0"]
        assert sum(metrics["action_mix"]["direction"]) == pytest.approx(1.0)  # decoded to the four branches
