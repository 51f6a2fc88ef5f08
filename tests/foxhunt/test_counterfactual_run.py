"""``foxhunt train --algorithm.counterfactual``: the config turns on the device loop and off hindsight, a tiny
CPU run trains with every action's exact targets, and a resumed run ends bit for bit where the uninterrupted
one does (the replay's states are checkpointed)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from foxhunt.cli import main
from foxhunt.runs import resume, train
from sb3_her_ext import BranchingIQN
from tests.foxhunt._small_runs import SMALL_MODEL_KWARGS, Crash, CrashAt, assert_same_model, small_config


def test_the_flag_sets_the_field_and_its_run_choices(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["train", "--print-config", "--action-face", "branched"]
    assert main([*argv, "--algorithm.counterfactual"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["algorithm"]["counterfactual"] is True
    assert printed["hindsight"] is False and printed["device_loop"] is True  # the CPU's, the face's: not
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["algorithm"]["counterfactual"] is False
    assert printed["hindsight"] is True and printed["device_loop"] is False


@pytest.mark.slow
@pytest.mark.parametrize("face", ["joint", "branched"])
def test_a_counterfactual_run_trains_and_resumes_to_the_uninterrupted_one(tmp_path: Path, face: str) -> None:
    settings = {"steps": 400, "action_face": face,
                "model_kwargs": {**SMALL_MODEL_KWARGS, "counterfactual": True}}
    whole = train(small_config(tmp_path / "whole", **settings))
    model = BranchingIQN.load(whole / "model.zip")
    assert model.counterfactual and model._n_updates > 0 and model.hindsight_config is None
    out = tmp_path / "run"
    with pytest.raises(Crash):
        train(small_config(out, **settings), callback=CrashAt(300))
    assert resume(out) == out
    assert_same_model(whole / "model.zip", out / "model.zip")


@pytest.mark.gpu
@pytest.mark.parametrize("face", ["joint", "branched"])
def test_counterfactual_training_blocks_are_captured_on_cuda(face: str) -> None:
    """On CUDA the all-action targets (the env's counterfactual step, the expanded batch's loss) run inside
    the captured training block: no host sync, no capture error."""
    import torch

    from foxhunt.device_lob_env import DeviceLOBVecEnv

    env = DeviceLOBVecEnv(64, device="cuda", seed=0, data="synthetic", num_steps=3000, episode_length=50,
                          action_face=face)
    policy = dict(net_arch=[16], n_ensemble=2, n_cos=8, n_quantiles=4, n_quantiles_target=4,
                  n_quantiles_act=4, n_atoms=11)
    model = BranchingIQN("MlpPolicy", env, learning_starts=512, batch_size=64, buffer_size=20_000,
                         train_freq=4, target_update_interval=500, policy_kwargs=policy, seed=0,
                         device="cuda", hindsight=False, vaccine_interval=0, counterfactual=True,
                         cuda_graph=True, graph_collect=True)
    before = [p.detach().clone() for p in model.policy.q_net.parameters()]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.learn(6_400)
    eager = [str(w.message) for w in caught
             if issubclass(w.category, RuntimeWarning) and "eager" in str(w.message)]
    assert not eager, eager  # a block left eager warns with its reason (a capture error)
    block = model.collector.block
    assert block is not None and block.captures >= 1 and block.replays > block.captures
    after = list(model.policy.q_net.parameters())
    assert all(torch.isfinite(p).all() for p in after)
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
