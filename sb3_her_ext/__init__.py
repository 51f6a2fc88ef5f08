"""BranchingIQN for Stable-Baselines3: branching distributional Q-learning with prioritized hindsight replay.

``from sb3_her_ext import BranchingIQN`` and use it like SB3's DQN::

    model = BranchingIQN("MlpPolicy", env, seed=0)
    model.learn(100_000, progress_bar=True)
    learn_concurrently([model_a, model_b], 100_000)  # several models at once, each as if alone

Modules: ``algorithm`` (the SB3 algorithm: acting, schedules, saving), ``arguments`` (its argument checks),
``collect`` (collection on the device), ``concurrent`` (several models at once), ``learner`` (the
gradient step), ``policy`` (the SB3 policy), ``networks`` (the branching Q-network), ``fused`` (its
hand-written training passes), ``losses``, ``popart``, ``vaccine`` (GradVac), ``graphed_step`` (the step
as a CUDA graph), ``exploration``, ``replay`` and ``hindsight`` (the device replay buffer), ``diagnostics``,
``branches`` (branch counts, names, keyed arguments), ``guard`` (the NaN guard), ``checksum`` (the SHA-256
of replay buffer files) and ``validation`` (small checks). The package is
generic: trading defaults arrive as arguments (see ``foxhunt.presets``).
"""

from sb3_her_ext.algorithm import BranchingIQN
from sb3_her_ext.concurrent import ConcurrentTrainingError, learn_concurrently
from sb3_her_ext.guard import NonFiniteError
from sb3_her_ext.policy import BranchingIQNPolicy, MlpPolicy
from sb3_her_ext.replay import HindsightConfig, PrioritizedHindsightReplayBuffer

__all__ = [
    "BranchingIQN",
    "BranchingIQNPolicy",
    "ConcurrentTrainingError",
    "HindsightConfig",
    "MlpPolicy",
    "NonFiniteError",
    "PrioritizedHindsightReplayBuffer",
    "learn_concurrently",
]
