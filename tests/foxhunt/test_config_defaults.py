"""Defaults in one place (issue 37): the config tree's concrete defaults, the presets as configs, the choices
made for a run before it starts, ``config.json`` holding every value that ran, ``foxhunt train
--print-config`` and the README's table of library defaults against ``foxhunt train``'s."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import re
from pathlib import Path
from typing import Any

import pytest

from foxenv.config import EnvConfig
from foxhunt import presets
from foxhunt.cli import main
from foxhunt.config import AUTO, NULL_MEANS, auto_values
from foxhunt.runs import SECTIONS, RunConfig, unrecorded_fields
from sb3_her_ext import BranchingIQN
from sb3_her_ext.policy import BranchingIQNPolicy
from tests.foxhunt._small_runs import assert_same_model

README = Path(__file__).resolve().parents[2] / "README.md"


def _flat(config: RunConfig) -> dict[str, Any]:
    """A config's fields by dotted name."""
    tree = config.to_dict()
    flat = {name: value for name, value in tree.items() if name not in SECTIONS}
    for section in SECTIONS:
        flat.update({f"{section}.{name}": value for name, value in tree[section].items()})
    return flat


# ------------------------------------------------------------------------------------------ presets


def test_the_presets_are_configs_and_the_recipe_is_what_fast_changes() -> None:
    assert all(isinstance(config, RunConfig) for config in (presets.CPU, presets.GPU, presets.FAST))
    assert presets.CPU == RunConfig()
    assert (presets.GPU.device, presets.GPU.n_envs, presets.GPU.steps) == ("cuda", 1024, 2_000_000)
    assert presets.RECIPES["fast"] == presets.changes(presets.FAST)
    assert presets.RECIPES["fast"] == {
        "n_envs": 64, "steps": 2**20, "checkpoint_every": 2**18, "algorithm.learning_rate": 1e-3,
        "algorithm.gamma": 0.9, "algorithm.c51_alpha": 0.0, "algorithm.train_freq": 8,
        "algorithm.gradient_steps": 8, "algorithm.batch_size": 256, "algorithm.learning_starts": 20_000,
        "algorithm.target_update_interval": 20_000, "algorithm.buffer_size": 500_000, "policy.n_ensemble": 1}
    # the GPU preset resolves to the GPU's sizes; a short CPU run to at most a quarter of it
    gpu = presets.GPU.resolved().algorithm
    assert {name: getattr(gpu, name) for name in presets.DEVICE_SIZES["cuda"]} == presets.DEVICE_SIZES["cuda"]
    short = RunConfig(steps=400, n_envs=2).resolved().algorithm
    assert (short.learning_starts, short.diagnostics_interval, short.batch_size) == (100, 100, 64)


def test_every_none_default_is_chosen_for_the_run_or_means_something() -> None:
    """A field defaults to None only where the run chooses it (``AUTO``) or None is a value
    (``NULL_MEANS``)."""
    defaults = _flat(RunConfig())
    none = {name for name, value in defaults.items() if value is None}
    assert none <= set(AUTO) | set(NULL_MEANS), none - set(AUTO) - set(NULL_MEANS)
    # AUTO names exactly the fields config.resolve chooses (on some device, face and data)
    chosen: set[str] = set()
    for device in ("cpu", "cuda"):
        for face in presets.ACTION_FACES:
            for data in ("synthetic", "lobster_folder"):
                chosen |= set(auto_values(RunConfig(device=device, action_face=face, data=data)))
    assert chosen == set(AUTO)
    assert len(none) < 20  # was 54 of 81 before issue 37


@pytest.mark.parametrize("config", [
    RunConfig(), presets.GPU, presets.FAST, RunConfig(action_face="branched", device="cuda:1"),
    RunConfig(data="lobster_folder"), RunConfig(steps=40, n_envs=16),
], ids=["cpu", "gpu_preset", "fast", "branched_cuda", "lobster", "tiny"])
def test_resolving_chooses_every_value_once(config: RunConfig) -> None:
    resolved = config.resolved()
    assert resolved.resolved() == resolved  # a run's config.json resolves to itself
    assert unrecorded_fields(resolved.to_dict(), ran=True) == []
    assert RunConfig.from_dict(json.loads(json.dumps(resolved.to_dict()))) == resolved
    # what was set stays as set (no quarter-of-the-run cut of a given value)
    given = config.with_values({"algorithm.learning_starts": 10**6, "algorithm.batch_size": 7}).resolved()
    assert (given.algorithm.learning_starts, given.algorithm.batch_size) == (10**6, 7)


# ------------------------------------------------------------------------------------------ README's table


def _library_defaults() -> dict[str, Any]:
    """The library's defaults by dotted config name: BranchingIQN's signature, its policy's, foxenv's
    config."""
    def signature(cls: type) -> dict[str, Any]:
        return {name: p.default for name, p in inspect.signature(cls.__init__).parameters.items()
                if p.default is not inspect.Parameter.empty}

    algorithm, policy = signature(BranchingIQN), signature(BranchingIQNPolicy)
    library = {f"algorithm.{name}": value for name, value in algorithm.items()}
    library.update({f"policy.{name}": value for name, value in policy.items()})
    library.update({f"env.{f.name}": f.default for f in dataclasses.fields(EnvConfig)})
    library.update({name: algorithm[name] for name in ("hindsight", "cuda_graph")})
    return library


def _plain(value: Any) -> Any:
    return [_plain(v) for v in value] if isinstance(value, list | tuple) else value


