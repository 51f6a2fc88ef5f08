"""One action check for every face and path (issue 26): the tensor faces of the device env refuse what the
numpy faces refuse; where a host read would sync, a device flag raises at the next sync point."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from foxenv import spec
from foxhunt.device_lob_env import DeviceLOBVecEnv
from foxhunt.envs import LOBVecEnv

ENV = dict(seed=0, data="synthetic", num_steps=600, episode_length=20)

JOINT_BAD = [
    (torch.full((4,), 81), r"actions\[0\]=81 out of range: a joint code must lie in \[0, 81\)"),
    (torch.full((4,), -1), r"actions\[0\]=-1 out of range"),
    (torch.full((4,), 1.5), r"actions dtype torch.float32 must be an integer dtype"),
    (torch.ones(4, dtype=torch.bool), r"actions dtype torch.bool must be an integer dtype"),
    (torch.ones(4, 4, dtype=torch.int64), r"actions has shape \(4, 4\); the joint face takes"),
]
BRANCHED_BAD = [
    (torch.full((4, 4), 3), r"actions\[0, 0\]=3 out of range: direction=3 must lie in \[0, 3\)"),
    (torch.tensor([[1, 1, 1, 1]] * 3 + [[1, 1, 1, -1]]), r"actions\[3, 3\]=-1 out of range: urgency"),
    (torch.full((4, 4), 1.0), r"actions dtype torch.float32 must be an integer dtype"),
    (torch.ones(4, dtype=torch.int64), r"actions shape \(4,\): the branched face takes actions"),
]


@pytest.mark.parametrize("step", ["step_tensors", "step_tensors_static"])
@pytest.mark.parametrize(("face", "actions", "match"), [("joint", a, m) for a, m in JOINT_BAD]
                         + [("branched", a, m) for a, m in BRANCHED_BAD])
def test_the_tensor_faces_refuse_what_the_numpy_face_refuses(step: str, face: str, actions: torch.Tensor,
                                                              match: str) -> None:
    """The issue's example: 81 played [0,0,0,0], -1 played [2,2,2,2], 1.5 played code 1."""
    env = DeviceLOBVecEnv(4, action_face=face, **ENV)
    env.reset()
    before = env.lob.state_dict()
    with pytest.raises(ValueError, match=match):
        getattr(env, step)(actions)
    after = env.lob.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before if k != "generator")  # no step was played


@pytest.mark.parametrize("codes", [[81] * 4, [-1] * 4, [1.5] * 4])
def test_the_numpy_joint_faces_refuse_them_too(codes: list) -> None:
    for env in (DeviceLOBVecEnv(4, action_face="joint", **ENV), LOBVecEnv(4, action_face="joint", **ENV)):
        env.reset()
        with pytest.raises(ValueError, match="codes|actions"):
            env.step(np.asarray(codes))


def test_a_whole_float_code_is_refused_as_on_every_face() -> None:
    with pytest.raises(ValueError, match="must be an integer dtype"):
        LOBVecEnv(4, action_face="joint", **ENV).step_async(np.array([3.0, 3.0, 3.0, 3.0]))


@pytest.mark.parametrize(("face", "actions", "shown"), [
    ("joint", torch.tensor([5, 81, 7, 2]), r"actions\[1\]=81 out of range: a joint code"),
    ("branched", torch.tensor([[1, 1, 1, 1], [0, 0, 0, 0], [1, 1, 5, 1], [1, 1, 1, 1]]),
     r"actions\[2, 2\]=5 out of range: order=5"),
])
def test_where_a_host_read_would_sync_a_device_flag_raises_at_the_next_sync_point(
    face: str, actions: torch.Tensor, shown: str
) -> None:
    """The accelerator's path, forced on the CPU: the step runs (0 played in place of the bad value, no
    table indexed out of bounds), the flag raises at the env's next sync point, once."""
    env = DeviceLOBVecEnv(4, action_face=face, **ENV)
    env.lob.validate_actions = False  # as on an accelerator: no host read inside the step
    env.reset()
    env.step_tensors(actions)  # no error yet
    env.step_tensors(torch.zeros_like(actions))
    with pytest.raises(ValueError, match=shown + r".*found at the next sync point"):
        env.running_episode_stats()
    env.running_episode_stats()  # reported once


def test_the_flag_records_the_first_bad_action_only_and_replaces_bad_values() -> None:
    flag = spec.ActionRangeFlag("cpu", joint=False)
    safe = flag.record(torch.tensor([[1, 2, 3, 0], [0, 0, 0, 0]]))
    assert safe.tolist() == [[1, 2, 0, 0], [0, 0, 0, 0]]
    flag.record(torch.tensor([[0, 0, 0, 0], [9, 0, 0, 0]]))
    assert flag.first.tolist() == [1, 0, 2, 3]
    with pytest.raises(ValueError, match=r"actions\[0, 2\]=3 out of range: order=3"):
        flag.raise_if_set()
    flag.raise_if_set()


def test_the_training_blocks_raise_the_flag_at_their_flush(monkeypatch: pytest.MonkeyPatch) -> None:
    from sb3_her_ext import BranchingIQN
    from sb3_her_ext.collect import block

    env = DeviceLOBVecEnv(4, action_face="joint", **ENV)
    env.lob.validate_actions = False
    model = BranchingIQN("MlpPolicy", env, learning_starts=1000, buffer_size=500, seed=0,
                         policy_kwargs=dict(net_arch=[8]), diagnostics_interval=40)
    monkeypatch.setattr(block, "random_actions", lambda n_actions, generator, n: torch.full((n, 1), 99))
    with pytest.raises(ValueError, match=r"actions\[0\]=99 out of range"):
        model.learn(80)
    assert model.num_timesteps == 48  # the first flush: the end of the block (4 steps of 4 books) past 40
