"""Before the first trial: resumed studies propose new parameters, the space fits the face and budget, every
value a trial can draw is checked, the launcher's devices, the storage's driver and failures in one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from foxhunt.cli import main as foxhunt_main
from foxhunt.runs import RunConfig
from tests.tuning.conftest import TINY_CONFIG
from tuning.cli import base_config
from tuning.cli import build_parser as tune_parser
from tuning.preflight import MIN_TARGET_UPDATES, check_space, fit_space
from tuning.space import DEFAULT_SPACE, Param, load_space, suggest
from tuning.study import make_sampler, make_storage, space_record
from tuning.workers import parse_n_workers, shares, worker_devices


def _trials(storage: str, sampler: optuna.samplers.BaseSampler, n_trials: int) -> None:
    study = optuna.create_study(study_name="s", storage=storage, sampler=sampler, load_if_exists=True)
    space = load_space()

    def objective(trial: optuna.Trial) -> float:
        return float(suggest(trial, space, action_face="branched")["algorithm.learning_rate"])

    study.optimize(objective, n_trials=n_trials)


@pytest.mark.parametrize("name", ["random", "tpe"])
def test_a_resumed_study_proposes_new_parameters(tmp_path: Path, name: str) -> None:
    """Three trials, then the study resumed with the same sampler seed for two more (issue 29.3: with
    Optuna's own seeded sampler, trials 3 and 4 repeat trials 0 and 1)."""
    plain = f"sqlite:///{tmp_path / 'plain.db'}"
    for _ in range(2):  # the failure this guards against, shown on Optuna's sampler
        _trials(plain, optuna.samplers.RandomSampler(seed=0), 3 if _ == 0 else 2)
    repeated = optuna.load_study(study_name="s", storage=plain).trials
    assert [t.params for t in repeated[3:]] == [t.params for t in repeated[:2]]

    ours = f"sqlite:///{tmp_path / 'ours.db'}"
    _trials(ours, make_sampler(name, 0, n_startup_trials=10), 3)
    _trials(ours, make_sampler(name, 0, n_startup_trials=10), 2)
    trials = optuna.load_study(study_name="s", storage=ours).trials
    keys = [json.dumps(t.params, sort_keys=True) for t in trials]
    assert len(trials) == 5 and len(set(keys)) == 5
    # and reproducible: the same seed draws the same study in a fresh storage
    again = f"sqlite:///{tmp_path / 'again.db'}"
    _trials(again, make_sampler(name, 0, n_startup_trials=10), 5)
    assert [t.params for t in optuna.load_study(study_name="s", storage=again).trials] == [
        t.params for t in trials
    ]


def test_the_space_fits_the_face_and_the_budget() -> None:
    joint, notes = fit_space(load_space(), RunConfig(steps=20_000, action_face="joint"))
    assert joint["algorithm.vaccine_interval"] is None
    assert joint["algorithm.exploration_mults.direction"] is None
    assert joint["algorithm.target_update_interval"] == Param("int", 250, 5000, log=True)
    assert any(note.startswith("not searched on the joint action face")
               and "algorithm.vaccine_interval" in note for note in notes)
    assert any("algorithm.target_update_interval searched in [250, 5000]" in note for note in notes)
    branched, _ = fit_space(load_space(), RunConfig(steps=200_000, action_face="branched"))
    assert branched["algorithm.vaccine_interval"] == DEFAULT_SPACE["algorithm.vaccine_interval"]
    assert branched["algorithm.target_update_interval"] == DEFAULT_SPACE["algorithm.target_update_interval"]
    small, notes = fit_space(load_space(), RunConfig(steps=400, action_face="branched"))
    assert small["algorithm.target_update_interval"] == 400 // MIN_TARGET_UPDATES
    assert any("algorithm.target_update_interval fixed at 100" in note for note in notes)
    stepped, _ = fit_space({"algorithm.target_update_interval": Param("int", 100, 5000, step=300)},
                           RunConfig(steps=4000))
    # the highest value the step reaches
    assert stepped["algorithm.target_update_interval"] == Param("int", 100, 1000, step=300)


def test_action_face_option_reaches_the_base_config() -> None:
    args = tune_parser().parse_args(["--action-face", "branched"])
    assert base_config(args).action_face == "branched"
    assert base_config(tune_parser().parse_args([])).action_face == RunConfig().action_face


@pytest.mark.parametrize(
    ("entries", "line"),
    [
        ('{"learning_rate": "fast"}',
         "space parameter 'algorithm.learning_rate'='fast' cannot be used: "),
        ('{"gamma": {"type": "float", "low": 1.5, "high": 2}}',
         "space parameter 'algorithm.gamma'=1.5 cannot be used: "),
        ('{"learning_rate": {"type": "float", "low": 1e-4, "high": Infinity}}',
         "space parameter 'algorithm.learning_rate': high=inf must be finite"),
        ('{"batch_size": {"type": "categorical", "choices": [16, 0]}}',
         "space parameter 'algorithm.batch_size'=0 cannot be used: "),
        ('{"net_width": {"type": "categorical", "choices": [16, "wide"]}}',
         "space parameter 'policy.net_width'='wide' cannot be used"),
    ],
)
def test_a_value_no_trial_can_use_is_one_line_before_any_trial(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], entries: str, line: str
) -> None:
    config, space = tmp_path / "base.json", tmp_path / "s.json"
    config.write_text(json.dumps(TINY_CONFIG))
    space.write_text(entries)
    out = tmp_path / "study"
    argv = ["tune", "--config", str(config), "--space", str(space), "--out", str(out), "--no-progress"]
    assert foxhunt_main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("foxhunt: error: " + line) and err.count("\n") == 1, err
    assert not out.exists()  # no storage, no trial


