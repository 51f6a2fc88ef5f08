"""BranchingIQN's argument checks name the argument and its value (instead of SB3's or torch's deep errors):
types, learning rates and their schedules, ``buffer_size >= batch_size``, ``VecNormalize``."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

from sb3_her_ext import BranchingIQN

TINY_POLICY = dict(net_arch=[8], n_ensemble=2, n_cos=4, n_quantiles=4, n_quantiles_target=4,
                   n_quantiles_act=4, n_atoms=11)
TINY = dict(learning_starts=4, batch_size=4, buffer_size=100, policy_kwargs=TINY_POLICY, device="cpu",
            hindsight=False)


class TinyEnv:
    """A gymnasium env factory: Box(3) observations, MultiDiscrete([3, 2]) actions."""

    def __call__(self):
        import gymnasium as gym

        class Env(gym.Env):
            observation_space = spaces.Box(-1.0, 1.0, (3,), np.float32)
            action_space = spaces.MultiDiscrete([3, 2])

            def reset(self, seed=None, options=None):
                return np.zeros(3, np.float32), {}

            def step(self, action):
                return np.zeros(3, np.float32), 0.0, False, False, {}

        return Env()


def vec_env() -> DummyVecEnv:
    return DummyVecEnv([TinyEnv()])


def make(**kwargs) -> BranchingIQN:
    return BranchingIQN("MlpPolicy", vec_env(), **{**TINY, **kwargs})


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("gamma", "0.99", "gamma='0.99' must be a number, not a str"),
        ("gamma", True, "gamma=True must be a number, not a bool"),
        ("gamma", float("nan"), "gamma=nan must be finite"),
        ("tau", None, "tau=None must be a number, not a NoneType"),
        ("c51_alpha", "0.5", "c51_alpha='0.5' must be a number, not a str"),
        ("exploration_fraction", False, "exploration_fraction=False must be a number, not a bool"),
        ("max_grad_norm", float("inf"), "max_grad_norm=inf must be finite"),
        ("per_alpha", [0.6], "per_alpha=[0.6] must be a number, not a list"),
        ("per_beta", "0.4", "per_beta='0.4' must be a number or a (start, end) pair"),
        ("per_beta", (0.4, "1"), "per_beta[1]='1' must be a number, not a str"),
        ("iqr_bonus", True, "iqr_bonus=True must be a number or a (start, end) pair"),
        ("seed", 1.5, "seed=1.5 must be an integer or None"),
        ("seed", True, "seed=True must be an integer or None"),
        ("seed", "3", "seed='3' must be an integer or None"),
        ("batch_size", True, "batch_size=True must be an integer >= 1"),
        ("buffer_size", 10.5, "buffer_size=10.5 must be an integer >= 1"),
        ("learning_starts", False, "learning_starts=False must be an integer >= 0"),
        ("verbose", 0.5, "verbose=0.5 must be an integer >= 0"),
        ("stats_window_size", 0, "stats_window_size=0 must be an integer >= 1"),
        ("optimize_memory_usage", 1, "optimize_memory_usage=1 must be a bool"),
        ("buffer_size", 3, "buffer_size=3 must be >= batch_size=4"),
    ],
)
def test_bad_arguments_name_the_argument(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError) as excinfo:
        make(**{field: value})
    assert str(excinfo.value) == message


def test_whole_numbers_are_passed_on_as_ints() -> None:
    model = make(buffer_size=100.0, batch_size=4.0, learning_starts=np.int64(4), seed=np.int64(3))
    assert model.buffer_size == 100 and type(model.buffer_size) is int
    assert model.batch_size == 4 and type(model.batch_size) is int and model.seed == 3
    assert make(buffer_size=4).buffer_size == 4  # buffer_size == batch_size is allowed


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (float("inf"), "learning_rate=inf must be finite and > 0"),
        (float("nan"), "learning_rate=nan must be finite and > 0"),
        (0.0, "learning_rate=0.0 must be finite and > 0"),
        (-1e-4, "learning_rate=-0.0001 must be finite and > 0"),
        ("1e-4", "learning_rate='1e-4' must be a number, not a str"),
        (True, "learning_rate=True must be a number, not a bool"),
        (lambda p: float("inf"), "learning_rate=inf (the schedule's value at progress_remaining=1) must be "
                                 "finite and > 0"),
        (lambda p: 1e-4 * p, "learning_rate=0.0 (the schedule's value at progress_remaining=0) must be "
                             "finite and > 0"),
        (lambda p: float("nan") if p == 0.5 else 1e-4,
         "learning_rate=nan (the schedule's value at progress_remaining=0.5) must be finite and > 0"),
        (lambda p: "fast", "learning_rate='fast' (the schedule's value at progress_remaining=1) must be a "
                           "number, not a str"),
    ],
)
def test_learning_rate_and_schedules_are_checked(value: object, message: str) -> None:
    with pytest.raises(ValueError) as excinfo:
        make(learning_rate=value)
    assert str(excinfo.value) == message


def test_a_schedule_is_checked_at_each_update() -> None:
    def schedule(progress: float) -> float:  # fine where checked at construction, negative in between
        return -1.0 if 0.2 < progress < 0.4 else 1e-3

    model = make(learning_rate=schedule, train_freq=1)
    with pytest.raises(ValueError, match=r"learning_rate=-1.0 \(the schedule's value at progress_remaining="):
        model.learn(40)
    assert all(group["lr"] == 1e-3 for group in model.policy.optimizer.param_groups)


def test_vec_normalize_is_refused_at_construction_and_in_set_env() -> None:
    message = "env is wrapped in VecNormalize, which BranchingIQN does not support"
    with pytest.raises(ValueError, match=message):
        BranchingIQN("MlpPolicy", VecNormalize(vec_env()), **TINY)
    model = make()
    with pytest.raises(ValueError, match=message):
        model.set_env(VecNormalize(vec_env()))
    assert model.get_vec_normalize_env() is None
