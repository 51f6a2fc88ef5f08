"""The search space on each action face: the joint face samples no per-branch or hindsight parameter."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from foxhunt import presets
from foxhunt.runs import RunConfig
from tuning.space import BRANCHED_PARAMS, DEFAULT_SPACE, face_space, load_space, suggest, to_run_config


def _sampled(trial: optuna.Trial) -> set[str]:
    return set(trial.params)


def test_every_branched_param_is_in_the_default_space() -> None:
    assert set(BRANCHED_PARAMS) <= set(DEFAULT_SPACE)
    assert {"algorithm.exploration_mults.direction", "algorithm.boltzmann_branches.urgency", "hindsight",
            "algorithm.vaccine_interval"} <= set(BRANCHED_PARAMS)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_joint_trial_samples_no_branched_param(seed: int) -> None:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    trial = study.ask()
    values = suggest(trial, load_space(), action_face="joint")
    assert not set(values) & set(BRANCHED_PARAMS)
    assert not _sampled(trial) & set(BRANCHED_PARAMS)  # Optuna was never asked for them
    assert {"algorithm.learning_rate", "algorithm.gamma", "policy.net_width"} <= _sampled(trial)
    assert "algorithm.vaccine_interval" not in _sampled(trial)  # the vaccine stratifies by a branch
    config = to_run_config(RunConfig(action_face="joint"), values)
    assert config.action_face == "joint" and config.resolved_hindsight() is False
    model = config.resolved_model_kwargs()
    assert not set(presets.BRANCHED_ALGORITHM_ARGS) & set(model)
    assert model["learning_rate"] == values["algorithm.learning_rate"] and model["hindsight"] is False
    assert model["vaccine_interval"] == 0  # the joint face's preset


def test_a_branched_trial_still_samples_them() -> None:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    trial = study.ask()
    suggest(trial, load_space(), action_face="branched")
    assert {name for name in BRANCHED_PARAMS if not name.startswith("hindsight.")} <= _sampled(trial)


def test_suggest_follows_the_default_face() -> None:
    """Without a face, suggest takes the config tree's default one (``RunConfig.action_face``)."""
    default = RunConfig().action_face
    trial = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0)).ask()
    values = suggest(trial, load_space())
    assert ("algorithm.exploration_mults.magnitude" in values) is (default == "branched")
    config = to_run_config(RunConfig(), values)  # the default base is the default face's
    assert config.resolved_action_face() == default


def test_branched_values_on_a_joint_base_are_an_error() -> None:
    trial = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0)).ask()
    values = suggest(trial, load_space(), action_face="branched")
    with pytest.raises(ValueError, match=r"apply to the branched action face.*action_face='joint'"):
        to_run_config(RunConfig(action_face="joint"), values)


def test_a_space_file_fixing_hindsight_on_cannot_take_the_joint_face(tmp_path: Path) -> None:
    path = tmp_path / "space.yaml"
    path.write_text("hindsight: true\nexploration_mult_order: 2.0\n")
    space = load_space(path)
    assert face_space(space, "branched")["hindsight"] is True
    with pytest.raises(ValueError, match=r"'hindsight'.*action_face='joint'"):
        face_space(space, "joint")
    path.write_text("hindsight: false\nexploration_mult_order: 2.0\n")
    joint = face_space(load_space(path), "joint")
    assert joint["hindsight"] is None and joint["algorithm.exploration_mults.order"] is None
    with pytest.raises(ValueError, match=r"action_face='flat'"):
        face_space(space, "flat")
