"""Training on the device: :class:`DeviceCollector`, held by the algorithm (``BranchingIQN.collector``).

``collector`` (``learn`` on a device vector env: a loop over training blocks, its callbacks, flushes and
logs), ``block`` (:class:`TrainBlock`: ``k`` vector steps then ``g`` gradient steps over explicit device
state, captured as one CUDA graph per key), ``episodes`` (episode statistics and action counts on the
device) and ``protocol`` (what the collector needs of the algorithm). No state lives at module level: each
algorithm's collector holds its own.
"""

from sb3_her_ext.collect.block import STATIC_FACE, BlockKey, CaptureError, TrainBlock
from sb3_her_ext.collect.collector import CollectorSettings, DeviceCollector
from sb3_her_ext.collect.episodes import EpisodeStats
from sb3_her_ext.collect.protocol import CollectingAlgorithm

__all__ = [
    "STATIC_FACE",
    "BlockKey",
    "CaptureError",
    "CollectingAlgorithm",
    "CollectorSettings",
    "DeviceCollector",
    "EpisodeStats",
    "TrainBlock",
]
