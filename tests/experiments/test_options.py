"""The options the experiment scripts share: custom agents, env settings, the training loop."""

from __future__ import annotations

import pytest

from experiments import agents, criteria, hindsight, hindsight_speed, learning, options
from experiments.agents import Roster
from experiments.runner import LOOP_DEVICE, LOOP_SB3, Setup


def test_custom_agent_merges_over_its_base() -> None:
    roster = Roster()
    agent = roster.parse(
        'iqn_x={"base":"iqn_lean","model":{"learning_rate":1e-4},"policy":{"net_arch":[256,256]}}')
    lean = roster.get("iqn_lean")
    assert agent.algorithm == "iqn" and agent.base == "iqn_lean"
    assert agent.model == {**lean.model, "learning_rate": 1e-4}
    assert agent.policy == {**lean.policy, "net_arch": [256, 256]}
    assert roster.get("iqn_x") is agent
    # the base defaults to iqn; a later definition may build on an earlier one; DQN takes DQN's arguments
    plain = roster.define("iqn_hot", {"model": {"exploration_final_eps": 0.2}})
    assert plain.base == "iqn" and plain.model == {"hindsight": True, "exploration_final_eps": 0.2}
    chained = roster.parse('iqn_y={"base": "iqn_x", "policy": {"popart": true}}')
    assert chained.policy["popart"] is True and chained.policy["net_arch"] == [256, 256]
    assert chained.model["learning_rate"] == 1e-4
    wide = roster.parse('dqn_w={"base":"dqn","model":{"exploration_fraction":0.3},'
                        '"policy":{"net_arch":[128]}}')
    assert wide.algorithm == "dqn" and wide.action_face == "joint"
    assert wide.model == {"exploration_fraction": 0.3}
    assert set(roster.custom) == {"iqn_x", "iqn_hot", "iqn_y", "dqn_w"}
    with pytest.raises(ValueError, match="iqn_x"):
        Roster().get("iqn_x")  # another command's roster does not know it


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
    ('dqn_x={"base": "dqn", "model": {"hindsight": true}}', r"dqn_x\.model\.hindsight is not an argument"),
    ('iqn={"model": {}}', "'iqn' is a built-in agent"),
    ('iqn-no_popart={"model": {}}', "built-in agent"),
    ('oracle={"model": {}}', "built-in agent or baseline"),
    ('a/b={"model": {}}', "must be letters, digits"),
])
def test_custom_agent_errors_name_the_field(text: str, match: str) -> None:
    roster = Roster()
    with pytest.raises(ValueError, match=match):
        roster.parse(text)
    assert roster.custom == {}  # nothing half-defined


def test_custom_agents_are_defined_in_order_and_once() -> None:
    args = learning.parse_args(["--agent-kwargs", 'a={"base": "iqn_lean"}',
                                "--agent-kwargs", 'b={"base": "a"}', "--agents", "a,b,dqn"])
    roster = options.roster_of(args)
    assert set(roster.custom) == {"a", "b"} and roster.get("b").base == "a"
    assert learning.agent_list(args, roster) == ["a", "b", "dqn"]
    with pytest.raises(ValueError, match="'a' is defined twice"):
        options.roster_of(learning.parse_args(["--agent-kwargs", "a={}", "--agent-kwargs", "a={}"]))
    with pytest.raises(ValueError, match="agents holds 'nope'"):
        learning.agent_list(learning.parse_args(["--agents", "iqn,nope"]), Roster())


def test_hindsight_arms() -> None:
    roster = Roster()
    assert roster.hindsight_arms("iqn") == ("iqn", "iqn-no_hindsight")
    assert roster.hindsight_arms("iqn_lean") == ("iqn_lean+hindsight", "iqn_lean")
    roster.define("iqn_x", {"model": {"learning_rate": 1e-4}})
    assert roster.hindsight_arms("iqn_x") == ("iqn_x", "iqn_x-no_hindsight")
    assert roster.get("iqn_x-no_hindsight").model == {"hindsight": False, "learning_rate": 1e-4}
    assert roster.hindsight_arms("iqn_joint") == ("iqn_joint+hindsight", "iqn_joint")
    assert roster.get("iqn_joint+hindsight").action_face == "joint"
    with pytest.raises(ValueError, match="agent='dqn' is not a BranchingIQN agent"):
        roster.hindsight_arms("dqn")


