"""BranchingIQN as a drop-in for QR-DQN: rl-zoo3's QR-DQN CartPole-v1 hyper-parameters, per-seed returns.

rl-zoo3's ``hyperparams/qrdqn.yml`` for CartPole-v1: 50k steps, batch 64, buffer 100k, learning_starts 1000,
gamma 0.99, target_update_interval 10, train_freq 256, gradient_steps 128, exploration_fraction 0.16,
exploration_final_eps 0.04, ``net_arch=[256, 256]``, ``n_quantiles=10`` (QR-DQN only) and learning rate 2.3e-3
(QR-DQN; BranchingIQN keeps its own unless ``--lr`` is given, as the README advises). ``--set KEY=VALUE``
overrides a BranchingIQN argument (a Python literal) to test which setting makes it robust. Each seed trains
on one ``CartPole-v1`` env with 1 torch thread and is scored by ``evaluate_policy`` (10 deterministic
episodes) every ``--eval-every`` steps of one ``learn`` call and at its end. The results (BranchingIQN's
default 5e-4 against the former 1e-4): ``benchmarks/RESULTS.md``, "CartPole-v1 at rl-zoo3's QR-DQN settings".

Usage::

    python benchmarks/cartpole_zoo.py --algo biqn --seeds 0 1 2 3 4
    python benchmarks/cartpole_zoo.py --algo qrdqn --seeds 0 1 2 3 4
    python benchmarks/cartpole_zoo.py --algo biqn --seeds 0 1 --set c51_alpha=0.0

Prints one line per seed and writes ``benchmarks/results/cartpole_zoo_<algo>.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import ast
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch as th

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _common.py beside this file
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's packages
from _common import default_out, machine_info, write_json  # noqa: E402

#: rl-zoo3's QR-DQN CartPole-v1 values but the learning rate and the quantile count
ZOO = dict(batch_size=64, buffer_size=100_000, learning_starts=1000, gamma=0.99, target_update_interval=10,
           train_freq=256, gradient_steps=128, exploration_fraction=0.16, exploration_final_eps=0.04)
ZOO_LR = 2.3e-3
STEPS = 50_000


def build(algo: str, seed: int, overrides: dict[str, Any], lr: float | None) -> Any:
    """A model at rl-zoo3's settings.

    :param algo: ``"biqn"`` or ``"qrdqn"``.
    :param seed: its seed.
    :param overrides: BranchingIQN arguments replaced.
    :param lr: the learning rate (``None``: QR-DQN's zoo value, BranchingIQN's default).
    :return: the model.
    """
    env = gym.make("CartPole-v1")
    if algo == "qrdqn":
        from sb3_contrib import QRDQN

        return QRDQN("MlpPolicy", env, seed=seed, learning_rate=lr or ZOO_LR,
                     policy_kwargs={"net_arch": [256, 256], "n_quantiles": 10}, **ZOO)
    from sb3_her_ext import BranchingIQN

    kwargs: dict[str, Any] = {**ZOO, "policy_kwargs": {"net_arch": [256, 256]}, **overrides}
    if lr is not None:
        kwargs["learning_rate"] = lr
    return BranchingIQN("MlpPolicy", env, seed=seed, device="cpu", **kwargs)


class _Scorer:
    """SB3 callback that scores the model every ``every`` env steps (``evaluate_policy``, 10 deterministic
    episodes on its own env), inside ONE ``learn`` call: the schedules (ε over ``exploration_fraction`` of the
    50k steps, BranchingIQN's IQR bonus and PER β) run as rl-zoo3 runs them. (Chunked ``learn`` calls would
    restart them: ε would fall over 16 % of each chunk.)

    :param every: env steps between scores.
    """

    def __init__(self, every: int) -> None:
        from stable_baselines3.common.callbacks import BaseCallback

        scorer = self

        class Callback(BaseCallback):
            def _on_step(self) -> bool:
                if self.num_timesteps % scorer.every == 0:
                    scorer.score(self.model)
                return True

        self.every = every
        self.curve: list[list[float]] = []
        self.popart: list[list[float]] = []
        self.eps: list[list[float]] = []
        self.callback = Callback()

    def score(self, model: Any) -> float:
        """Score ``model`` now; add the point to the curve (with ε, PopArt's ``mu`` and ``sigma``)."""
        from stable_baselines3.common.evaluation import evaluate_policy
        from stable_baselines3.common.monitor import Monitor

        mean, _ = evaluate_policy(model, Monitor(gym.make("CartPole-v1")), n_eval_episodes=10,
                                  deterministic=True)
        self.curve.append([model.num_timesteps, float(mean)])
        self.eps.append([model.num_timesteps, float(model.exploration_rate)])
        popart = getattr(model.policy, "popart", None)
        if popart is not None:
            self.popart.append([model.num_timesteps, float(popart.mu), float(popart.sigma)])
        return float(mean)


def one_seed(args: argparse.Namespace, seed: int, overrides: dict[str, Any]) -> dict[str, Any]:
    """Train and score one seed: one ``learn(args.steps)``, scored every ``--eval-every`` steps, at its end.

    :param args: the parsed command line.
    :param seed: the seed.
    :param overrides: BranchingIQN arguments replaced.
    :return: its curve, final return, ε and PopArt statistics (BranchingIQN) at each score, and seconds.
    """
    begin = time.perf_counter()
    model = build(args.algo, seed, overrides, args.lr)
    scorer = _Scorer(args.eval_every)
    model.learn(args.steps, callback=scorer.callback)
    final = scorer.score(model)
    return {"seed": seed, "final": final, "curve": scorer.curve, "popart": scorer.popart,
            "eps": scorer.eps, "seconds": time.perf_counter() - begin}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse, run every seed, print and write the JSON.

    :param argv: arguments (default: ``sys.argv``).
    :return: the result.
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algo", choices=("biqn", "qrdqn"), default="biqn")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--eval-every", type=int, default=10_000)
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    overrides = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--set expects KEY=VALUE, got {item!r}")
        overrides[key] = ast.literal_eval(value)
    th.set_num_threads(1)
    seeds = []
    for seed in args.seeds:
        seeds.append(one_seed(args, seed, overrides))
        row = seeds[-1]
        print(f"{args.algo} seed {seed}: final {row['final']:.1f}  curve {row['curve']}  "
              f"{row['seconds']:.0f} s", flush=True)
    result = {"benchmark": "cartpole_zoo", "algo": args.algo, "lr": args.lr, "overrides": overrides,
              "steps": args.steps, "seeds": seeds, "finals": [row["final"] for row in seeds],
              "machine": machine_info()}
    write_json(args.out or default_out(f"cartpole_zoo_{args.algo}"), result)
    return result


if __name__ == "__main__":
    main()
