"""BranchingIQN on the joint face (one branch of the 81 joint actions) in the experiments."""

from __future__ import annotations

from pathlib import Path

import pytest
from gymnasium import spaces

from experiments import harness
from tests.experiments.test_device_loop import TINY, _keep_threads_and_agents  # noqa: F401 (autouse fixture)


def test_iqn_joint_is_one_branch_of_81_actions_without_the_per_branch_settings() -> None:
    spec_ = harness.agent_spec("iqn_joint")
    assert spec_.kind == "iqn" and spec_.face == "joint" and spec_.model_kwargs["hindsight"] is False
    custom = harness.define_agent("j2", {"base": "iqn_joint", "model": {"per_alpha": 0.0}})
    assert custom.face == "joint" and custom.model_kwargs == {**spec_.model_kwargs, "per_alpha": 0.0}
    budget = harness.Budget(steps=100, n_envs=2)
    setup = harness.MarketSetup("synthetic", 0.5, 3, 2000)
    env = harness.make_train_env(setup.train_market("cpu"), setup, budget, 0, face="joint")
    model = harness.build_model(spec_, env, budget, 0, None)
    assert model.action_space == spaces.Discrete(81) and model.branch_names == ["action"]
    assert model.hindsight_config is None and model.vaccine_interval == 0
    # the device loop steps a joint DeviceLOBVecEnv (it decodes the codes itself: no wrapper)
    assert harness.Budget(device_loop=True).loop_of("iqn_joint") == harness.LOOP_DEVICE
    market = setup.train_market("cpu")
    device_env = harness.make_train_env(market, setup, budget, 0, harness.LOOP_DEVICE, "joint")
    on_device = harness.build_model(spec_, device_env, budget, 0, None)
    assert on_device.get_env() is device_env and on_device.action_space == spaces.Discrete(81)


@pytest.mark.slow
def test_learning_runs_and_scores_a_joint_agent(tmp_path: Path) -> None:
    from experiments.learning import main

    for loop in ("off", "on"):
        payload = main(["--out", str(tmp_path / loop), "--agents", "iqn_joint", "--device-loop", loop, *TINY])
        assert payload["loops"] == {"iqn_joint/seed0": "sb3" if loop == "off" else "device"}
        metrics = payload["evaluation"]["policies"]["iqn_joint/seed0"]
        assert sum(metrics["action_mix"]["direction"]) == pytest.approx(1.0)  # decoded to the four branches