def test_check_space_passes_the_default_space() -> None:
    base = RunConfig.from_dict({**RunConfig().to_dict(), **TINY_CONFIG, "action_face": "branched"})
    space, _ = fit_space(load_space(), base)
    check_space(space, base)  # every corner of every default parameter builds BranchingIQN


def test_the_space_is_recorded_as_optuna_distribution_json() -> None:
    record = space_record({"learning_rate": Param("float", 1e-4, 1e-3, log=True), "gamma": 0.97,
                           "net_width": None})
    assert record["gamma"] == {"fixed": 0.97} and "net_width" not in record
    assert optuna.distributions.json_to_distribution(record["learning_rate"]) == (
        optuna.distributions.FloatDistribution(1e-4, 1e-3, log=True)
    )


def test_a_space_file_may_give_optuna_distribution_json(tmp_path: Path) -> None:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    distributions = {
        "algorithm.learning_rate": FloatDistribution(1e-4, 1e-3, log=True),
        "algorithm.batch_size": IntDistribution(16, 64, step=16),
        "policy.net_width": CategoricalDistribution([8, 16]),
    }
    to_json = optuna.distributions.distribution_to_json
    entries = {name: json.loads(to_json(d)) for name, d in distributions.items()}
    path = tmp_path / "space.json"
    path.write_text(json.dumps({**entries, "algorithm.gamma": 0.97}))
    space = load_space(path)
    assert space["algorithm.learning_rate"] == Param("float", 1e-4, 1e-3, log=True)
    assert space["algorithm.batch_size"] == Param("int", 16, 64, step=16)
    assert space["policy.net_width"] == Param("categorical", choices=(8, 16))
    record = space_record({name: space[name] for name in distributions})  # the study's record: the same JSON
    assert {name: json.loads(text) for name, text in record.items()} == entries
    bad = {"name": "FloatDistribution", "attributes": {"low": 0.9}}
    path.write_text(json.dumps({"algorithm.gamma": bad}))
    with pytest.raises(ValueError, match="'algorithm.gamma': .* is not an Optuna distribution"):
        load_space(path)


