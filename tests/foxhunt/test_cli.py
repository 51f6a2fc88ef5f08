"""The ``foxhunt`` command line: help, rollout metrics, and an end-to-end ``train`` run folder."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch as th

from foxhunt import presets
from foxhunt.cli import build_parser, config_from_args, main
from foxhunt.runs import RunConfig


@pytest.fixture(autouse=True)
def restore_torch_threads():
    """``main`` sets the torch thread count (``--threads``); put it back afterwards."""
    threads = th.get_num_threads()
    yield
    th.set_num_threads(threads)


def assert_user_error(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> str:
    """``main(argv)`` exits with 2 after one stderr line ``foxhunt: error: ...`` that matches ``message``."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("foxhunt: error: "), err
    assert re.search(message, lines[0]), err
    return lines[0]


def test_help_documents_both_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert "train" in text and "rollout" in text
    train_help = build_parser()._subparsers._group_actions[0].choices["train"].format_help()
    for option in ("--data", "--steps", "--n-envs", "--device", "--seed", "--out", "--hindsight",
                   "--no-hindsight"):
        assert option in train_help, option


def test_rollout_prints_metrics(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rollout", "--steps", "30", "--n-envs", "2", "--no-progress"]) == 0
    text = capsys.readouterr().out
    for metric in ("sharpe", "max_drawdown", "hit_rate", "action_mix", "direction"):
        assert metric in text, metric
    # one vocabulary with units: evaluate's names, the currency named, the action mix labelled
    assert "total_pnl" not in text
    assert "pnl_per_book" in text and "synthetic currency units, after fees, mean over books" in text
    assert "short " in text and "limit_maker " in text and "lots traded per book per step" in text


def test_train_rejects_a_missing_data_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert_user_error(capsys, ["train", "--data", str(tmp_path / "nowhere"), "--steps", "10", "--out",
                               str(tmp_path / "run"), "--no-progress"],
                      "--data='.*nowhere' must be 'synthetic' or a folder")


def test_train_rejects_too_few_eval_steps_before_training(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert_user_error(capsys, ["train", "--steps", "10", "--eval-steps", "1", "--out", str(tmp_path / "run"),
                               "--no-progress"], "--eval-steps=1 must be >= 2")
    assert not (tmp_path / "run").exists()  # refused before anything was written


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--seed", "-1", "--seed=-1 must lie in"), ("--seed", str(2**32), "--seed=4294967296 must lie in"),
    ("--device", "tpu", "--device='tpu' must be cpu or cuda"),
    ("--device", "meta", "--device='meta' must be cpu or cuda"),
])
@pytest.mark.parametrize("command", ["train", "rollout"])
def test_bad_seed_or_device_is_refused_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, flag: str, value: str, message: str
) -> None:
    extra = ["--out", str(tmp_path / "run")] if command == "train" else []
    assert_user_error(capsys, [command, "--steps", "10", flag, value, "--no-progress", *extra], message)
    assert not (tmp_path / "run").exists()


def test_cuda_graph_on_the_cpu_is_refused_before_anything_runs(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert_user_error(capsys, ["train", "--steps", "10", "--cuda-graph", "--no-progress", "--out",
                               str(tmp_path / "run")], "--cuda-graph needs --device cuda, got --device='cpu'")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("command", ["train", "rollout"])
def test_too_few_threads_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             command: str) -> None:
    extra = ["--out", str(tmp_path / "run")] if command == "train" else []
    assert_user_error(capsys, [command, "--steps", "10", "--threads", "0", "--no-progress", *extra],
                      "--threads=0 must be >= 1")
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(th.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("command", ["train", "rollout"])
def test_cuda_without_a_cuda_device_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        command: str) -> None:
    extra = ["--out", str(tmp_path / "run")] if command == "train" else []
    assert_user_error(capsys, [command, "--device", "cuda", "--steps", "10", "--no-progress", *extra],
                      "--device='cuda': no CUDA device is available")


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_shows_the_traceback(tmp_path: Path, where: str) -> None:
    argv = ["train", "--steps", "10", "--eval-steps", "1", "--out", str(tmp_path / "run")]
    argv = ["--debug", *argv] if where == "before" else [*argv, "--debug"]
    with pytest.raises(ValueError, match="--eval-steps=1 must be >= 2"):
        main(argv)


def test_train_refuses_a_used_out_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "diagnostics.jsonl").write_text("{}\n")
    assert_user_error(capsys, ["train", "--steps", "10", "--out", str(out), "--no-progress"],
                      r"out='.*run' is not empty: give a new folder, or continue that run with --resume")
    assert sorted(p.name for p in out.iterdir()) == ["diagnostics.jsonl"]


