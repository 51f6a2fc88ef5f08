"""What a rollout records on the device: finished episodes (:class:`EpisodeStats`) and the actions taken
(:func:`record_steps`), read on the host only at the collector's flush points; and the warm-up's uniform
random actions (:func:`random_actions`)."""

from __future__ import annotations

import numpy as np
import torch as th


class EpisodeStats:
    """The last ``window`` finished episodes' return and length, and the count of finished episodes, on the
    device; read on the host only by :meth:`read`.

    :param window: episodes kept (SB3's ``stats_window_size``); >= 1.
    :param device: device of the ring.
    """

    def __init__(self, window: int, device: th.device) -> None:
        if int(window) != window or window < 1:
            raise ValueError(f"window={window!r} must be an integer >= 1")
        self.window = int(window)
        self.returns = th.zeros(self.window, dtype=th.float64, device=device)
        self.lengths = th.zeros(self.window, dtype=th.int64, device=device)
        self.count = th.zeros((), dtype=th.int64, device=device)
        #: ``-1 - slot`` per slot (the slot's offset in :meth:`add`'s modular rank)
        self._last_minus_slots = -1 - th.arange(self.window, device=device)
        self.read_count = 0  # the count at the last read (host)

    def add(self, done: th.Tensor, episode_return: th.Tensor, episode_length: th.Tensor) -> None:
        """Record the episodes that ended in one vector step, in env order (no host sync).

        Episode number ``count + r`` (``r``: its rank among this step's, in env order) goes to slot
        ``(count + r) % window``. Each slot gathers the episode of the one rank that lands on it among the
        last ``window`` ranks (a gather, not a scatter: no duplicate writes, deterministic on every device).

        :param done: ``[N]`` bool.
        :param episode_return: ``[N]`` returns (valid where ``done``).
        :param episode_length: ``[N]`` lengths (valid where ``done``).
        """
        ended = th.cumsum(done, 0, dtype=th.int64)  # [N] episodes ended in this step up to each env
        total = ended[-1]
        self.count.add_(total)
        # slot s holds rank  total - 1 - ((count - 1 - s) mod window)  (count after this step); here
        # taken = that rank + 1 (in [total - window + 1, total]), so written where taken >= 1
        taken = total - th.remainder(self.count + self._last_minus_slots, self.window)  # [W]
        # the env of that rank: the first whose prefix count reaches it; 0 where taken <= 0 (not written), and
        # never past the last env (taken <= total = ended[-1])
        env = th.searchsorted(ended, taken)
        written = taken >= 1
        # in place: a captured CUDA graph (sb3_her_ext.collect.block) keeps writing the same tensors
        th.where(written, episode_return.to(th.float64)[env], self.returns, out=self.returns)
        th.where(written, episode_length.to(th.int64)[env], self.lengths, out=self.lengths)

    def restart(self) -> None:
        """Forget every episode (a new ``learn``), keeping the tensors (a captured graph writes them)."""
        self.returns.zero_()
        self.lengths.zero_()
        self.count.zero_()
        self.read_count = 0

    def read(self, also: th.Tensor | None = None) -> tuple[list[tuple[float, int]], int, np.ndarray]:
        """The episodes finished since the last read, oldest first: one device-to-host copy (a sync).

        :param also: more numbers to bring over in the same copy (as float64: exact below 2**53).
        :return: ``([(return, length), ...]`` of the last at most ``window`` of them, how many finished,
            ``also``'s values flattened (empty without it)).
        """
        parts = [self.count.reshape(1).to(th.float64), self.returns, self.lengths.to(th.float64)]
        if also is not None:
            parts.append(also.reshape(-1).to(th.float64))
        host = th.cat(parts).cpu().numpy()
        window = self.window
        count = int(host[0])
        returns, lengths = host[1 : 1 + window].tolist(), host[1 + window : 1 + 2 * window].astype(np.int64)
        first = max(self.read_count, count - window)
        n_new, self.read_count = count - self.read_count, count
        episodes = [(returns[k % window], int(lengths[k % window])) for k in range(first, count)]
        return episodes, n_new, host[1 + 2 * window :].copy()


def record_steps(stats: EpisodeStats, action_counts: th.Tensor, done: th.Tensor, episode_return: th.Tensor,
                 episode_length: th.Tensor, actions: th.Tensor, values: th.Tensor) -> None:
    """The episode statistics and action counts of one vector step, or of ``k`` steps at once (their
    tensors stacked, ``[k, N, ...]``, in step order): the same ring, count and action counts as recording
    the steps one by one (:meth:`EpisodeStats.add` takes the episodes in that order), in the ops of one step.

    :param stats: the episode ring.
    :param action_counts: ``[NB, A]`` int64 counts of each branch's actions (added to in place: integer sums,
        exact in any grouping of the steps).
    :param done: ``[N]`` or ``[k, N]`` bool.
    :param episode_return: returns of the same shape (valid where ``done``).
    :param episode_length: lengths of the same shape (valid where ``done``).
    :param actions: ``[N, NB]`` or ``[k, N, NB]`` int64 actions.
    :param values: ``[A]`` the action values ``0 .. A - 1`` (``arange``, made once by the caller).
    """
    stats.add(done.reshape(-1), episode_return.reshape(-1), episode_length.reshape(-1))
    flat = actions.reshape(-1, actions.shape[-1])
    action_counts += (flat[:, :, None] == values).sum(dim=0)


def random_actions(n_actions: th.Tensor, generator: th.Generator, n_envs: int) -> th.Tensor:
    """Uniform random actions per branch (SB3's warm-up ``action_space.sample()``, on the device).

    :param n_actions: ``[NB]`` int64 actions of each branch.
    :param generator: the draws' generator (on ``n_actions``' device).
    :param n_envs: rows to draw.
    :return: ``[n_envs, NB]`` int64 actions.
    """
    uniform = th.rand((n_envs, n_actions.shape[0]), generator=generator, device=n_actions.device)
    return th.minimum((uniform * n_actions).to(th.int64), n_actions - 1)