def test_workers_devices_for_any_number_of_gpus() -> None:
    assert worker_devices(None, None, 8) == [f"cuda:{k}" for k in range(8)]
    assert worker_devices(None, "cuda", 3, workers_per_gpu=2) == ["cuda:0", "cuda:0", "cuda:1", "cuda:1",
                                                                 "cuda:2", "cuda:2"]
    assert worker_devices(5, "cuda", 2) == ["cuda:0", "cuda:1", "cuda:0", "cuda:1", "cuda:0"]
    assert worker_devices(3, "cuda:1", 2) == ["cuda:1"] * 3
    assert worker_devices(2, None, 0) == ["cpu", "cpu"]
    with pytest.raises(ValueError, match="no GPU is visible"):
        worker_devices(None, None, 0)
    with pytest.raises(ValueError, match="--device='cpu' contradicts"):
        worker_devices(None, "cpu", 4)
    with pytest.raises(ValueError, match="--workers-per-gpu=0"):
        worker_devices(None, None, 4, workers_per_gpu=0)
    assert parse_n_workers("auto") is None and parse_n_workers("3") == 3
    with pytest.raises(ValueError, match="--n-workers='0'"):
        parse_n_workers("0")
    assert shares(10, 4) == [3, 3, 2, 2] and shares(2, 4) == [1, 1] and shares(None, 2) == [None, None]


def test_auto_workers_without_a_gpu_is_one_line(capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert foxhunt_main(["tune", "--n-workers", "auto", "--no-progress"]) == 2
    assert capsys.readouterr().err == ("foxhunt: error: --n-workers=auto starts one worker per visible GPU, "
                                       "and no GPU is visible (give --n-workers N for CPU workers)\n")


def test_a_postgresql_url_without_its_driver_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    for module in ("psycopg", "psycopg2"):
        monkeypatch.setitem(sys.modules, module, None)  # import psycopg: ImportError
    with pytest.raises(ValueError) as error:
        make_storage("postgresql://bob:secret@127.0.0.1:1/none")
    assert "foxhunt[postgres]" in str(error.value) and "bob:***@" in str(error.value)
    assert "secret" not in str(error.value)


def test_a_read_only_storage_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "study.db"
    optuna.create_study(study_name="foxhunt", storage=f"sqlite:///{db}")
    config = tmp_path / "base.json"
    config.write_text(json.dumps(TINY_CONFIG))
    space = tmp_path / "space.yaml"
    space.write_text("net_width: 8\nbatch_size: 16\n")
    url = f"sqlite:///file:{db}?mode=ro&uri=true"  # SQLite refuses every write, even as root
    argv = ["tune", "--config", str(config), "--space", str(space), "--storage", url, "--resume",
            "--out", str(tmp_path / "out"), "--no-progress", "--n-trials", "1"]
    assert foxhunt_main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "readonly database" in err and f"storage={url!r} failed" in err, err
    assert optuna.load_study(study_name="foxhunt", storage=f"sqlite:///{db}").get_trials(
        states=(TrialState.RUNNING, TrialState.COMPLETE)) == []


def test_a_full_storage_is_one_line_and_keeps_what_it_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SQLite's own "database or disk is full" (SQLITE_FULL, what a full disk gives), from a page cap."""
    import sqlalchemy

    db = tmp_path / "study.db"
    study = optuna.create_study(study_name="foxhunt", storage=f"sqlite:///{db}", direction="maximize")
    study.add_trial(optuna.trial.create_trial(value=1.0, params={}, distributions={}))
    config = tmp_path / "base.json"
    config.write_text(json.dumps(TINY_CONFIG))
    space = tmp_path / "space.yaml"
    space.write_text("net_width: 8\nbatch_size: 16\n")

    def cap_pages(connection: object, _: object) -> None:  # no page beyond those the file has
        cursor = connection.cursor()
        pages = cursor.execute("PRAGMA page_count").fetchone()[0]
        cursor.execute(f"PRAGMA max_page_count = {pages}")
        cursor.close()

    sqlalchemy.event.listen(sqlalchemy.engine.Engine, "connect", cap_pages)
    try:
        argv = ["tune", "--config", str(config), "--space", str(space), "--storage", f"sqlite:///{db}",
                "--resume", "--out", str(tmp_path / "out"), "--no-progress", "--n-trials", "3"]
        assert foxhunt_main(argv) == 2
    finally:
        sqlalchemy.event.remove(sqlalchemy.engine.Engine, "connect", cap_pages)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "database or disk is full" in err and "failed" in err, err
    kept = optuna.load_study(study_name="foxhunt", storage=f"sqlite:///{db}")
    assert kept.trials[0].state == TrialState.COMPLETE and kept.trials[0].value == 1.0
