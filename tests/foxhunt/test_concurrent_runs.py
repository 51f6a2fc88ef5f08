"""``foxhunt.runs.train_concurrently``: runs trained at once in one process end as each trained alone (model
files and held-out evaluation); runs that fit alone but not together are refused before anything starts."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch as th

import foxhunt.preflight
from foxhunt.preflight import run_memory
from foxhunt.runs import train, train_concurrently
from tests.foxhunt._small_runs import SMALL_MODEL_KWARGS, assert_same_model, small_config


@pytest.fixture(autouse=True)
def _one_thread():
    threads = th.get_num_threads()
    yield
    th.set_num_threads(threads)


def test_runs_trained_at_once_equal_each_trained_alone(tmp_path: Path) -> None:
    configs = [small_config(tmp_path / "together" / f"seed{seed}", seed=seed, steps=300, checkpoint_every=0,
                            threads=1) for seed in (5, 6)]
    folders = train_concurrently(configs)
    assert folders == [Path(config.out) for config in configs]
    for config, folder in zip(configs, folders, strict=True):
        alone = train(dataclasses.replace(config, out=str(tmp_path / "alone" / folder.name)))
        assert_same_model(folder / "model.zip", alone / "model.zip")
        together = json.loads((folder / "evaluation.json").read_text())
        by_itself = json.loads((alone / "evaluation.json").read_text())
        assert (together["sharpe"], together["pnl"]) == (by_itself["sharpe"], by_itself["pnl"])


def test_runs_trained_in_processes_equal_each_trained_alone(tmp_path: Path) -> None:
    configs = [small_config(tmp_path / "processes" / f"seed{seed}", seed=seed, steps=300, checkpoint_every=0,
                            threads=1) for seed in (5, 6)]
    folders = train_concurrently(configs, processes=True)
    assert folders == [Path(config.out) for config in configs]
    alone = train(dataclasses.replace(configs[1], out=str(tmp_path / "alone")))
    assert_same_model(folders[1] / "model.zip", alone / "model.zip")
    with pytest.raises(ValueError, match=r"callbacks live in this process; with processes=True pass none"):
        train_concurrently(configs, [None, object()], processes=True)


def test_runs_that_fit_alone_but_not_together_are_refused(tmp_path: Path, monkeypatch) -> None:
    configs = [small_config(tmp_path / f"r{seed}", seed=seed) for seed in (0, 1)]
    one = sum(size for _, size in run_memory(configs[0]).values())
    monkeypatch.setattr(foxhunt.preflight, "free_memory", lambda device: int(1.5 * one))
    with pytest.raises(ValueError, match=r"train_concurrently: 2 runs on cpu need about .* GB together"):
        train_concurrently(configs)
    assert not any(Path(config.out).exists() for config in configs)  # nothing started


@pytest.mark.gpu
def test_runs_trained_at_once_on_cuda_equal_each_trained_alone(tmp_path: Path) -> None:
    """The GPU path of a run (device loop, fused CUDA-graph blocks): two seeds at once on two streams end as
    each trained alone."""
    configs = [small_config(tmp_path / "together" / f"seed{seed}", seed=seed, device="cuda", n_envs=64,
                            steps=64 * 60, checkpoint_every=0, eval_steps=20,
                            model_kwargs={**SMALL_MODEL_KWARGS, "buffer_size": 5000})
               for seed in (5, 6)]
    folders = train_concurrently(configs)
    for config, folder in zip(configs, folders, strict=True):
        assert json.loads((folder / "config.json").read_text())["cuda_graph"] is True
        alone = train(dataclasses.replace(config, out=str(tmp_path / "alone" / folder.name)))
        assert_same_model(folder / "model.zip", alone / "model.zip")
