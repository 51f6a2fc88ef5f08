"""The options the experiment scripts share: custom agents, env settings, the training loop."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from experiments import _common, exploration, harness, hindsight, learning


@pytest.fixture(autouse=True)
def _no_custom_agents() -> Iterator[None]:
    """Each test starts and ends without custom agents (the registry is module state)."""
    harness.clear_custom_agents()
    yield
    harness.clear_custom_agents()


def test_custom_agent_merges_over_its_base() -> None:
    spec = harness.parse_agent_kwargs(
        'iqn_x={"base":"iqn_lean","model":{"learning_rate":1e-4},"policy":{"net_arch":[256,256]}}')
    lean = harness.agent_spec("iqn_lean")
    assert spec.kind == "iqn" and spec.base == "iqn_lean"
    assert spec.model_kwargs == {**lean.model_kwargs, "learning_rate": 1e-4}
    assert spec.policy_kwargs == {**lean.policy_kwargs, "net_arch": [256, 256]}
    assert harness.agent_spec("iqn_x") is spec
    # the base defaults to iqn; a later definition may build on an earlier one; DQN takes DQN's arguments
    plain = harness.define_agent("iqn_hot", {"model": {"exploration_final_eps": 0.2}})
    assert plain.base == "iqn" and plain.model_kwargs == {"hindsight": True, "exploration_final_eps": 0.2}
    chained = harness.parse_agent_kwargs('iqn_y={"base": "iqn_x", "policy": {"popart": true}}')
    assert chained.policy_kwargs["popart"] is True and chained.policy_kwargs["net_arch"] == [256, 256]
    assert chained.model_kwargs["learning_rate"] == 1e-4
    wide = harness.parse_agent_kwargs('dqn_w={"base":"dqn","model":{"n_steps":3},'
                                      '"policy":{"net_arch":[128]}}')
    assert wide.kind == "dqn" and wide.model_kwargs == {"n_steps": 3}
    assert set(harness.custom_agents()) == {"iqn_x", "iqn_hot", "iqn_y", "dqn_w"}
    harness.clear_custom_agents()
    with pytest.raises(ValueError, match="iqn_x"):
        harness.agent_spec("iqn_x")


@pytest.mark.parametrize(("text", "match"), [
    ('iqn_x{"base": "iqn"}', "must be NAME=JSON"),
    ("=" + '{"base": "iqn"}', "must be NAME=JSON"),
    ('iqn_x={"base": "iqn",', "iqn_x: not valid JSON"),
    ("iqn_x=[1, 2]", "must be a JSON object"),
    ('iqn_x={"bsae": "iqn"}', "unknown key 'bsae'"),
    ('iqn_x={"base": "nope"}', r"iqn_x\.base: agents holds 'nope'"),
    ('iqn_x={"base": 3}', r"iqn_x\.base=3"),
    ('iqn_x={"model": {"learnin_rate": 1e-4}}',
     r"iqn_x\.model\.learnin_rate is not an argument of BranchingIQN"),
    ('iqn_x={"model": {"seed": 3}}', r"iqn_x\.model\.seed"),
    ('iqn_x={"model": [1]}', r"iqn_x\.model=\[1\] must be a JSON object"),
    ('iqn_x={"policy": {"net_arc": [64]}}',
     r"iqn_x\.policy\.net_arc is not an argument of BranchingIQNPolicy"),
    ('iqn_x={"policy": {"activation_fn": "ReLU"}}', r"iqn_x\.policy\.activation_fn: takes a Python class"),
    ('dqn_x={"base": "dqn", "model": {"c51_alpha": 0.5}}',
     r"dqn_x\.model\.c51_alpha is not an argument of DQN"),
    ('iqn={"model": {}}', "'iqn' is a built-in agent"),
    ('iqn-no_popart={"model": {}}', "built-in agent"),
    ('oracle={"model": {}}', "built-in agent or baseline"),
    ('a/b={"model": {}}', "must be letters, digits"),
])
def test_custom_agent_errors_name_the_field(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        harness.parse_agent_kwargs(text)
    assert harness.custom_agents() == {}  # nothing half-defined


def test_custom_agent_defined_twice_and_the_command_defines_in_order() -> None:
    args = learning.parse_args(["--agent-kwargs", 'a={"base": "iqn_lean"}',
                                "--agent-kwargs", 'b={"base": "a"}', "--agents", "a,b,dqn"])
    assert set(_common.define_agents(args)) == {"a", "b"}
    assert learning.agent_list(args) == ["a", "b", "dqn"]
    assert harness.agent_spec("b").base == "a"
    twice = learning.parse_args(["--agent-kwargs", 'a={}', "--agent-kwargs", 'a={}'])
    with pytest.raises(ValueError, match="'a' is defined twice"):
        _common.define_agents(twice)
    # a later command forgets the earlier command's agents
    _common.define_agents(learning.parse_args([]))
    assert harness.custom_agents() == {}


def test_hindsight_arms() -> None:
    assert harness.hindsight_arms("iqn") == ("iqn", "iqn-no_hindsight")
    assert harness.hindsight_arms("iqn_lean") == ("iqn_lean+hindsight", "iqn_lean")
    harness.define_agent("iqn_x", {"model": {"learning_rate": 1e-4}})
    on, off = harness.hindsight_arms("iqn_x")
    assert (on, off) == ("iqn_x", "iqn_x-no_hindsight")
    assert harness.agent_spec(off).model_kwargs == {"hindsight": False, "learning_rate": 1e-4}
    with pytest.raises(ValueError, match="hindsight is BranchingIQN's"):
        harness.hindsight_arms("dqn")


def test_env_kwargs() -> None:
    args = learning.parse_args(["--env-kwargs", '{"reward_scale": 0.01, "levels": 5}',
                                "--episode-length", "50"])
    assert _common.env_kwargs_of(args) == {"reward_scale": 0.01, "levels": 5, "episode_length": 50}
    assert _common.market_setup(args).levels == 5  # the market follows the env's levels
    budget = _common.budget_of(args)
    assert budget.env_overrides["reward_scale"] == 0.01
    assert budget.run_config(0).resolved_env_kwargs()["reward_scale"] == 0.01  # training and evaluation
    for text, match in (('{"reward_scael": 0.01}', r"env-kwargs\.reward_scael is not an env setting"),
                        ('{"market_seed": 3}', r"env-kwargs\.market_seed"),
                        ("[0.01]", "must be a JSON object"),
                        ('{"reward_scale": }', "not valid JSON")):
        with pytest.raises(ValueError, match=match):
            _common.env_kwargs_of(learning.parse_args(["--env-kwargs", text]))
    clash = learning.parse_args(["--env-kwargs", '{"levels": 5}', "--levels", "3"])
    with pytest.raises(ValueError, match=r"env-kwargs\.levels=5 contradicts --levels 3"):
        _common.env_kwargs_of(clash)
    with pytest.raises(ValueError, match="env-kwargs.nope"):
        harness.Budget(env_overrides={"nope": 1})


def test_device_loop_option() -> None:
    default = _common.budget_of(learning.parse_args([]))
    assert default.device_loop is None and not default.resolved_device_loop()  # auto: off on the CPU
    assert default.loop_of("iqn") == harness.LOOP_SB3
    on = _common.budget_of(learning.parse_args(["--device-loop", "on"]))
    assert on.device_loop is True and on.loop_of("iqn_lean") == harness.LOOP_DEVICE
    assert on.loop_of("dqn") == on.loop_of("qrdqn") == harness.LOOP_SB3  # SB3's own algorithms
    assert harness.Budget(device="cuda", device_loop=None).resolved_device_loop()  # auto: on on CUDA
    assert not harness.Budget(device="cuda", device_loop=False).resolved_device_loop()
    with pytest.raises(ValueError, match="env_cuda_graph=True needs the device loop on a CUDA device"):
        harness.Budget(device="cpu", device_loop=True, env_cuda_graph=True)
    with pytest.raises(ValueError, match="device_loop='on'"):
        harness.Budget(device_loop="on")  # type: ignore[arg-type]
    with pytest.raises(SystemExit):
        learning.parse_args(["--device-loop", "yes"])


@pytest.mark.parametrize("script", [learning, hindsight, exploration])
def test_every_script_takes_the_shared_options(script: object) -> None:
    argv = ["--device-loop", "on", "--agent-kwargs", 'x={"base": "iqn_lean"}', "--env-kwargs",
            '{"reward_scale": 0.5}', "--levels", "5", "--net-arch", "32,32", "--learning-rate", "1e-3",
            "--train-market-seed", "2", "--eval-market-seed", "3", "--seeds", "2"]
    args = script.parse_args(argv)  # type: ignore[attr-defined]
    budget = _common.budget_of(args)
    assert budget.device_loop is True and budget.net_arch == [32, 32]
    assert budget.overrides == {"learning_rate": 1e-3}
    assert budget.env_overrides == {"reward_scale": 0.5, "levels": 5}
    setup = _common.market_setup(args)
    assert (setup.train_market_seed, setup.eval_market_seed, setup.levels) == (2, 3, 5)
    assert set(_common.define_agents(args)) == {"x"}


def test_command_line_quotes_json() -> None:
    command = _common.command_line("learning", ["--env-kwargs", '{"reward_scale": 0.01}'])
    assert command == "python -m experiments.learning --env-kwargs '{\"reward_scale\": 0.01}'"
    assert _common.loop_summary({"iqn/seed0": "device", "iqn/seed1": "device", "dqn/seed0": "sb3"}) == (
        "iqn: device; dqn: sb3")
