"""SB3 callbacks of a training run besides its checkpoints: progress lines off a terminal, a time limit.

- :class:`ProgressLineCallback` prints one line every ``every`` seconds (steps, rate, ETA, episode reward):
  what :func:`foxhunt.runs.train` shows instead of the progress bar when stdout is not a terminal (a log
  file, ``nohup``, a batch job), where a bar prints nothing until it ends.
- :class:`TimeLimitCallback` stops ``learn`` after a wall time (``foxhunt train --time-limit 90m``): the run
  then ends as one that ran its steps does (the last checkpoint, ``model.zip``, the evaluation), and its
  report says where it was cut (:attr:`TimeLimitCallback.stop_reason`).
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from stable_baselines3.common.callbacks import BaseCallback


def format_duration(seconds: float) -> str:
    """``1h02m``, ``3m05s`` or ``42s``."""
    seconds = max(int(round(seconds)), 0)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class ProgressLineCallback(BaseCallback):
    """Print a line every ``every`` seconds of training: steps done of ``total``, the rate since ``learn``
    started, the time left at that rate, and the last episode's reward (with the mean of SB3's episode
    window).

    :param total: the run's environment steps (``model.num_timesteps`` when it is done).
    :param every: seconds between lines.
    :param stream: where the lines go (default: ``sys.stdout`` at each line), flushed at each line.
    """

    def __init__(self, total: int, every: float = 30.0, stream: TextIO | None = None) -> None:
        super().__init__()
        self.total = int(total)
        self.every = float(every)
        self.stream = stream
        self.start_time = self.next_time = 0.0
        self.start_step = 0

    def _print(self, text: str) -> None:
        print(text, file=self.stream or sys.stdout, flush=True)

    def _on_training_start(self) -> None:
        self.start_time = time.monotonic()
        self.next_time = self.start_time + self.every
        self.start_step = self.model.num_timesteps
        self._print(f"training: step {self.start_step:,} of {self.total:,}, a progress line every "
                    f"{format_duration(self.every)}")

    def line(self) -> str:
        """The progress line now."""
        step, elapsed = self.model.num_timesteps, time.monotonic() - self.start_time
        rate = (step - self.start_step) / elapsed if elapsed > 0 else 0.0
        eta = format_duration((self.total - step) / rate) if rate > 0 else "?"
        share = 100 * step / max(self.total, 1)
        text = (f"step {step:,} of {self.total:,} ({share:.0f} %), {rate:,.0f} steps/s, "
                f"elapsed {format_duration(elapsed)}, ETA {eta}")
        episodes: Any = self.model.ep_info_buffer
        if episodes:
            rewards = [float(info["r"]) for info in episodes]
            text += (f", episode reward: last {rewards[-1]:.4g}, mean of {len(rewards)} "
                     f"{sum(rewards) / len(rewards):.4g}")
        return text

    def _on_step(self) -> bool:
        now = time.monotonic()
        if now >= self.next_time:
            self.next_time = now + self.every
            self._print(self.line())
        return True

    def _on_training_end(self) -> None:
        self._print(self.line())


class TimeLimitCallback(BaseCallback):
    """Stop training once ``seconds`` of wall time have passed since ``learn`` started (``on_step`` returns
    ``False``: SB3 ends ``learn`` cleanly, the other callbacks' ``on_training_end`` run).

    :param seconds: the wall time allowed.
    :param name: how the limit is named in :attr:`stop_reason` (``"--time-limit 90m"``).
    :param total: the run's environment steps (said in :attr:`stop_reason`; ``None``: not said).
    """

    def __init__(self, seconds: float, name: str = "the time limit", total: int | None = None) -> None:
        super().__init__()
        if not seconds > 0:
            raise ValueError(f"seconds={seconds!r} must be > 0")
        self.seconds = float(seconds)
        self.name = name
        self.total = total
        self.deadline = 0.0
        #: why training stopped early (``None`` while it has not)
        self.stop_reason: str | None = None

    def _on_training_start(self) -> None:
        self.deadline = time.monotonic() + self.seconds

    def _on_step(self) -> bool:
        if time.monotonic() < self.deadline:
            return True
        of = f" of {self.total:,}" if self.total is not None else ""
        self.stop_reason = (f"training stopped by {self.name} at step {self.model.num_timesteps:,}{of}")
        print(f"{self.stop_reason}: saving the model and a checkpoint, then evaluating", flush=True)
        return False
