"""The device collector's ownership: each model's collector holds its own state (two models interleaving
``learn`` calls train as if alone), nothing is kept at module level, and the algorithm package has no import
cycle."""

from __future__ import annotations

import ast
import gc
import importlib
import pkgutil
import weakref
from pathlib import Path

import pytest
import torch as th

import sb3_her_ext
from foxhunt.device_lob_env import DeviceLOBVecEnv
from sb3_her_ext import BranchingIQN
from sb3_her_ext.collect import DeviceCollector

TINY_POLICY = dict(net_arch=[16], n_ensemble=2, n_cos=8, n_quantiles=4, n_quantiles_target=4,
                   n_quantiles_act=4, n_atoms=11)
TINY = dict(batch_size=16, buffer_size=2000, train_freq=2, target_update_interval=50, device="cpu",
            policy_kwargs=TINY_POLICY, vaccine_interval=2, diagnostics_interval=40)
ROOT = Path(sb3_her_ext.__file__).parent


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    threads = th.get_num_threads()
    th.set_num_threads(1)
    yield
    th.set_num_threads(threads)


def make_model(fused: bool) -> BranchingIQN:
    """Two different collectors: no warm-up / a warm-up of random actions (the block's own generator) and its
    own statistics interval."""
    env = DeviceLOBVecEnv(4, seed=1 if fused else 2, data="synthetic", num_steps=1500, episode_length=10)
    model = BranchingIQN("MlpPolicy", env, seed=3 if fused else 4, learning_starts=0 if fused else 40, **TINY)
    if not fused:
        model.collector.configure(stats_interval=24)
    return model


def learn_in_turns(models: dict[str, BranchingIQN], order: list[str]) -> None:
    """``learn`` the models in ``order``; torch's global generator (the policy's quantile fractions) is seeded
    per call, the same for a model's k-th call whatever the order."""
    calls = {name: 0 for name in models}
    for name in order:
        calls[name] += 1
        th.manual_seed(100 * calls[name] + len(name))
        models[name].learn(80, reset_num_timesteps=calls[name] == 1, log_interval=1)


def test_two_models_interleaving_learn_calls_share_no_collector_state() -> None:
    interleaved = {"fused": make_model(True), "loop": make_model(False)}
    alone = {"fused": make_model(True), "loop": make_model(False)}
    learn_in_turns(interleaved, ["fused", "loop", "fused", "loop", "fused"])
    learn_in_turns(alone, ["fused", "fused", "fused", "loop", "loop"])
    a, b = interleaved["fused"].collector, interleaved["loop"].collector
    assert a is not b and a.block is not b.block and a.settings != b.settings
    assert a.block.stats is not b.block.stats and a.block.action_counts is not b.block.action_counts
    assert a.block.warmup_generator is not b.block.warmup_generator
    assert a.block.counters is not b.block.counters
    for name in interleaved:
        x, y = interleaved[name], alone[name]
        assert x.num_timesteps == y.num_timesteps and x._n_updates == y._n_updates > 0
        for key in x.replay_buffer._tensor_names():
            assert th.equal(getattr(x.replay_buffer, key), getattr(y.replay_buffer, key)), (name, key)
        for (key, p), q in zip(x.policy.state_dict().items(), y.policy.state_dict().values(), strict=True):
            assert th.equal(p, q), (name, key)
        assert x._episode_num == y._episode_num > 0
        assert [(e["r"], e["l"]) for e in x.ep_info_buffer] == [(e["r"], e["l"]) for e in y.ep_info_buffer]
        assert x.collector.block.eager_blocks == y.collector.block.eager_blocks > 0


def test_the_collector_is_the_models_and_is_not_saved(tmp_path: Path) -> None:
    model = make_model(True)
    assert isinstance(model.collector, DeviceCollector) and model.collector.algorithm is model
    model.learn(40)
    model.save(tmp_path / "model.zip")
    loaded = BranchingIQN.load(tmp_path / "model.zip", env=model.get_env())
    assert loaded.collector is not model.collector and loaded.collector.algorithm is loaded
    assert loaded.collector.block is None and model.collector.block is not None
    model.collector.configure(stats_interval=7)
    assert BranchingIQN.load(tmp_path / "model.zip").collector.settings.stats_interval is None  # not saved
    collector = model.collector
    del model
    gc.collect()  # (SB3's learn leaves the model in a cycle of its callback's locals)
    with pytest.raises(ReferenceError, match="no longer exists"):  # a weak reference: the model is not kept
        _ = collector.algorithm


def _modules() -> list[str]:
    return [m.name for m in pkgutil.walk_packages(sb3_her_ext.__path__, "sb3_her_ext.")]


def test_no_module_level_registry_remains() -> None:
    """Per-model state lives on the model (its collector), never in a module-level weak dictionary."""
    weak = (weakref.WeakKeyDictionary, weakref.WeakValueDictionary, weakref.WeakSet)
    found = [f"{name}.{attr}" for name in _modules()
             for attr, value in vars(importlib.import_module(name)).items() if isinstance(value, weak)]
    assert found == []
    sources = [path for path in ROOT.rglob("*.py") if "Weak" in path.read_text()]
    assert sources == []


def test_the_algorithm_package_has_no_import_cycle() -> None:
    """Imports between sb3_her_ext's modules (lazy ones inside functions included) form no cycle."""
    modules = set(_modules())
    graph: dict[str, set[str]] = {}
    for name in modules:
        spec = importlib.util.find_spec(name)
        tree = ast.parse(Path(spec.origin).read_text())
        targets = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                targets |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
            elif isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
        package = name if spec.submodule_search_locations else name.rsplit(".", 1)[0]
        # a module's own package __init__ is not an edge back to it (Python loads the package first)
        graph[name] = {t for t in targets & modules if t != name and not name.startswith(f"{t}.")}
        graph[name].discard(package)
    visiting, done, cycles = set(), set(), []

    def visit(node: str, path: list[str]) -> None:
        if node in done:
            return
        if node in visiting:
            cycles.append(path[path.index(node):] + [node])
            return
        visiting.add(node)
        for target in sorted(graph[node]):
            visit(target, [*path, node] if not path or path[-1] != node else path)
        visiting.discard(node)
        done.add(node)

    for node in sorted(graph):
        visit(node, [node])
    assert cycles == []