def test_the_readme_table_is_where_the_library_and_foxhunt_train_differ() -> None:
    rows = re.findall(r"^\| `([\w.]+)` \| `([^`]+)` \| (.+?) \| (.+?) \|$", README.read_text(), re.M)
    table = {name: ast.literal_eval(library) for name, library, _, _ in rows}
    assert len(table) == len(rows) > 10
    library = _library_defaults()
    for name, value in table.items():
        assert name in library and _plain(library[name]) == _plain(value), (name, value, library.get(name))
    differ = set()
    for base in (presets.CPU, presets.GPU):
        for face in presets.ACTION_FACES:
            for name, value in _flat(dataclasses.replace(base, action_face=face).resolved()).items():
                if name not in library or value is None:  # None: the library's default runs
                    continue
                if _plain(value) != _plain(library[name]) and not (value == {} and library[name] is None):
                    differ.add(name)
    assert set(table) == differ


def test_foxhunt_passes_its_own_learning_rate_so_the_librarys_default_moves_no_run() -> None:
    """The library's default went from 1e-4 to 5e-4 (issue 39.12); every preset and face passes its own."""
    for base in (presets.CPU, presets.GPU, presets.FAST):
        for face in presets.ACTION_FACES:
            kwargs = dataclasses.replace(base, action_face=face).resolved_model_kwargs()
            assert kwargs["learning_rate"] == (1e-3 if base is presets.FAST else 3e-4)


# ------------------------------------------------------------------------------------------ the CLI


def _printed(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict[str, Any]:
    assert main(["train", "--print-config", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_print_config_prints_the_resolved_config_and_makes_no_run_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert _printed(capsys, []) == RunConfig().resolved().to_dict()
    fast = _printed(capsys, ["--recipe", "fast", "--steps", "100", "--algorithm.gamma", "0.5"])
    assert (fast["steps"], fast["n_envs"], fast["algorithm"]["gamma"]) == (100, 64, 0.5)
    assert fast["algorithm"]["batch_size"] == 256 and fast["algorithm"]["diagnostics_interval"] == 25
    # a GPU run's config, printed on any machine: the GPU preset, its sizes, graphs and device loop
    gpu = _printed(capsys, ["--device", "cuda", "--action-face", "branched"])
    assert (gpu["n_envs"], gpu["cuda_graph"], gpu["device_loop"]) == (1024, True, True) and gpu["hindsight"]
    assert gpu["algorithm"]["learning_starts"] == 20_000 and gpu["algorithm"]["vaccine_branch"] == "magnitude"
    (tmp_path / "mine.json").write_text(json.dumps({"steps": 300, "algorithm": {"tau": 0.5}}))
    mine = _printed(capsys, ["--config", str(tmp_path / "mine.json"), "--n-envs", "4"])
    assert (mine["steps"], mine["n_envs"], mine["algorithm"]["tau"]) == (300, 4, 0.5)
    assert mine["algorithm"]["learning_starts"] == 75
    assert not (tmp_path / "runs").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["mine.json"]
    assert main(["train", "--print-config", "--steps", "0"]) == 2
    assert "--steps=0 must be >= 1" in capsys.readouterr().err


def test_a_runs_config_json_holds_what_ran_and_runs_again_the_same(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A run left to the presets records the values it chose, and the model ran with them; that config.json
    given back (``--config``, ``--resume``) resolves to itself."""
    out = tmp_path / "run"
    assert main(["train", "--steps", "120", "--n-envs", "2", "--out", str(out), "--no-progress",
                 "--eval-steps", "10", "--checkpoint-every", "0", "--synthetic-market-steps", "1500",
                 "--env.episode-length", "60"]) == 0
    capsys.readouterr()
    values = json.loads((out / "config.json").read_text())
    assert unrecorded_fields(values, ran=True) == []
    algorithm = values["algorithm"]
    sizes = (algorithm["learning_starts"], algorithm["diagnostics_interval"], algorithm["batch_size"])
    assert sizes == (30, 30, 64)  # chosen: the CPU's, at most a quarter of the run
    assert values["hindsight"] is False and values["device_loop"] is False
    assert values["env"]["market_seed"] == 0
    model = BranchingIQN.load(out / "model.zip")
    for name in ("learning_starts", "batch_size", "buffer_size", "target_update_interval", "vaccine_interval",
                 "diagnostics_interval", "tau", "exploration_initial_eps", "max_grad_norm"):
        assert getattr(model, name) == algorithm[name], name
    assert _printed(capsys, ["--config", str(out / "config.json")]) == values
    assert _printed(capsys, ["--resume", str(out)]) == values
    # run again from that config.json: the same config, the same model, bit for bit
    again = tmp_path / "again"
    assert main(["train", "--config", str(out / "config.json"), "--out", str(again)]) == 0
    assert json.loads((again / "config.json").read_text()) == {**values, "out": str(again)}
    assert_same_model(out / "model.zip", again / "model.zip")


def test_the_run_config_passes_the_branch_coupling_to_the_policy() -> None:
    """Set or not, the coupling reaches the policy (the default is the network's own, written out)."""
    import inspect

    from foxhunt.runs import RunConfig
    from sb3_her_ext.policy import BranchingIQNPolicy

    config = RunConfig(device="cpu", policy_kwargs={"branch_coupling": "autoregressive"})
    assert config.resolved_policy_kwargs()["branch_coupling"] == "autoregressive"
    library = inspect.signature(BranchingIQNPolicy.__init__).parameters["branch_coupling"].default
    assert RunConfig(device="cpu").resolved_policy_kwargs()["branch_coupling"] == library