def _train_config(argv: list[str]) -> RunConfig:
    return config_from_args(build_parser().parse_args(["train", *argv]))


def test_config_file_with_options_given_on_the_command_line_overriding_it(tmp_path: Path) -> None:
    assert _train_config([]) == RunConfig()  # the options' defaults are RunConfig's
    # the branched face named: --hindsight applies to it whichever face is the default
    path = RunConfig(steps=77, seed=3, n_envs=3, hindsight=False, checkpoint_every=20, action_face="branched",
                     model_kwargs={"gamma": 0.9}).save(tmp_path / "config.json")
    config = _train_config(["--config", str(path), "--seed", "4", "--hindsight", "--keep-checkpoints", "0"])
    assert config == RunConfig(steps=77, seed=4, n_envs=3, hindsight=True, checkpoint_every=20,
                               keep_checkpoints=0, action_face="branched", model_kwargs={"gamma": 0.9})
    assert _train_config(["--config", str(path)]) == RunConfig.load(path)


def test_recipe_fast_sets_its_fields_and_the_options_given_override_it(tmp_path: Path) -> None:
    fast = _train_config(["--recipe", "fast"])
    assert (fast.n_envs, fast.algorithm.learning_rate, fast.algorithm.gamma, fast.algorithm.c51_alpha) == (
        64, 1e-3, 0.9, 0.0)
    assert (fast.algorithm.train_freq, fast.algorithm.gradient_steps, fast.policy.n_ensemble) == (8, 8, 1)
    # the GPU's replay sizes on any device, and a run long enough to learn
    assert (fast.algorithm.batch_size, fast.algorithm.learning_starts, fast.algorithm.buffer_size,
            fast.algorithm.target_update_interval, fast.steps) == (256, 20_000, 500_000, 20_000, 2**20)
    assert fast.device == RunConfig().device and fast.action_face == RunConfig().action_face  # the defaults
    mine = _train_config(["--recipe", "fast", "--algorithm.gamma", "0.95", "--hyperparams", "n_ensemble:2"])
    assert (mine.algorithm.gamma, mine.policy.n_ensemble, mine.algorithm.learning_rate) == (0.95, 2, 1e-3)
    # over a config file: the recipe's fields replace the file's, the file keeps the others
    path = RunConfig(steps=77, n_envs=3, model_kwargs={"gamma": 0.5}).save(tmp_path / "config.json")
    assert _train_config(["--config", str(path), "--recipe", "fast"]).steps == 2**20
    over = _train_config(["--config", str(path), "--recipe", "fast", "--steps", "77"])
    assert (over.steps, over.n_envs, over.algorithm.gamma, over.seed) == (77, 64, 0.9, 0)


def test_an_unknown_recipe_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["train"])
    args.recipe = "slow"
    with pytest.raises(ValueError, match=r"--recipe='slow': no such recipe \(recipes: fast\)"):
        config_from_args(args)
    with pytest.raises(SystemExit):
        main(["train", "--recipe", "slow"])
    assert "invalid choice: 'slow'" in capsys.readouterr().err


@pytest.mark.parametrize(("content", "message"), [
    ({"steps": 10, "stepz": 3}, r"unknown RunConfig fields \['stepz'\]"),
    ({"seed": 1.5}, r"RunConfig.seed=1.5 must be an integer"),
    ({"steps": "10"}, r"RunConfig.steps='10' must be an integer"),
    ({"device": "tpu"}, r"config.json: device='tpu' must be cpu or cuda"),
    ({"data": "/nowhere"}, r"config.json: data='/nowhere' must be 'synthetic' or a folder"),
    ([1, 2], r"a run config must be a JSON object, got list"),
])
def test_a_bad_config_file_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               content: object, message: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(content))
    assert_user_error(capsys, ["train", "--config", str(path), "--out", str(tmp_path / "run")], message)
    assert not (tmp_path / "run").exists()


