"""``--concurrent-seeds``: BranchingIQN seeds trained at once (experiments.runner.train_all) end as each
trained alone; DQN keeps one at a time; the option is checked."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from experiments import options, runner
from experiments.agents import builtin_agent


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_setup() -> runner.Setup:
    return runner.Setup(market_steps=1000, steps=160, n_envs=2, device_loop=True, eval_envs=2, eval_steps=20,
                        env_kwargs={"episode_length": 20}, model_kwargs={"learning_starts": 40})


def parameters(run: runner.TrainedRun) -> list[torch.Tensor]:
    return [p.detach().clone() for p in run.model.policy.state_dict().values()]


def test_seeds_trained_at_once_equal_the_seeds_trained_one_by_one(tmp_path: Path) -> None:
    setup, agent = tiny_setup(), builtin_agent("iqn_lean")
    jobs = [(agent, seed, tmp_path / "alone" / f"seed{seed}") for seed in (0, 1)]
    alone = runner.train_all(jobs, setup)
    finished: list[int] = []
    together = runner.train_all([(a, s, tmp_path / "together" / f"seed{s}") for a, s, _ in jobs], setup,
                                concurrent=2, on_done=lambda run: finished.append(run.seed))
    assert sorted(finished) == [0, 1] and [run.seed for run in together] == [0, 1]
    for a, b in zip(alone, together, strict=True):
        assert a.model.num_timesteps == b.model.num_timesteps == 160
        for x, y in zip(parameters(a), parameters(b), strict=True):
            assert torch.equal(x, y)
        assert (b.folder / "run.json").is_file() and (b.folder / "model.zip").is_file()
    assert not all(torch.equal(x, y) for x, y in zip(parameters(alone[0]), parameters(alone[1]), strict=True))


def test_seeds_trained_in_processes_equal_the_seeds_trained_one_by_one(tmp_path: Path) -> None:
    setup, agent = tiny_setup(), builtin_agent("iqn_lean")
    alone = runner.train_all([(agent, 1, tmp_path / "alone")], setup)
    jobs = [(agent, seed, tmp_path / "processes" / f"seed{seed}") for seed in (0, 1)]
    together = runner.train_all(jobs, setup, concurrent=2, processes=True)
    assert [run.seed for run in together] == [0, 1] and together[1].model.num_timesteps == 160
    for x, y in zip(parameters(alone[0]), parameters(together[1]), strict=True):
        assert torch.equal(x, y)
    assert together[1].curve == alone[0].curve and (together[1].folder / "run.json").is_file()
    with pytest.raises(ValueError, match="callbacks live in this process; with processes=True pass none"):
        runner.train_all(jobs, setup, concurrent=2, callbacks=[None, object()], processes=True)


def test_the_option_is_parsed_and_checked() -> None:
    parser = argparse.ArgumentParser()
    options.add_arguments(parser)
    assert options.parse(parser, ["--concurrent-seeds", "5"]).concurrent_seeds == 5
    assert options.parse(parser, []).concurrent_seeds == 1
    with pytest.raises(SystemExit):
        options.parse(parser, ["--concurrent-seeds", "0"])
    with pytest.raises(ValueError, match="concurrent=0"):
        runner.train_all([], tiny_setup(), concurrent=0)


@pytest.mark.slow
def test_learning_trains_its_seeds_at_once(tmp_path: Path) -> None:
    """``python -m experiments.learning --concurrent-seeds 2``: both seeds of the BranchingIQN agent in one
    batch, DQN one at a time; every run folder and the table as without the option."""
    from experiments.learning import main

    out = tmp_path / "tiny"
    payload = main(["--out", str(out), "--agents", "iqn_lean,dqn", "--seeds", "2", "--concurrent-seeds", "2",
                    "--steps", "160", "--n-envs", "2", "--market-steps", "1000", "--signal-strength", "0.5",
                    "--episode-length", "20", "--eval-envs", "2", "--eval-steps", "20", "--device-loop", "on",
                    "--no-progress"])
    assert set(payload["train_seconds"]) == {"iqn_lean/seed0", "iqn_lean/seed1", "dqn/seed0", "dqn/seed1"}
    for name in ("iqn_lean/seed0", "iqn_lean/seed1"):
        assert (out / name / "run.json").is_file() and (out / name / "evaluation.json").is_file()
    assert "| iqn_lean | 2 |" in (out / "results.md").read_text()
