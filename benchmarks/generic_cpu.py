"""BranchingIQN as a generic SB3 algorithm on a small CPU env: ms per env step against sb3-contrib QR-DQN.

The env is a toy ``MultiDiscrete([3, 4, 2])`` task defined here (:class:`ToyBranchEnv`): a 4-float observation
names a target per branch, reward 1/3 for each branch that hits it, 16-step episodes. BranchingIQN sees it as
``MultiDiscrete``; QR-DQN sees the same env through :class:`FlatActions` as ``Discrete(24)``. Both run at
their own library defaults (no keyword changed but ``seed``, ``device="cpu"``, ``verbose=0``) on
``--n-envs`` copies in a ``DummyVecEnv``, with 1 torch thread.

Timing: each model first learns past its ``learning_starts`` (warm-up: its first gradient steps fall there),
then the two alternate ``--rounds`` times (A, B, A, B, ...), each round ``learn(--steps,
reset_num_timesteps=False)`` timed with ``perf_counter``, so that a load change hits both alike.
``ms_per_env_step`` is the median over rounds of the round's wall time over its env steps; ``over_qrdqn``
divides BranchingIQN's by QR-DQN's (target: at most 2).

Usage::

    python benchmarks/generic_cpu.py                  # 4 envs, 3 rounds of 2000 env steps each
    python benchmarks/generic_cpu.py --quick          # a smoke run
    python benchmarks/generic_cpu.py --profile 4000   # and cProfile's top functions of BranchingIQN's learn

Prints a table and writes ``benchmarks/results/generic_cpu.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch as th

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _common.py beside this file
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's packages
from _common import default_out, machine_info, peer_missing, report  # noqa: E402

RESULTS = default_out("generic_cpu")
NVEC = (3, 4, 2)
EPISODE = 16


class ToyBranchEnv(gym.Env):
    """A tiny ``MultiDiscrete([3, 4, 2])`` task: hit each branch's target, named by the observation.

    :param seed: the observation stream's seed.
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, seed: int = 0) -> None:
        self.observation_space = gym.spaces.Box(0.0, 1.0, shape=(len(NVEC) + 1,), dtype=np.float32)
        self.action_space = gym.spaces.MultiDiscrete(NVEC)
        self._rng = np.random.default_rng(seed)
        self._obs = np.zeros(len(NVEC) + 1, dtype=np.float32)
        self._t = 0

    def _draw(self) -> np.ndarray:
        self._obs = self._rng.random(len(NVEC) + 1).astype(np.float32)
        return self._obs

    def _targets(self) -> np.ndarray:
        return np.minimum((self._obs[: len(NVEC)] * np.array(NVEC)).astype(np.int64), np.array(NVEC) - 1)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        """Start an episode.

        :param seed: reseeds the observation stream when given.
        :param options: unused.
        :return: the first observation and an empty info.
        """
        super().reset(seed=seed)
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self._t = 0
        return self._draw().copy(), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        """Score ``action`` against the targets and draw the next observation.

        :param action: one choice per branch.
        :return: observation, reward (share of branches hit), terminated, truncated, info.
        """
        reward = float(np.mean(np.asarray(action) == self._targets()))
        self._t += 1
        return self._draw().copy(), reward, False, self._t >= EPISODE, {}


