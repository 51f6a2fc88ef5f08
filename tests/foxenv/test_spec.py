"""The action and info contract (foxenv.spec) and the one action check every face applies."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from foxenv import spec
from foxenv.core import BatchedLOB
from foxenv.metrics import BRANCH_NAMES
from tests.foxenv.fake_market import random_market


def test_contract_is_consistent():
    assert spec.BRANCH_NAMES == ("direction", "magnitude", "order", "urgency")
    assert spec.ACTION_NVEC == (3, 3, 3, 3)
    assert spec.MAGNITUDES == (0.25, 0.5, 1.0)
    assert spec.DIRECTIONS == (-1, 0, 1)
    assert spec.ORDER_TYPES[spec.LIMIT_MAKER] == "limit_maker"
    assert len(spec.URGENCIES) == 3
    assert BatchedLOB.ACTION_NVEC == spec.ACTION_NVEC and BatchedLOB.BRANCH_NAMES == spec.BRANCH_NAMES
    assert BatchedLOB.MAGNITUDES == spec.MAGNITUDES and BRANCH_NAMES == spec.BRANCH_NAMES


def test_core_info_keys_are_the_contract():
    core = BatchedLOB(random_market(50, num_levels=3, seed=0), 2, spec_config())
    info = core.step(torch.ones(2, 4, dtype=torch.int64))[4]
    assert tuple(info) == spec.INFO_KEYS


def test_target_position_follows_direction_and_magnitude():
    config = spec_config()
    core = BatchedLOB(random_market(50, num_levels=3, seed=0), 1, config)
    for direction, sign in enumerate(spec.DIRECTIONS):
        for magnitude, size in enumerate(spec.MAGNITUDES):
            code = direction * 27 + magnitude * 9
            assert core._tables.actions[code, 0].item() == sign * size * config.max_position


def spec_config():
    from foxenv.config import EnvConfig

    return EnvConfig(levels=3, episode_length=5, max_position=8.0)


@pytest.mark.parametrize("as_tensor", [False, True])
def test_check_actions_accepts_integers_of_the_exact_shape(as_tensor):
    actions = np.array([[0, 1, 2, 0], [2, 2, 2, 2]], dtype=np.int32)
    given = torch.from_numpy(actions) if as_tensor else actions
    checked = spec.check_actions(given, (2, 4))
    assert (np.asarray(checked) == actions).all()
    if not as_tensor:
        assert checked.dtype == np.int64 and checked.flags.c_contiguous


@pytest.mark.parametrize("as_tensor", [False, True])
@pytest.mark.parametrize(
    ("actions", "match"),
    [
        (np.full((2, 4), 1.7), r"actions dtype (torch\.)?float64 must be an integer dtype \(actions=.*1\.7"),
        (np.ones((2, 4), dtype=bool), r"actions dtype (torch\.)?bool must be an integer dtype"),
        (np.ones(8, dtype=np.int64), r"actions shape \(8,\) must be \(2, 4\)"),
        (np.ones((4, 2), dtype=np.int64), r"actions shape \(4, 2\) must be \(2, 4\)"),
        (
            np.array([[0, 0, 0, 0], [0, 0, 3, 0]]),
            r"actions\[1, 2\]=3 out of range: order=3 must lie in \[0, 3\)",
        ),
        (np.array([[0, -1, 0, 0], [0, 0, 0, 0]]), r"actions\[0, 1\]=-1 out of range: magnitude=-1"),
    ],
)
def test_check_actions_refuses_and_names_the_field(actions, match, as_tensor):
    given = torch.from_numpy(actions) if as_tensor else actions
    with pytest.raises(ValueError, match=match):
        spec.check_actions(given, (2, 4), name="actions")


def test_check_actions_single_action_and_range_off():
    message = r"action=\[1, 5, 0, 0\] out of range: magnitude=5 must lie in \[0, 3\)"
    with pytest.raises(ValueError, match=message):
        spec.check_actions([1, 5, 0, 0], (4,))
    with pytest.raises(ValueError, match="action="):
        spec.check_actions("abcd", (4,))
    assert spec.check_actions(np.array([[9, 9, 9, 9]]), (1, 4), check_range=False).shape == (1, 4)
