"""RunConfig checks, run folders of ``train``, and ``resume``: bit for bit the uninterrupted run (CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from foxhunt.checkpoint import list_checkpoints
from foxhunt.runs import RunConfig, resume, train
from tests.foxhunt._small_runs import SMALL_MODEL_KWARGS, assert_same_model, small_config
from tests.foxhunt._small_runs import Crash as _Crash
from tests.foxhunt._small_runs import CrashAt as _CrashAt


def _diagnostics(run: Path) -> list[dict]:
    lines = [json.loads(line) for line in (run / "diagnostics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in line.items() if k not in ("time", "fps")} for line in lines]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train(small_config(tmp_path_factory.mktemp("runs") / "whole"))


def test_an_uninterrupted_run_leaves_its_checkpoints(uninterrupted: Path) -> None:
    assert [step for step, _ in list_checkpoints(uninterrupted)] == [200, 400, 600]
    assert not list((uninterrupted / "checkpoints").glob(".*"))  # no temporary folder left


@pytest.mark.parametrize("crash_at", [250, 470, 599])
def test_a_resumed_run_equals_the_uninterrupted_one(uninterrupted: Path, tmp_path: Path,
                                                    crash_at: int) -> None:
    out = tmp_path / "run"
    with pytest.raises(_Crash):
        train(small_config(out), callback=_CrashAt(crash_at))
    assert not (out / "model.zip").exists()
    assert [step for step, _ in list_checkpoints(out)] == [s for s in (200, 400) if s <= crash_at]
    assert resume(out) == out
    assert_same_model(uninterrupted / "model.zip", out / "model.zip")
    # the diagnostics written after the checkpoint were cut off and written again, the same
    assert _diagnostics(out) == _diagnostics(uninterrupted)
    assert json.loads((out / "evaluation.json").read_text()) == json.loads(
        (uninterrupted / "evaluation.json").read_text()
    )


def test_a_runs_config_json_records_every_value_that_ran(uninterrupted: Path) -> None:
    """No null where a value ran; loading it resolves to itself (the run again is the same run)."""
    from foxhunt.config import NULL_MEANS
    from foxhunt.runs import unrecorded_fields
    from sb3_her_ext import BranchingIQN

    values = json.loads((uninterrupted / "config.json").read_text())
    assert unrecorded_fields(values, ran=True) == []
    nulls = [name for name, value in values.items() if value is None]
    nulls += [f"{section}.{name}" for section in ("env", "algorithm", "policy")
              for name, value in values[section].items() if value is None]
    assert set(nulls) <= set(NULL_MEANS)
    config = RunConfig.from_dict(values)
    assert config.resolved() == config and config.to_dict() == values
    model = BranchingIQN.load(uninterrupted / "model.zip")
    algorithm = values["algorithm"]
    for name in ("batch_size", "learning_starts", "buffer_size", "target_update_interval", "tau", "gamma",
                 "exploration_fraction", "max_grad_norm", "vaccine_interval", "c51_alpha",
                 "diagnostics_interval"):
        assert getattr(model, name) == algorithm[name], name
    assert model.policy.n_ensemble == values["policy"]["n_ensemble"]


def _with_nulls(run: Path, *names: str) -> None:
    """Rewrite ``run``'s config.json as the code before concrete defaults wrote it: ``null`` for ``names``."""
    values = json.loads((run / "config.json").read_text())
    for name in names:
        section, _, field = name.rpartition(".")
        (values[section] if section else values)[field] = None
    (run / "config.json").write_text(json.dumps(values))


