"""FlatActionVecEnv: foxenv's four-branch action as one Discrete(81) for SB3 DQN / QR-DQN."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces

from foxhunt.envs import FLAT_ACTION_WEIGHTS, FlatActionVecEnv, LOBVecEnv, flatten_actions, unflatten_actions
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


@pytest.fixture(scope="module")
def env() -> LOBVecEnv:
    return LOBVecEnv(3, seed=0, data="synthetic", num_steps=400, episode_length=50)


def test_weights_match_the_evaluation_decoder() -> None:
    assert FLAT_ACTION_WEIGHTS == (27, 9, 3, 1)


@pytest.mark.parametrize(("action", "code"), CASES)
def test_hand_worked_codes(action: tuple[int, int, int, int], code: int) -> None:
    assert int(flatten_actions(np.array(action))) == code
    assert tuple(unflatten_actions(np.array([code]))[0]) == action


def test_round_trip_of_all_81_codes() -> None:
    codes = np.arange(81)
    actions = unflatten_actions(codes)
    assert actions.shape == (81, 4)
    assert actions.min() == 0 and actions.max() == 2
    assert len({tuple(a) for a in actions}) == 81
    np.testing.assert_array_equal(flatten_actions(actions), codes)


def test_model_policy_decodes_the_same_way() -> None:
    """A flat model scored by foxhunt.evaluation acts exactly as the wrapper stepped it in training."""

    class Flat:
        def predict(self, obs: np.ndarray, deterministic: bool = True) -> tuple[np.ndarray, None]:
            return np.arange(obs.shape[0]), None

    policy = ModelPolicy(Flat())
    policy.reset(81, torch.device("cpu"))
    decoded = policy.act(torch.zeros(81, 5), torch.zeros(81, dtype=torch.bool)).numpy()
    np.testing.assert_array_equal(decoded, unflatten_actions(np.arange(81)))


@pytest.mark.parametrize("bad", [[81], [-1], [1.5]])
def test_bad_codes_raise(bad: list[float]) -> None:
    with pytest.raises(ValueError, match="codes"):
        unflatten_actions(np.array(bad))


def test_wrapper_spaces_and_step(env: LOBVecEnv) -> None:
    flat = FlatActionVecEnv(env)
    assert flat.action_space == spaces.Discrete(81)
    assert flat.observation_space == env.observation_space
    assert flat.get_attr("n_market_features")[0] == env.n_market_features
    obs = flat.reset()
    assert obs.shape == (3, env.observation_space.shape[0])
    flat.step_async(np.array([65, 22, 33]))
    np.testing.assert_array_equal(env._actions.numpy(), [[2, 1, 0, 2], [0, 2, 1, 1], [1, 0, 2, 0]])
    obs, reward, done, infos = flat.step_wait()
    assert obs.shape[0] == reward.shape[0] == done.shape[0] == len(infos) == 3
    flat.step_async(torch.tensor([0, 80, 27]))  # torch codes are accepted too
    np.testing.assert_array_equal(env._actions.numpy(), [[0, 0, 0, 0], [2, 2, 2, 2], [1, 0, 0, 0]])
    flat.step_wait()


def test_wrapper_rejects_bad_input(env: LOBVecEnv) -> None:
    flat = FlatActionVecEnv(env)
    flat.reset()
    with pytest.raises(ValueError, match="codes"):
        flat.step_async(np.array([0, 81, 1]))
    with pytest.raises(ValueError, match="3 envs"):
        flat.step_async(np.array([0, 1]))
    with pytest.raises(ValueError, match="MultiDiscrete"):
        FlatActionVecEnv(flat)  # already flat: Discrete(81)


def test_dqn_round_trip(env: LOBVecEnv) -> None:
    """SB3 DQN trains on the wrapper and its greedy codes decode to valid four-branch actions."""
    from stable_baselines3 import DQN

    flat = FlatActionVecEnv(env)
    model = DQN("MlpPolicy", flat, learning_starts=30, batch_size=16, buffer_size=500, seed=0,
                policy_kwargs={"net_arch": [16]})
    model.learn(90)
    obs = flat.reset()
    codes, _ = model.predict(obs, deterministic=True)
    assert codes.shape == (3,) and ((codes >= 0) & (codes < 81)).all()
    policy = ModelPolicy(model)
    policy.reset(3, torch.device("cpu"))
    actions = policy.act(torch.as_tensor(obs), torch.zeros(3, dtype=torch.bool)).numpy()
    np.testing.assert_array_equal(actions, unflatten_actions(codes))
    flat.step_async(codes)
    flat.step_wait()
