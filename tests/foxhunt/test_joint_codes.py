"""The joint action code ``27 d + 9 m + 3 o + u``: one decoder (:func:`foxhunt.envs.decode_joint`) for the
numpy face, the tensor face and the evaluation; ``LOBVecEnv(action_face="joint")`` for SB3 DQN, QR-DQN."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces

from foxhunt.envs import JOINT_WEIGHTS, LOBVecEnv, decode_joint, encode_joint
from foxhunt.evaluation.baselines import ModelPolicy

#: Hand-worked codes: 27 d + 9 m + 3 o + u.
CASES = [
    ((0, 0, 0, 0), 0),
    ((1, 0, 0, 0), 27),             # flat target, Quarter, Market, 1/3
    ((2, 1, 0, 2), 54 + 9 + 0 + 2),  # long, Half, Market, all of the gap = 65
    ((0, 2, 1, 1), 0 + 18 + 3 + 1),  # short, Full, LimitMaker, 2/3 = 22
    ((1, 0, 2, 0), 27 + 0 + 6 + 0),  # flat, Quarter, IoC = 33
    ((2, 2, 2, 2), 80),
]


def joint_env(n: int = 3) -> LOBVecEnv:
    return LOBVecEnv(n, seed=0, data="synthetic", num_steps=400, episode_length=50, action_face="joint")


def test_weights_are_the_documented_code() -> None:
    assert JOINT_WEIGHTS == (27, 9, 3, 1)


@pytest.mark.parametrize(("action", "code"), CASES)
def test_hand_worked_codes(action: tuple[int, int, int, int], code: int) -> None:
    assert int(encode_joint(np.array(action))) == code
    assert tuple(decode_joint(np.array([code]), 1)[0].tolist()) == action
    assert int(encode_joint(torch.tensor(action))) == code


def test_round_trip_of_all_81_codes_on_numpy_and_tensors() -> None:
    codes = np.arange(81)
    actions = decode_joint(codes, 81)
    assert actions.dtype == torch.int64 and actions.shape == (81, 4)
    assert actions.min() == 0 and actions.max() == 2
    assert len({tuple(a) for a in actions.tolist()}) == 81
    np.testing.assert_array_equal(encode_joint(actions.numpy()), codes)
    assert torch.equal(decode_joint(torch.arange(81).reshape(81, 1), 81), actions)  # a column of codes
    assert torch.equal(decode_joint(torch.arange(81, dtype=torch.int32), 81), actions)


@pytest.mark.parametrize(("codes", "match"), [
    ([81], r"actions\[0\]=81 out of range: a joint code must lie in \[0, 81\)"),
    ([3, -1], r"actions\[1\]=-1 out of range"),
    ([1.0], "actions dtype (torch.)?float(32|64) must be an integer dtype"),
    ([True], "actions dtype (torch.)?bool must be an integer dtype"),
])
def test_bad_codes_raise_naming_the_value(codes: list, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        decode_joint(np.array(codes), len(codes))
    with pytest.raises(ValueError, match=match):
        decode_joint(torch.tensor(codes), len(codes))


def test_bad_shapes_raise() -> None:
    with pytest.raises(ValueError, match=r"actions has shape \(3, 4\); the joint face takes \(3,\)"):
        decode_joint(np.ones((3, 4), dtype=np.int64), 3)
    with pytest.raises(ValueError, match=r"actions has shape \(2,\)"):
        decode_joint(np.array([0, 1]), 3)


def test_unchecked_range_decodes_without_looking() -> None:
    """``check_range=False`` (the tensor face on an accelerator: no host sync) decodes as the formula says."""
    assert decode_joint(torch.tensor([81]), 1, check_range=False).tolist() == [[0, 0, 0, 0]]


def test_model_policy_decodes_the_same_way() -> None:
    """A joint model scored by foxhunt.evaluation acts exactly as the env stepped it in training."""

    class Flat:
        def predict(self, obs: np.ndarray, deterministic: bool = True) -> tuple[np.ndarray, None]:
            return np.arange(obs.shape[0]), None

    policy = ModelPolicy(Flat())
    policy.reset(81, torch.device("cpu"))
    decoded = policy.act(torch.zeros(81, 5), torch.zeros(81, dtype=torch.bool))
    assert torch.equal(decoded, decode_joint(np.arange(81), 81))


def test_joint_face_spaces_and_step() -> None:
    env = joint_env()
    branched = LOBVecEnv(3, seed=0, data="synthetic", num_steps=400, episode_length=50)
    assert env.action_space == spaces.Discrete(81) and env.action_face == "joint"
    assert env.branch_names == ("action",) and env.get_attr("branch_names")[0] == ("action",)
    assert env.observation_space == branched.observation_space
    obs = env.reset()
    assert obs.shape == (3, env.observation_space.shape[0])
    env.step_async(np.array([65, 22, 33]))
    np.testing.assert_array_equal(env._actions.numpy(), [[2, 1, 0, 2], [0, 2, 1, 1], [1, 0, 2, 0]])
    obs, reward, done, infos = env.step_wait()
    assert obs.shape[0] == reward.shape[0] == done.shape[0] == len(infos) == 3
    env.step_async(torch.tensor([[0], [80], [27]]))  # torch codes, and a column, are accepted too
    np.testing.assert_array_equal(env._actions.numpy(), [[0, 0, 0, 0], [2, 2, 2, 2], [1, 0, 0, 0]])
    env.step_wait()


def test_joint_face_rejects_bad_input() -> None:
    env = joint_env()
    env.reset()
    with pytest.raises(ValueError, match=r"actions\[1\]=81 out of range"):
        env.step_async(np.array([0, 81, 1]))
    with pytest.raises(ValueError, match=r"actions has shape \(2,\)"):
        env.step_async(np.array([0, 1]))
    with pytest.raises(ValueError, match=r"action_face='flat' must be one of \['branched', 'joint'\]"):
        LOBVecEnv(2, data="synthetic", num_steps=400, episode_length=50, action_face="flat")


def test_dqn_round_trip() -> None:
    """SB3 DQN trains on the joint face and its greedy codes decode to valid four-branch actions."""
    from stable_baselines3 import DQN

    env = joint_env()
    model = DQN("MlpPolicy", env, learning_starts=30, batch_size=16, buffer_size=500, seed=0,
                policy_kwargs={"net_arch": [16]})
    model.learn(90)
    obs = env.reset()
    codes, _ = model.predict(obs, deterministic=True)
    assert codes.shape == (3,) and ((codes >= 0) & (codes < 81)).all()
    policy = ModelPolicy(model)
    policy.reset(3, torch.device("cpu"))
    actions = policy.act(torch.as_tensor(obs), torch.zeros(3, dtype=torch.bool))
    assert torch.equal(actions, decode_joint(codes, 3))
    env.step_async(codes)
    env.step_wait()