def test_a_config_json_with_nulls_where_values_ran_is_refused_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A config.json written before config.json recorded every value (``batch_size: null``) is a format never
    released: resume refuses it, naming the fields and what to do; ``--config`` says which keys to delete."""
    from foxhunt.cli import main

    out = tmp_path / "run"
    with pytest.raises(_Crash):
        train(small_config(out, steps=300), callback=_CrashAt(250))
    _with_nulls(out, "algorithm.batch_size", "algorithm.tau", "hindsight")
    with pytest.raises(ValueError, match=r"resume='.*run': its config.json has null for hindsight, "
                                         r"algorithm.batch_size, algorithm.tau: .* cannot be resumed; train "
                                         r"it again with foxhunt train"):
        resume(out)
    assert main(["train", "--resume", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "cannot be resumed" in err
    # as --config, a null in a field chosen for the run (hindsight) is fine; one in tau is not
    with pytest.raises(ValueError, match=r"config.json: null for algorithm.tau, where a run uses a value .* "
                                         r"delete those keys"):
        RunConfig.load(out / "config.json")
    _with_nulls(out, "hindsight", "algorithm.batch_size")
    values = json.loads((out / "config.json").read_text())
    values["algorithm"]["tau"] = 1.0
    (out / "config.json").write_text(json.dumps(values))
    assert RunConfig.load(out / "config.json").resolved().algorithm.batch_size == 64


def test_a_config_json_of_the_flat_format_before_the_tree_is_refused(tmp_path: Path) -> None:
    old = {**small_config(None).to_dict(), "model_kwargs": {"batch_size": 16}}
    (tmp_path / "old.json").write_text(json.dumps(old))
    with pytest.raises(ValueError, match=r"unknown RunConfig fields \['model_kwargs'\]"):
        RunConfig.load(tmp_path / "old.json")


def test_a_run_resumed_before_learning_starts_equals_the_uninterrupted_one(tmp_path: Path) -> None:
    """The checkpoint at 200 falls in the uniform random actions before ``learning_starts`` (the action
    space's own generator)."""
    model_kwargs = {**SMALL_MODEL_KWARGS, "learning_starts": 300}
    whole = train(small_config(tmp_path / "whole", steps=400, model_kwargs=model_kwargs))
    out = tmp_path / "run"
    with pytest.raises(_Crash):
        train(small_config(out, steps=400, model_kwargs=model_kwargs), callback=_CrashAt(280))
    resume(out)
    assert_same_model(whole / "model.zip", out / "model.zip")


def test_a_run_crashed_twice_and_resumed_twice_equals_the_uninterrupted_one(uninterrupted: Path,
                                                                            tmp_path: Path) -> None:
    out = tmp_path / "run"
    with pytest.raises(_Crash):
        train(small_config(out), callback=_CrashAt(250))
    with pytest.raises(_Crash):  # the resumed run writes its own checkpoint at 400, then crashes
        resume(out, callback=_CrashAt(530))
    assert [step for step, _ in list_checkpoints(out)] == [200, 400]
    resume(out)
    assert_same_model(uninterrupted / "model.zip", out / "model.zip")
    assert _diagnostics(out) == _diagnostics(uninterrupted)


def test_a_resumed_device_run_equals_the_uninterrupted_one(tmp_path: Path) -> None:
    """Training blocks on the device env resume bit for bit: a checkpoint is written at a block's end, and
    the next learn loads the device counters and the carried schedule values from the saved host ones."""
    fused = dict(device_loop=True, model_kwargs={**SMALL_MODEL_KWARGS, "graph_collect": None})
    whole = train(small_config(tmp_path / "whole", **fused), callback=_CrashAt(10**9))
    out = tmp_path / "run"
    with pytest.raises(_Crash):
        train(small_config(out, **fused), callback=_CrashAt(470))
    resume(out, callback=_CrashAt(10**9))
    assert_same_model(whole / "model.zip", out / "model.zip")
    assert _diagnostics(out) == _diagnostics(whole)


class _FusedCaptures(_CrashAt):
    """Counts the fused graphs the run captured (read at the end of training)."""

    seen = 0

    def _on_training_end(self) -> None:
        block = self.model.collector.block
        self.seen = 0 if block is None else block.captures


@pytest.mark.gpu
@pytest.mark.parametrize(("graph", "graph_collect"), [(False, False), (True, False), (True, None)],
                         ids=["eager", "graphed-step", "fused"])
def test_a_resumed_cuda_run_equals_the_uninterrupted_one(tmp_path: Path, graph: bool,
                                                         graph_collect: bool | None) -> None:
    """Not promised by the issue (CPU only): the GPU's RNGs, the replay's Philox state and the graphed
    step's warm-up are restored or replayed the same way, so it is expected to hold; ``fused`` is the whole
    rollout as one CUDA graph (``graph_collect``)."""
    model_kwargs = {**SMALL_MODEL_KWARGS, "graph_collect": graph_collect}
    cuda = dict(device="cuda", cuda_graph=graph, model_kwargs=model_kwargs)
    captures = _FusedCaptures(10**9)
    whole = train(small_config(tmp_path / "whole", **cuda), callback=captures)
    assert (captures.seen > 0) == (graph_collect is None)  # the fused graph ran exactly where asked
    out = tmp_path / "run"
    with pytest.raises(_Crash):
        train(small_config(out, **cuda), callback=_CrashAt(470))
    resume(out)
    assert_same_model(whole / "model.zip", out / "model.zip")
    assert _diagnostics(out) == _diagnostics(whole)


def test_a_resumed_finished_run_finishes_again_the_same(uninterrupted: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(uninterrupted, copy)
    (copy / "model.zip").unlink()
    resume(copy)
    assert_same_model(uninterrupted / "model.zip", copy / "model.zip")
    assert _diagnostics(copy) == _diagnostics(uninterrupted)


def test_resume_needs_a_run_folder_with_a_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"resume='.*nowhere': no run folder there"):
        resume(tmp_path / "nowhere")
    out = tmp_path / "run"
    with pytest.raises(_Crash):
        train(small_config(out, checkpoint_every=0), callback=_CrashAt(150))
    with pytest.raises(FileNotFoundError, match=r"has no checkpoint to resume from \(checkpoint_every=0\)"):
        resume(out)


def test_train_refuses_a_used_out_folder(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "diagnostics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(ValueError, match=r"out='.*run' is not empty"):
        train(small_config(out, steps=20))
    assert sorted(p.name for p in out.iterdir()) == ["diagnostics.jsonl"]
    assert (out / "diagnostics.jsonl").read_text() == '{"step": 1}\n'


def test_keep_checkpoints_keeps_the_newest(tmp_path: Path) -> None:
    out = train(small_config(tmp_path / "run", steps=300, checkpoint_every=100, keep_checkpoints=2))
    assert [step for step, _ in list_checkpoints(out)] == [200, 300]


@pytest.mark.parametrize(("field", "value", "message"), [
    ("seed", 1.5, "RunConfig.seed=1.5 must be an integer"),
    ("seed", True, "RunConfig.seed=True must be an integer"),
    ("steps", "10", "RunConfig.steps='10' must be an integer"),
    ("checkpoint_every", 2.0, "RunConfig.checkpoint_every=2.0 must be an integer"),
    ("checkpoint_every", -1, "RunConfig.checkpoint_every=-1 must be >= 0"),
    ("keep_checkpoints", -2, "RunConfig.keep_checkpoints=-2 must be >= 0"),
    ("data", 3, "RunConfig.data=3 must be a string"),
    ("device", None, "RunConfig.device=None must be a string"),
    ("out", 7, "RunConfig.out=7 must be a string or None"),
    ("hindsight", "yes", "RunConfig.hindsight='yes' must be a bool"),
    ("progress", 1, "RunConfig.progress=1 must be a bool"),
    ("cuda_graph", 0, "RunConfig.cuda_graph=0 must be a bool or None"),
    ("model_kwargs", [], r"RunConfig.model_kwargs=\[\] must be a dict"),
])
def test_run_config_types_are_strict(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RunConfig(**{field: value})


def test_run_config_file_round_trip_and_unknown_keys(tmp_path: Path) -> None:
    config = RunConfig(steps=123, checkpoint_every=40, keep_checkpoints=0, model_kwargs={"gamma": 0.9})
    assert RunConfig.load(config.save(tmp_path / "config.json")) == config
    (tmp_path / "bad.json").write_text(json.dumps({"steps": 10, "stepz": 3, "lr": 1}))
    with pytest.raises(ValueError, match=r"unknown RunConfig fields \['lr', 'stepz'\]"):
        RunConfig.load(tmp_path / "bad.json")
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(ValueError, match="broken.json: not valid JSON"):
        RunConfig.load(tmp_path / "broken.json")
    (tmp_path / "list.json").write_text("[]")
    with pytest.raises(ValueError, match="a run config must be a JSON object, got list"):
        RunConfig.load(tmp_path / "list.json")


def test_a_gpu_run_fuses_its_rollouts_unless_set() -> None:
    """foxhunt's GPU presets leave ``graph_collect`` to BranchingIQN (None: a qualifying rollout runs as one
    CUDA graph; resume on it is bit for bit on the H200, ``test_a_resumed_cuda_run_equals_...[fused]``)."""
    import inspect

    from sb3_her_ext import BranchingIQN

    assert inspect.signature(BranchingIQN).parameters["graph_collect"].default is None
    assert "graph_collect" not in RunConfig(device="cuda").resolved_model_kwargs()
    kept = RunConfig(device="cuda", model_kwargs={"graph_collect": False}).resolved_model_kwargs()
    assert kept["graph_collect"] is False  # the device loop alone stays one override away


def test_device_loop_is_on_exactly_on_cuda_unless_set() -> None:
    assert RunConfig().resolved_device_loop() is False
    assert RunConfig(device="cuda").resolved_device_loop() is True
    assert RunConfig(device_loop=True).resolved_device_loop() is True
    with pytest.raises(ValueError, match="RunConfig.device_loop='yes' must be a bool or None"):
        RunConfig(device_loop="yes")


def test_train_through_the_device_loop_on_the_cpu(tmp_path: Path) -> None:
    """``device_loop=True`` trains through sb3_her_ext.collect (the env is the device face); a crashed
    run resumes to the uninterrupted run's model."""
    from foxhunt.device_lob_env import DeviceLOBVecEnv
    from foxhunt.runs import make_env

    config = small_config(tmp_path / "run", device_loop=True)
    assert isinstance(make_env(config, 0, split="train"), DeviceLOBVecEnv)
    out = train(config)
    assert json.loads((out / "config.json").read_text())["device_loop"] is True
    assert (out / "model.zip").is_file() and (out / "evaluation.json").is_file()

    crashed = small_config(tmp_path / "crashed", device_loop=True)
    with pytest.raises(_Crash):
        train(crashed, callback=_CrashAt(450))
    resumed = resume(tmp_path / "crashed")
    assert_same_model(out / "model.zip", resumed / "model.zip")  # on the CPU, bit for bit


def test_a_run_with_longer_rollouts_calls_back_between_rollouts(tmp_path: Path) -> None:
    """``train_freq`` 4 on the device env: callbacks run at block ends, every 4 vector steps (so each rollout
    is one CUDA graph replay on a GPU)."""
    from stable_baselines3.common.callbacks import BaseCallback

    class Strides(BaseCallback):
        def _on_step(self) -> bool:
            return True

    seen = Strides()
    config = small_config(tmp_path / "run", device_loop=True, checkpoint_every=0,
                          model_kwargs={**SMALL_MODEL_KWARGS, "train_freq": 4, "gradient_steps": 4})
    train(config, callback=seen)
    assert seen.n_calls == 600 // (2 * 4)
