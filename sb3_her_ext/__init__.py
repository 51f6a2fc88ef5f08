"""BranchingIQN for Stable-Baselines3: branching distributional Q-learning with prioritized hindsight replay.

``from sb3_her_ext import BranchingIQN`` and use it like SB3's DQN::

    model = BranchingIQN("MlpPolicy", env, seed=0)
    model.learn(100_000, progress_bar=True)
"""

from sb3_her_ext.algorithm import BranchingIQN
from sb3_her_ext.policy import BranchingIQNPolicy, MlpPolicy
from sb3_her_ext.replay import HindsightConfig, PrioritizedHindsightReplayBuffer
from sb3_her_ext.vec_env import LOBVecEnv

__all__ = [
    "BranchingIQN",
    "BranchingIQNPolicy",
    "HindsightConfig",
    "LOBVecEnv",
    "MlpPolicy",
    "PrioritizedHindsightReplayBuffer",
]
