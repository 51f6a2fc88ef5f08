"""Collection on the device: :class:`DeviceCollector`, held by the algorithm (``BranchingIQN.collector``).

``collector`` (the device loop, its callbacks and flushes, and which rollouts run fused), ``fused`` (a
rollout and its gradient steps as one CUDA graph), ``episodes`` (episode statistics and action counts on the
device) and ``protocol`` (what the collector needs of the algorithm). No state lives at module level: each
algorithm's collector holds its own.
"""

from sb3_her_ext.collect.collector import NORMALIZER_PENDING, CollectorSettings, DeviceCollector
from sb3_her_ext.collect.episodes import EpisodeStats
from sb3_her_ext.collect.fused import RANDOM, CaptureError, FusedBlock
from sb3_her_ext.collect.protocol import CollectingAlgorithm, Counters

__all__ = [
    "NORMALIZER_PENDING",
    "RANDOM",
    "CaptureError",
    "CollectingAlgorithm",
    "CollectorSettings",
    "Counters",
    "DeviceCollector",
    "EpisodeStats",
    "FusedBlock",
]