def test_env_kwargs() -> None:
    args = learning.parse_args(["--env-kwargs", '{"reward_scale": 0.01, "levels": 5}',
                                "--episode-length", "50"])
    assert options.env_kwargs_of(args) == {"reward_scale": 0.01, "levels": 5, "episode_length": 50}
    setup = options.setup_of(args)
    env = setup.config(agents.builtin_agent("iqn"), 0).resolved_env_kwargs()  # training and evaluation
    assert env["reward_scale"] == 0.01 and env["levels"] == 5 and env["market_seed"] == 0
    for text, match in (('{"reward_scael": 0.01}', r"env-kwargs\.reward_scael is not an env setting"),
                        ('{"market_seed": 3}', r"env-kwargs\.market_seed"),
                        ("[0.01]", "must be a JSON object"),
                        ('{"reward_scale": }', "not valid JSON")):
        with pytest.raises(ValueError, match=match):
            options.env_kwargs_of(learning.parse_args(["--env-kwargs", text]))
    clash = learning.parse_args(["--env-kwargs", '{"levels": 5}', "--levels", "3"])
    with pytest.raises(ValueError, match=r"env-kwargs\.levels=5 contradicts --levels 3"):
        options.env_kwargs_of(clash)


def test_device_loop_option_and_the_configs_it_gives() -> None:
    default = options.setup_of(learning.parse_args([]))
    iqn, dqn = agents.builtin_agent("iqn"), agents.builtin_agent("dqn")
    assert default.device_loop is None and default.loop_of(iqn) == LOOP_SB3  # auto: off on the CPU
    on = options.setup_of(learning.parse_args(["--device-loop", "on"]))
    assert on.loop_of(iqn) == LOOP_DEVICE and on.loop_of(dqn) == LOOP_SB3  # SB3's own algorithms
    assert Setup(device="cuda").loop_of(iqn) == LOOP_DEVICE  # auto: on on CUDA
    assert Setup(device="cuda", device_loop=False).loop_of(iqn) == LOOP_SB3
    with pytest.raises(ValueError, match="device_loop='on'"):
        Setup(device_loop="on")  # type: ignore[arg-type]
    with pytest.raises(SystemExit):
        learning.parse_args(["--device-loop", "yes"])
    with pytest.raises(ValueError, match="eval_market_seed=0 equals"):
        Setup(eval_market_seed=0)


@pytest.mark.parametrize("script", [learning, hindsight, criteria, hindsight_speed])
def test_every_script_takes_the_shared_options(script: object) -> None:
    argv = ["--device-loop", "on", "--agent-kwargs", 'x={"base": "iqn_lean"}', "--env-kwargs",
            '{"reward_scale": 0.5}', "--levels", "5", "--net-arch", "32,32", "--learning-rate", "1e-3",
            "--train-market-seed", "2", "--eval-market-seed", "4", "--seeds", "2"]
    args = script.parse_args(argv)  # type: ignore[attr-defined]
    setup = options.setup_of(args)
    assert setup.device_loop is True and setup.net_arch == [32, 32]
    assert setup.model_kwargs == {"learning_rate": 1e-3}
    assert setup.env_kwargs == {"reward_scale": 0.5, "levels": 5}
    assert (setup.train_market_seed, setup.eval_market_seed) == (2, 4)
    assert set(options.roster_of(args).custom) == {"x"}
    config = setup.config(options.roster_of(args).get("x"), 1)
    assert config.resolved_model_kwargs()["learning_rate"] == 1e-3
    assert config.resolved_policy_kwargs()["net_arch"] == [32, 32]


def test_command_line_quotes_json() -> None:
    command = options.command_line("learning", ["--env-kwargs", '{"reward_scale": 0.01}'])
    assert command == "python -m experiments.learning --env-kwargs '{\"reward_scale\": 0.01}'"
