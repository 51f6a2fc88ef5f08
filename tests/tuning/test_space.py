"""The search space: defaults, file overrides, bad files, and how values land in a RunConfig."""

from __future__ import annotations

import json
import re
from pathlib import Path

import optuna
import pytest

from foxhunt import presets
from foxhunt.runs import RunConfig
from tuning.space import DEFAULT_SPACE, Param, load_space, suggest, to_run_config


def test_every_default_knob_reaches_the_algorithm() -> None:
    """A sample of the full default space becomes BranchingIQN, policy and hindsight arguments (on the
    branched action face, where every knob applies; the joint face: test_space_faces.py)."""
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    study.enqueue_trial({"hindsight": True})
    trial = study.ask()
    values = suggest(trial, load_space(), action_face="branched")
    config = to_run_config(RunConfig(action_face="branched"), values)
    model = config.resolved_model_kwargs()
    for name in (
        "learning_rate",
        "gamma",
        "batch_size",
        "train_freq",
        "gradient_steps",
        "target_update_interval",
        "exploration_fraction",
        "exploration_final_eps",
        "ensemble_bonus",
        "c51_alpha",
        "vaccine_interval",
    ):
        assert model[name] == values[f"algorithm.{name}"], name
    assert model["exploration_mults"] == {
        b: values[f"algorithm.exploration_mults.{b}"] for b in presets.BRANCH_NAMES
    }
    assert model["boltzmann_branches"] == [
        b for b in presets.BRANCH_NAMES if values[f"algorithm.boltzmann_branches.{b}"]
    ]
    assert model["iqr_bonus"] == [values["algorithm.iqr_bonus.start"], values["algorithm.iqr_bonus.end"]]
    policy = config.resolved_policy_kwargs()
    assert policy["popart"] is values["policy.popart"]
    assert policy["net_arch"] == [values["policy.net_width"]] * len(RunConfig().policy.net_arch)
    assert config.hindsight is True and model["hindsight"] is True
    assert RunConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


def test_hindsight_off_in_a_trial_is_off_in_its_run() -> None:
    study = optuna.create_study()
    study.enqueue_trial({"hindsight": False})
    values = suggest(study.ask(), load_space(), action_face="branched")
    assert values["hindsight"] is False
    config = to_run_config(RunConfig(action_face="branched"), values)
    assert config.hindsight is False and config.resolved_model_kwargs()["hindsight"] is False


def test_space_file_overrides_fixes_and_drops(tmp_path: Path) -> None:
    path = tmp_path / "space.yaml"
    path.write_text(
        "learning_rate: {type: float, low: 1.0e-4, high: 1.0e-3, log: true}\n"
        "gamma: 0.97\nnet_width: null\ntarget_update_interval: {type: int, low: 100, high: 500, step: 100}\n"
    )
    space = load_space(path)  # the names of earlier versions read as their dotted names
    assert space["algorithm.learning_rate"] == Param("float", 1e-4, 1e-3, log=True)
    assert space["algorithm.gamma"] == 0.97
    assert space["algorithm.batch_size"] == DEFAULT_SPACE["algorithm.batch_size"]
    values = suggest(optuna.create_study().ask(), space)
    assert values["algorithm.gamma"] == 0.97 and "policy.net_width" not in values
    assert values["algorithm.target_update_interval"] in (100, 200, 300, 400, 500)
    json_path = tmp_path / "space.json"
    json_path.write_text(json.dumps({"algorithm.batch_size": {"type": "categorical", "choices": [16, 32]}}))
    assert load_space(json_path)["algorithm.batch_size"] == Param("categorical", choices=(16, 32))