class FlatActions(gym.ActionWrapper):
    """The same env with its ``MultiDiscrete`` actions as one ``Discrete(prod(nvec))`` (what QR-DQN takes).

    :param env: a ``MultiDiscrete`` env.
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self._nvec = tuple(int(n) for n in env.action_space.nvec)
        self.action_space = gym.spaces.Discrete(int(np.prod(self._nvec)))

    def action(self, action: int) -> np.ndarray:
        """``action`` unravelled into one choice per branch.

        :param action: the joint index.
        :return: the branch choices.
        """
        return np.array(np.unravel_index(int(action), self._nvec), dtype=np.int64)


def make_vec_env(n_envs: int, flat: bool, seed: int) -> Any:
    """``n_envs`` toy envs in a ``DummyVecEnv``.

    :param n_envs: envs.
    :param flat: wrap each in :class:`FlatActions`.
    :param seed: the first env's seed (the others count up).
    :return: the vector env.
    """
    from stable_baselines3.common.vec_env import DummyVecEnv

    def one(i: int) -> Any:
        return lambda: FlatActions(ToyBranchEnv(seed + i)) if flat else ToyBranchEnv(seed + i)

    return DummyVecEnv([one(i) for i in range(n_envs)])


def build(name: str, n_envs: int, seed: int) -> Any:
    """A model at its library defaults on the toy env.

    :param name: ``"BranchingIQN"`` or ``"QR-DQN"``.
    :param n_envs: envs.
    :param seed: the model's and envs' seed.
    :return: the model.
    """
    if name == "BranchingIQN":
        from sb3_her_ext import BranchingIQN

        env = make_vec_env(n_envs, False, seed)
        return BranchingIQN("MlpPolicy", env, seed=seed, device="cpu", verbose=0)
    from sb3_contrib import QRDQN

    return QRDQN("MlpPolicy", make_vec_env(n_envs, True, seed), seed=seed, device="cpu", verbose=0)


def timed_learn(model: Any, steps: int) -> float:
    """Wall seconds of ``model.learn(steps)`` continuing its run.

    :param model: the model.
    :param steps: env steps.
    :return: seconds.
    """
    begin = time.perf_counter()
    model.learn(steps, reset_num_timesteps=False, log_interval=10**9)
    return time.perf_counter() - begin


def profile_top(model: Any, steps: int, top: int = 25) -> str:
    """cProfile's top functions (by own time) of ``model.learn(steps)``.

    :param model: a warmed-up model.
    :param steps: env steps profiled.
    :param top: functions listed.
    :return: the listing.
    """
    profiler = cProfile.Profile()
    profiler.enable()
    model.learn(steps, reset_num_timesteps=False, log_interval=10**9)
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Time both algorithms alternately.

    :param args: the parsed command line.
    :return: the JSON-ready result.
    """
    th.set_num_threads(1)
    models: dict[str, Any] = {"BranchingIQN": build("BranchingIQN", args.n_envs, args.seed)}
    notes: dict[str, str] = {}
    try:
        models["QR-DQN"] = build("QR-DQN", args.n_envs, args.seed)
    except ImportError as error:
        notes["QR-DQN"] = peer_missing("sb3-contrib", error)
    for model in models.values():  # past learning_starts: the first gradient steps are in the warm-up
        model.learn(model.learning_starts + args.steps // 4, log_interval=10**9)
    samples: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(args.rounds):
        for name, model in models.items():
            samples[name].append(timed_learn(model, args.steps) * 1e3 / args.steps)
    rows = [{"algorithm": name, "ms_per_env_step": statistics.median(ms), "rounds_ms_per_env_step": ms,
             "learning_starts": models[name].learning_starts, "batch_size": models[name].batch_size,
             "train_freq": models[name].train_freq.frequency, "gradient_steps": models[name].gradient_steps}
            for name, ms in samples.items()]
    if "QR-DQN" in samples:
        base = statistics.median(samples["QR-DQN"])
        for row in rows:
            row["over_qrdqn"] = row["ms_per_env_step"] / base
    result = {"benchmark": "generic_cpu", "env": f"MultiDiscrete{list(NVEC)} toy, {EPISODE}-step episodes",
              "n_envs": args.n_envs, "steps_per_round": args.steps, "rounds": args.rounds, "rows": rows,
              "notes": notes, "machine": machine_info()}
    if args.profile:
        result["profile_branching_iqn"] = profile_top(models["BranchingIQN"], args.profile)
    return result


def print_table(result: dict[str, Any]) -> None:
    """Print the rows.

    :param result: what :func:`run` returned.
    """
    print(f"{result['env']}, {result['n_envs']} envs, {result['rounds']} alternating rounds of "
          f"{result['steps_per_round']} env steps, load {result['machine']['load_average_1min']}")
    print(f"{'algorithm':<14}{'ms/env step':>12}{'x QR-DQN':>10}  rounds (ms/env step)")
    for row in result["rows"]:
        ratio = f"{row['over_qrdqn']:.2f}" if "over_qrdqn" in row else "-"
        rounds = " ".join(f"{ms:.3f}" for ms in row["rounds_ms_per_env_step"])
        print(f"{row['algorithm']:<14}{row['ms_per_env_step']:>12.3f}{ratio:>10}  {rounds}")
    for name, note in result["notes"].items():
        print(f"{name}: {note}")
    if "profile_branching_iqn" in result:
        print(result["profile_branching_iqn"])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse the command line, run, print and write the JSON.

    :param argv: arguments (default: ``sys.argv``).
    :return: the result.
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n-envs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2000, help="env steps per timed round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per algorithm")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", type=int, default=0,
                        help="then cProfile BranchingIQN over this many steps")
    parser.add_argument("--quick", action="store_true", help="2 rounds of 400 steps (a smoke run)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.rounds = 400, 2
    for field in ("n_envs", "steps", "rounds"):
        if getattr(args, field) < 1:
            parser.error(f"--{field.replace('_', '-')} must be >= 1, got {getattr(args, field)}")
    return report(run(args), print_table, args.out)


if __name__ == "__main__":
    main()
