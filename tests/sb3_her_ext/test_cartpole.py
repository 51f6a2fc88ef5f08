"""BranchingIQN beyond foxenv: a user who tries it on a classic task first should see it learn (issue 29, 8).

rl-zoo3's DQN hyperparameters for CartPole-v1, except the learning rate: DQN's 2.3e-3 makes BranchingIQN
collapse (87.5 at 16k steps), its own default 1e-4 learns (500.0 at 50k steps; README, "porting DQN
hyperparameters").
"""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch
from stable_baselines3.common.evaluation import evaluate_policy

from sb3_her_ext import BranchingIQN

#: rl-zoo3's DQN hyperparameters for CartPole-v1, without its learning rate
ZOO_WITHOUT_LR = dict(batch_size=64, buffer_size=100_000, learning_starts=1000, gamma=0.99,
                      target_update_interval=10, train_freq=256, gradient_steps=128,
                      exploration_fraction=0.16, exploration_final_eps=0.04)


@pytest.mark.slow
def test_branching_iqn_learns_cartpole_with_its_defaults() -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = BranchingIQN("MlpPolicy", gym.make("CartPole-v1"), seed=0,
                             policy_kwargs={"net_arch": [256, 256]}, **ZOO_WITHOUT_LR)
        model.learn(16_000)
        mean, _ = evaluate_policy(model, gym.make("CartPole-v1"), n_eval_episodes=10, deterministic=True)
    finally:
        torch.set_num_threads(threads)
    # a random policy scores ~22; the collapsed run with DQN's learning rate 87.5
    assert mean >= 250.0, mean