def test_a_space_file_searches_any_field_of_the_config_tree(tmp_path: Path) -> None:
    path = tmp_path / "space.yaml"
    path.write_text("env.episode_length: {type: int, low: 50, high: 60}\nalgorithm.tau: 0.5\n")
    values = suggest(optuna.create_study().ask(), load_space(path), action_face="joint")
    assert 50 <= values["env.episode_length"] <= 60 and values["algorithm.tau"] == 0.5
    config = to_run_config(RunConfig(action_face="joint"), values)
    assert config.env.episode_length == values["env.episode_length"] and config.algorithm.tau == 0.5
    assert config.resolved_model_kwargs()["tau"] == 0.5


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("learning_rat: {type: float, low: 0.1, high: 0.2}\n", "learning_rat"),
        ("gamma: {type: floaty, low: 0.9, high: 0.99}\n", "floaty"),
        ("gamma: {type: float, low: 0.99, high: 0.9}\n", "low=0.99"),
        ("gamma: {type: float, low: 0.9, high: 0.99, lo: 1}\n", "lo"),
        ("learning_rate: {type: float, low: 0, high: 0.1, log: true}\n", "low=0"),
        ("batch_size: {type: categorical, choices: []}\n", "choices=[]"),
        ("- a list\n", "mapping"),
    ],
)
def test_bad_space_file_names_the_value(tmp_path: Path, text: str, named: str) -> None:
    path = tmp_path / "space.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=re.escape(named)):
        load_space(path)


def test_missing_space_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="nope.yaml"):
        load_space(tmp_path / "nope.yaml")


def test_samplers_pruners_and_the_retry_callback() -> None:
    from tuning.study import RetryCallback, TrialSeededSampler, make_base_sampler, make_pruner, make_sampler

    assert isinstance(make_base_sampler("tpe", 0), optuna.samplers.TPESampler)
    assert isinstance(make_base_sampler("random", 0), optuna.samplers.RandomSampler)
    for name in ("tpe", "random"):  # each trial's draws come from a sampler of its own seed
        assert isinstance(make_sampler(name, 0), TrialSeededSampler)
    assert isinstance(make_pruner("median"), optuna.pruners.MedianPruner)
    assert isinstance(make_pruner("hyperband"), optuna.pruners.HyperbandPruner)
    assert isinstance(make_pruner("none"), optuna.pruners.NopPruner)
    assert RetryCallback.__name__ in ("RetryHeartbeatStaleTrialCallback", "RetryFailedTrialCallback")
    with pytest.raises(ValueError, match="sampler='grid'"):
        make_sampler("grid", 0)
    with pytest.raises(ValueError, match="pruner='sha'"):
        make_pruner("sha")


def test_a_space_of_an_earlier_version_naming_hindsight_fields_is_refused(tmp_path: Path) -> None:
    """``hindsight_threshold`` (never searched: RunConfig.hindsight is on or off) is an unknown name."""
    path = tmp_path / "space.yaml"
    path.write_text("hindsight_threshold: {type: float, low: 1.0, high: 2.0}\n")
    with pytest.raises(ValueError, match="unknown parameter 'hindsight_threshold'"):
        load_space(path)


def test_tune_options_are_generated_from_the_study_settings_and_the_config_tree() -> None:
    import dataclasses

    import tuning.cli
    from foxhunt.runs import field_names
    from tuning.objective import METRICS
    from tuning.study import PRUNERS, SAMPLERS, StudySettings

    text = tuning.cli.build_parser().format_help()
    studies = [f.name for f in dataclasses.fields(StudySettings) if f.name not in tuning.cli.LAUNCHER_FIELDS]
    for name in studies + field_names():
        assert "--" + name.replace("_", "-") in text, name
    assert "--worker " not in text and "--write-outputs" not in text  # set by the launcher only
    assert all(name in text for name in (*METRICS, *PRUNERS, *SAMPLERS))
    args = tuning.cli.build_parser().parse_args(["--study-name", "s", "--timeout", "60", "--action-face",
                                                 "joint", "--algorithm.gamma", "0.9", "--seed", "3"])
    settings = tuning.cli.settings_from_args(args, seed=3)
    assert (settings.out, settings.n_trials, settings.timeout) == ("studies/s", None, 60)
    assert settings.sampler_seed == 3
    config = tuning.cli.base_config(args)
    assert config.action_face == "joint" and config.algorithm.gamma == 0.9 and config.seed == 3
    assert config.out is None and config.eval_split == "test"  # the study's options, not the base config's
