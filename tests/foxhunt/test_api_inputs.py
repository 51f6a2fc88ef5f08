"""The Python API's bad inputs as clear errors before any allocation (issue 39.13-14)."""

from __future__ import annotations

import gymnasium as gym
import pytest

import foxenv  # noqa: F401  (registers foxenv/LOB-v0)
from foxhunt.device_lob_env import DeviceLOBVecEnv


def test_a_huge_number_of_books_is_refused_before_allocating() -> None:
    with pytest.raises(ValueError, match=r"num_envs=1000000000 needs about [\d,]+ GB .* lower num_envs"):
        DeviceLOBVecEnv(10**9)


def test_validate_actions_must_be_a_bool() -> None:
    with pytest.raises(ValueError, match="validate_actions='yes' must be a bool or None"):
        DeviceLOBVecEnv(2, validate_actions="yes")


@pytest.mark.parametrize("field", ["train_fraction", "validation_fraction"])
def test_a_fraction_given_as_a_string_is_named(field: str) -> None:
    with pytest.raises(ValueError, match=f"{field}='0.8' must be a number strictly between 0 and 1"):
        gym.make("foxenv/LOB-v0", **{field: "0.8"})