def test_a_missing_config_file_is_a_one_line_error(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert_user_error(capsys, ["train", "--config", str(tmp_path / "nope.json")],
                      r"--config='.*nope.json': no such file")


def test_resume_takes_no_run_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert_user_error(capsys, ["train", "--resume", str(tmp_path), "--steps", "10", "--seed", "2"],
                      r"--resume .* continues that run as its config.json says: --steps, --seed cannot be")
    assert_user_error(capsys, ["train", "--resume", str(tmp_path), "--config", str(tmp_path / "c.json")],
                      r"--config cannot be given with it")
    assert_user_error(capsys, ["train", "--resume", str(tmp_path), "--recipe", "fast"],
                      r"--recipe cannot be given with it")
    assert_user_error(capsys, ["train", "--resume", str(tmp_path / "nowhere"), "--no-progress"],
                      r"--resume '.*nowhere': no run folder there")  # the option typed, not resume=


@pytest.mark.gpu
def test_train_on_cuda_runs_graphed_steps(tmp_path: Path) -> None:
    """``--device cuda`` trains with ``cuda_graph`` on by default (and ``--no-cuda-graph`` turns it off)."""
    from sb3_her_ext import BranchingIQN

    for flags, graphed in (([], True), (["--no-cuda-graph"], False)):
        out = tmp_path / f"run_{graphed}"
        assert main(["train", "--device", "cuda", "--steps", "600", "--n-envs", "4", "--out", str(out),
                     "--no-progress", "--eval-steps", "5", *flags]) == 0
        assert json.loads((out / "config.json").read_text())["cuda_graph"] is graphed
        model = BranchingIQN.load(out / "model.zip", device="cuda")
        assert model.cuda_graph is graphed and model.num_timesteps == 600


@pytest.mark.slow
def test_train_writes_the_run_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sb3_her_ext import BranchingIQN
    from sb3_her_ext.diagnostics import DIAGNOSTICS_KEYS, read_diagnostics

    out = tmp_path / "run"
    assert main(["train", "--steps", "240", "--n-envs", "2", "--out", str(out), "--no-progress",
                 "--eval-steps", "20", "--no-hindsight", "--seed", "3"]) == 0
    text = capsys.readouterr().out
    for metric in ("sharpe", "max_drawdown", "hit_rate", "action_mix"):
        assert metric in text, metric
    assert str(out) in text
    for name in ("model.zip", "config.json", "diagnostics.jsonl", "training.png", "evaluation.json"):
        assert (out / name).is_file(), name
    assert list((out / "tb").glob("*/events.out.tfevents.*"))
    assert (out / "training.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    config = json.loads((out / "config.json").read_text())
    assert config["steps"] == 240 and config["n_envs"] == 2 and config["hindsight"] is False
    assert config["seed"] == 3 and config["cuda_graph"] is False  # off on the CPU
    assert config["action_face"] == presets.ACTION_FACE  # the default face, recorded
    lines = read_diagnostics(out / "diagnostics.jsonl")
    assert lines and all(tuple(line) == DIAGNOSTICS_KEYS for line in lines)
    assert lines[-1]["step"] == 240
    evaluation = json.loads((out / "evaluation.json").read_text())
    assert evaluation["steps"] == 20 * 2
    model = BranchingIQN.load(out / "model.zip")
    assert model.hindsight_config is None and model.num_timesteps == 240
    obs = np.zeros((2, model.observation_space.shape[0]), np.float32)
    actions, _ = model.predict(obs, deterministic=True)
    assert actions.shape == ((2, 4) if presets.ACTION_FACE == "branched" else (2,))


@pytest.mark.slow
def test_train_on_lobster_evaluates_on_the_test_split(lobster_dir: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert main(["train", "--data", str(lobster_dir), "--steps", "160", "--n-envs", "2", "--out", str(out),
                 "--no-progress", "--eval-steps", "10"]) == 0
    assert "evaluation: deterministic policy, test split" in capsys.readouterr().out
    config = json.loads((out / "config.json").read_text())
    assert config["hindsight"] is (config["action_face"] == "branched")  # on by default where it applies
    evaluation = json.loads((out / "evaluation.json").read_text())
    # the short test split holds fewer disjoint episode windows than the 2 books asked for: books are cut
    # to the windows (foxhunt.evaluation.api.plan_windows), each scored for --eval-steps
    books = evaluation["setup"]["books"]
    assert evaluation["eval_data"] == "test split" and 1 <= books <= 2 and evaluation["steps"] == 10 * books


def test_every_config_field_is_an_option_named_by_its_dotted_path() -> None:
    from foxhunt.runs import field_names

    train_help = build_parser()._subparsers._group_actions[0].choices["train"].format_help()
    for name in field_names():
        assert "--" + name.replace("_", "-") in train_help, name
    assert "Adam's learning rate" in train_help  # the field's docstring is its help
    config = _train_config(["--algorithm.learning-rate", "1e-3", "--env.episode-length", "200",
                            "--policy.net-arch", "[32, 32]", "--no-policy.popart", "--env.market",
                            '{"signal_strength": 0.5}'])
    assert config.algorithm.learning_rate == 1e-3 and config.env.episode_length == 200
    assert config.policy.net_arch == [32, 32] and config.policy.popart is False
    # every env value the run uses (issue 37): the options given, the defaults, the chosen market seed
    expected = {**RunConfig().env.kwargs(), "episode_length": 200, "market_seed": 0, "signal_strength": 0.5}
    assert config.resolved_env_kwargs() == expected
    assert config.resolved_model_kwargs()["learning_rate"] == 1e-3


def test_hyperparams_set_fields_by_dotted_or_bare_name() -> None:
    config = _train_config(["--hyperparams", "algorithm.gamma:0.9", "episode_length:100", "batch_size:32",
                            "iqr_bonus:[0.1, 0.0]", "env.market.signal_strength:0.25", "--seed", "4"])
    assert config.algorithm.gamma == 0.9 and config.env.episode_length == 100 and config.seed == 4
    assert config.algorithm.batch_size == 32 and config.algorithm.iqr_bonus == [0.1, 0.0]
    assert config.env.market == {"signal_strength": 0.25}
    # an option given wins over --hyperparams
    assert _train_config(["--hyperparams", "steps:50", "--steps", "60"]).steps == 60


@pytest.mark.parametrize(("argv", "message"), [
    (["--n-envs", "0"], r"--n-envs=0 must be >= 1$"),
    (["--algorithm.gamma", "2"], r"--algorithm\.gamma=2\.0 must lie in \[0, 1\]$"),
    (["--algorithm.batch-size", "64", "--algorithm.buffer-size", "10"],
     r"--algorithm\.buffer-size=10 must be >= batch_size=64$"),
    (["--env.max-position", "-1"], r"--env\.max-position=-1\.0 must be > 0$"),
    (["--algorithm.buffer-size", "x"], r"invalid int value"),
    (["--hyperparams", "gama:0.9"],
     r"--hyperparams gama: no config field or market option of that name; did you mean 'gamma'\?$"),
    (["--hyperparams", "n_quantiles:4x"], r"--policy\.n-quantiles='4x' must be an integer"),
    (["--hyperparams", "gamma"], r"--hyperparams 'gamma' must be KEY:VALUE"),
])
def test_bad_options_name_the_option_typed(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           argv: list[str], message: str) -> None:
    argv = ["train", *argv, "--out", str(tmp_path / "run"), "--no-progress"]
    if "invalid int value" in message:
        with pytest.raises(SystemExit):
            main(argv)
        assert re.search(message, capsys.readouterr().err)
    else:
        assert_user_error(capsys, argv, message)
    assert not (tmp_path / "run").exists()


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert re.fullmatch(r"foxhunt \S+\n", capsys.readouterr().out)


def test_a_best_config_of_a_study_trains_with_config(tmp_path: Path) -> None:
    """``best_config.json`` is a RunConfig JSON: ``foxhunt train --config`` takes it, with options over it."""
    path = RunConfig(steps=50, action_face="joint", algorithm={"learning_rate": 5e-4},
                     policy={"net_arch": [8, 8]}).save(tmp_path / "best_config.json")
    config = _train_config(["--config", str(path), "--eval-split", "test", "--algorithm.gamma", "0.95"])
    assert config == RunConfig(steps=50, action_face="joint", eval_split="test",
                               algorithm={"learning_rate": 5e-4, "gamma": 0.95}, policy={"net_arch": [8, 8]})


@pytest.mark.parametrize(("argv", "message"), [
    (["--n-envs", "0"], r"--n-envs=0 must be >= 1$"),  # issue 29: not num_books=0
    (["--steps", "1"], r"--steps=1 must be >= 2$"),
])
def test_rollout_errors_name_the_option_typed(capsys: pytest.CaptureFixture[str], argv: list[str],
                                              message: str) -> None:
    assert_user_error(capsys, ["rollout", *argv, "--no-progress"], message)


# ------------------------------------------------------------- issue 39.4-6: answers at once, in one line


def test_the_light_copies_of_foxenv_names_agree_with_foxenv() -> None:
    """The parser is built without torch, from copies of two foxenv constants: they must stay the same."""
    from foxenv import spec
    from foxenv.factory import MARKET_KWARGS
    from foxhunt.options import MARKET_OPTIONS

    assert presets.BRANCH_NAMES == spec.BRANCH_NAMES
    assert MARKET_OPTIONS == MARKET_KWARGS


@pytest.mark.parametrize(("argv", "message"), [
    (["train", "--n-envs", "x"], r"^foxhunt train: error: argument --n-envs: invalid int value: 'x'$"),
    (["train", "--action-face", "flat"],
     r"^foxhunt train: error: argument --action-face: invalid choice: 'flat'"),
    (["train", "--stepz", "3"], r"unrecognized arguments: --stepz 3; did you mean '--steps'\?$"),
    (["train", "--algorithm.gama", "0.9"], r"did you mean '--algorithm\.gamma'\?$"),
    (["train", "--env.market", "signal_strength: 1"],
     r"argument --env\.market: 'signal_strength: 1' is not a JSON object; give one such as"),
    (["train", "--time-limit", "90x"], r"argument --time-limit: '90x' is no duration"),
    (["train", "--exp-name", "a/b"], r"argument --exp-name: 'a/b' must be letters"),
    (["evalute"],
     r"^foxhunt: error: argument \{train,evaluate,watch,rollout,tune\}: invalid choice: 'evalute' .*; "
     r"did you mean 'evaluate'\?$"),
    (["train", "--action-face", "joitn"], r"invalid choice: 'joitn' .*; did you mean 'joint'\?$"),
])
def test_an_argument_error_is_one_line_and_a_hint(capsys: pytest.CaptureFixture[str], argv: list[str],
                                                  message: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2, lines  # not the 63-line usage
    assert re.search(message, lines[0]), lines[0]
    help_line = "(foxhunt --help lists the options)" if argv == ["evalute"] else \
        "(foxhunt train --help lists the options)"
    assert lines[1] == help_line


@pytest.mark.parametrize(("argv", "message"), [
    (["--hyperparams", "signal_strenght:1"],
     r"--hyperparams signal_strenght: no config field or market option of that name; did you mean "
     r"'signal_strength'\?$"),
    (["--env.market", '{"signal_strenght": 1}'], r"^foxhunt: error: --env\.market has no option "
                                                 r"'signal_strenght'; did you mean 'signal_strength'\?$"),
    (["--hyperparams", "env.market.wave_rat:0.1"], r"--env\.market has no option 'wave_rat'; did you mean "
                                                   r"'wave_rate'\?$"),
])
def test_a_misspelt_market_key_gets_the_closest_name(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     argv: list[str], message: str) -> None:
    line = assert_user_error(capsys, ["train", *argv, "--out", str(tmp_path / "run")], message)
    assert len(line) < 160  # no list of every field
    assert not (tmp_path / "run").exists()


def test_a_bare_market_option_in_hyperparams_sets_the_market() -> None:
    config = _train_config(["--hyperparams", "signal_strength:1.5", "--env.market", '{"signal_horizon": 4}'])
    assert config.env.market == {"signal_horizon": 4, "signal_strength": 1.5}


def test_a_config_file_with_a_misspelt_market_key_names_the_file(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"env": {"market": {"signal_strenth": 1}}}))
    assert_user_error(capsys, ["train", "--config", str(path)],  # the file's name for it
                      r"RunConfig\.env\.market has no option 'signal_strenth'; did you mean "
                      r"'signal_strength'\?")


def test_library_names_of_values_are_said_as_the_option_typed(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    line = assert_user_error(capsys, ["train", "--data", str(tmp_path / "empty"), "--steps", "10", "--out",
                                      str(tmp_path / "run"), "--no-progress"], r"--data='.*empty' holds no")
    assert "source=" not in line


def test_train_help_is_grouped_by_section() -> None:
    train_help = build_parser()._subparsers._group_actions[0].choices["train"].format_help()
    assert len(train_help.split("\n\n", 1)[0].splitlines()) <= 2  # a short usage, not every option
    titles = ["command (", "run (", "env (", "algorithm (", "policy ("]
    starts = [train_help.index("\n" + title) for title in titles]
    assert starts == sorted(starts)
    sections = dict(zip(titles, [train_help[a:b] for a, b in zip(starts, [*starts[1:], None], strict=True)],
                        strict=True))
    assert "--time-limit" in sections["command ("] and "--resume" in sections["command ("]
    assert "--n-envs" in sections["run ("] and "--hyperparams" in sections["run ("]
    assert "--env.episode-length" in sections["env ("] and "--algorithm." not in sections["env ("]
    assert "--algorithm.gamma" in sections["algorithm ("] and "--policy." not in sections["algorithm ("]
    assert "--policy.net-arch" in sections["policy ("]
    market_help = " ".join(sections["env ("].split("--env.market JSON", 1)[1].split())
    for key in ("signal_strength", "signal_horizon", "train_fraction", "wave_rate"):
        assert key in market_help, key


def test_exp_name_names_the_run_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert_user_error(capsys, ["train", "--exp-name", "demo", "--out", str(tmp_path / "x")],
                      r"--exp-name demo names a new folder under runs/: give it or --out, not both")
    assert_user_error(capsys, ["train", "--resume", str(tmp_path), "--exp-name", "demo"],
                      r"--exp-name cannot be given with it")
