"""The ``foxhunt`` command line: ``foxhunt train`` and ``foxhunt rollout``.

``foxhunt train`` with no arguments trains BranchingIQN on the built-in synthetic market (a few minutes
on a laptop CPU) and writes a run folder::

    runs/<timestamp>/
        model.zip          the trained model (BranchingIQN.load)
        config.json        every setting of the run
        diagnostics.jsonl  one line of training diagnostics per interval
        training.png       episode reward, losses, hindsight counts, ε
        tb/                TensorBoard logs
        evaluation.json    the evaluation summary printed at the end

The evaluation runs the deterministic policy on held-out data: the test split of a LOBSTER folder, or a
synthetic market generated with a different seed. ``foxhunt rollout`` scores a uniformly random policy
with :func:`foxenv.rollout.random_rollout`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch as th

#: Settings of ``foxhunt train`` sized to finish in a few minutes on a 2-core CPU.
DEFAULT_TRAIN_STEPS = 15_000
DEFAULT_N_ENVS = 8
#: Steps of the generated synthetic market (train and evaluation markets each).
SYNTHETIC_MARKET_STEPS = 20_000
#: BranchingIQN settings of ``foxhunt train`` (small networks so a CPU run stays short).
DEFAULT_MODEL_KWARGS: dict[str, Any] = {
    "learning_rate": 3e-4,
    "buffer_size": 100_000,
    "learning_starts": 1_000,
    "batch_size": 64,
    "gamma": 0.99,
    "train_freq": 1,
    "gradient_steps": 1,
    "target_update_interval": 2_000,
    "exploration_fraction": 0.3,
    "exploration_final_eps": 0.05,
    "diagnostics_interval": 500,
}
DEFAULT_POLICY_KWARGS: dict[str, Any] = {
    "net_arch": [64, 64],
    "n_ensemble": 3,
    "n_cos": 32,
    "n_quantiles": 16,
    "n_quantiles_target": 16,
    "n_quantiles_act": 16,
    "n_atoms": 51,
}
#: Environment settings of ``foxhunt train``.
DEFAULT_ENV_KWARGS: dict[str, Any] = {"episode_length": 500}


def _make_env(data: str, n_envs: int, device: str, seed: int, split: str) -> Any:
    """A :class:`LOBVecEnv` on the synthetic market (seeded) or a LOBSTER folder's ``split``."""
    from sb3_her_ext.vec_env import LOBVecEnv

    if data == "synthetic":
        return LOBVecEnv(n_envs, device=device, seed=seed, data="synthetic",
                         num_steps=SYNTHETIC_MARKET_STEPS, **DEFAULT_ENV_KWARGS)
    if not Path(data).is_dir():
        raise ValueError(f"--data={data!r} must be 'synthetic' or a folder of LOBSTER files")
    from foxenv.data import load_market

    market = load_market(data, split=split, device=device)
    # a short split (the LOBSTER sample's test split has ~300 steps) gets episodes that fit in it
    env_kwargs = {**DEFAULT_ENV_KWARGS}
    env_kwargs["episode_length"] = min(env_kwargs["episode_length"], market.num_steps - 1)
    return LOBVecEnv(n_envs, device=device, seed=seed, data=market, **env_kwargs)


def evaluate_agent(model: Any, env: Any, num_steps: int) -> dict[str, Any]:
    """Run the deterministic policy for ``num_steps`` vector steps and score it with foxenv.metrics.

    :param model: a trained model with SB3's ``predict``.
    :param env: a :class:`LOBVecEnv` (its ``last_info_tensors`` give equity, position and trades).
    :param num_steps: vector steps (>= 2).
    :return: :func:`foxenv.metrics.summarize`'s dict (Sharpe, max drawdown, hit rate, action mix, ...).
    """
    from foxenv import metrics

    if num_steps < 2:
        raise ValueError(f"num_steps={num_steps} must be >= 2")
    n_envs, nvec = env.num_envs, [int(n) for n in env.action_space.nvec]
    step_pnl = np.zeros((num_steps, n_envs))
    positions = np.zeros((num_steps, n_envs))
    trade_pnl = np.zeros((num_steps, n_envs))
    trade_closed = np.zeros((num_steps, n_envs), dtype=bool)
    episode_starts = np.zeros((num_steps, n_envs), dtype=bool)
    actions = np.zeros((num_steps, n_envs, len(nvec)), dtype=np.int64)
    episode_rewards: list[float] = []
    previous_equity = np.zeros(n_envs)
    starting = np.ones(n_envs, dtype=bool)
    obs = env.reset()
    for t in range(num_steps):
        action, _ = model.predict(obs, deterministic=True)
        obs, _, done, infos = env.step(action)
        info = {k: v.detach().cpu().numpy() for k, v in env.last_info_tensors.items()}
        step_pnl[t] = info["equity"] - previous_equity
        positions[t] = info["position"]
        trade_pnl[t] = info["trade_pnl"]
        trade_closed[t] = info["trade_closed"]
        episode_starts[t] = starting
        actions[t] = action
        episode_rewards += [info_i["episode"]["r"] for info_i in infos if "episode" in info_i]
        previous_equity = np.where(done, 0.0, info["equity"])
        starting = done
    return metrics.summarize(
        step_pnl=step_pnl.T,
        positions=positions.T,
        trade_pnl=trade_pnl.T,
        trade_closed=trade_closed.T,
        episode_starts=episode_starts.T,
        actions=actions.transpose(1, 0, 2),
        episode_rewards=np.asarray(episode_rewards),
        nvec=nvec,
        branch_names=list(env.branch_names),
    )


def _print_summary(title: str, summary: dict[str, Any]) -> None:
    """Print a metrics dict, one ``key: value`` per line."""
    print(f"\n{title}")
    for key, value in summary.items():
        if isinstance(value, float):
            print(f"  {key:>22}: {value:.6g}")
        elif isinstance(value, dict):
            print(f"  {key:>22}:")
            for name, row in value.items():
                shown = [round(v, 3) for v in row] if isinstance(row, list) else row
                print(f"  {name:>24}  {shown}")
        else:
            print(f"  {key:>22}: {value}")


def _check_seed_and_device(args: argparse.Namespace) -> None:
    """``--seed`` in numpy's range, ``--device`` the CPU or an available CUDA device; else ``ValueError``."""
    if not 0 <= args.seed < 2**32:
        raise ValueError(f"--seed={args.seed} must lie in [0, 2**32)")
    try:
        device = th.device(args.device)
    except RuntimeError:
        raise ValueError(f"--device={args.device!r} must be cpu or cuda") from None
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"--device={args.device!r} must be cpu or cuda")
    if device.type == "cuda" and not th.cuda.is_available():
        raise ValueError(f"--device={args.device!r}: no CUDA device is available")


def train(args: argparse.Namespace) -> Path:
    """``foxhunt train``: train, save the run folder, evaluate.

    :param args: parsed command-line arguments.
    :return: the run folder.
    """
    from sb3_her_ext.algorithm import BranchingIQN
    from sb3_her_ext.plots import plot_training

    if args.steps < 1:
        raise ValueError(f"--steps={args.steps} must be >= 1")
    if args.n_envs < 1:
        raise ValueError(f"--n-envs={args.n_envs} must be >= 1")
    if args.eval_steps < 2:  # checked before training, not after it
        raise ValueError(f"--eval-steps={args.eval_steps} must be >= 2")
    _check_seed_and_device(args)
    on_cuda = th.device(args.device).type == "cuda"
    cuda_graph = on_cuda if args.cuda_graph is None else args.cuda_graph
    if cuda_graph and not on_cuda:
        raise ValueError(f"--cuda-graph needs --device cuda, got --device={args.device!r}")
    out = Path(args.out) if args.out else Path("runs") / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    eval_seed = args.seed + 1000
    model_kwargs = {
        **DEFAULT_MODEL_KWARGS,
        "learning_starts": min(DEFAULT_MODEL_KWARGS["learning_starts"], max(args.steps // 4, args.n_envs)),
        "diagnostics_interval": min(DEFAULT_MODEL_KWARGS["diagnostics_interval"], max(args.steps // 4, 1)),
    }
    config = {
        "command": "train", "data": args.data, "steps": args.steps, "n_envs": args.n_envs,
        "device": args.device, "cuda_graph": cuda_graph, "seed": args.seed, "threads": args.threads,
        "hindsight": args.hindsight, "eval_steps": args.eval_steps,
        "eval_data": "test split" if args.data != "synthetic" else f"synthetic, seed {eval_seed}",
        "model_kwargs": model_kwargs, "policy_kwargs": DEFAULT_POLICY_KWARGS,
        "env_kwargs": DEFAULT_ENV_KWARGS,
        "synthetic_market_steps": SYNTHETIC_MARKET_STEPS,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))

    env = _make_env(args.data, args.n_envs, args.device, args.seed, split="train")
    model = BranchingIQN(
        "MlpPolicy", env, seed=args.seed, device=args.device, hindsight=args.hindsight, cuda_graph=cuda_graph,
        policy_kwargs=dict(DEFAULT_POLICY_KWARGS), tensorboard_log=str(out / "tb"),
        diagnostics_path=str(out / "diagnostics.jsonl"), **model_kwargs,
    )
    model.learn(args.steps, progress_bar=args.progress)
    model.log_diagnostics()  # the last, partial interval
    model.save(out / "model.zip")
    plot_training(out / "diagnostics.jsonl", out / "training.png")

    eval_env = _make_env(args.data, args.n_envs, args.device, eval_seed, split="test")
    summary = evaluate_agent(model, eval_env, args.eval_steps)
    (out / "evaluation.json").write_text(json.dumps(summary, indent=2))
    _print_summary(f"evaluation: deterministic policy, {config['eval_data']}, {args.eval_steps} steps "
                   f"x {args.n_envs} books", summary)
    print(f"\nrun folder: {out}")
    return out


def rollout(args: argparse.Namespace) -> dict[str, Any]:
    """``foxhunt rollout``: a uniformly random policy, scored by foxenv.metrics.

    :param args: parsed command-line arguments.
    :return: the metrics printed.
    """
    from foxenv.rollout import random_rollout

    _check_seed_and_device(args)
    summary = random_rollout(
        num_steps=args.steps, num_envs=args.n_envs, data=args.data, seed=args.seed,
        device=args.device, progress=args.progress,
    )
    _print_summary(f"random rollout: {args.steps} steps x {args.n_envs} books on {args.data}", summary)
    return summary


def build_parser() -> argparse.ArgumentParser:
    """The ``foxhunt`` argument parser.

    :return: the parser with ``train`` and ``rollout`` subcommands.
    """
    parser = argparse.ArgumentParser(
        prog="foxhunt",
        description="Deep RL for limit-order-book trading: train BranchingIQN, or score a random policy.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{train,rollout}")

    def common(p: argparse.ArgumentParser, steps: int, n_envs: int) -> None:
        p.add_argument("--data", default="synthetic",
                       help="'synthetic' (built-in generator) or a LOBSTER folder (default: synthetic)")
        p.add_argument("--steps", type=int, default=steps, help=f"environment steps (default: {steps})")
        p.add_argument("--n-envs", type=int, default=n_envs,
                       help=f"books stepped together (default: {n_envs})")
        p.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
        p.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
        p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                       help="show a progress bar (default: on)")
        p.add_argument("--threads", type=int, default=1,
                       help="torch CPU threads (default: 1, fastest for these small networks)")

    train_parser = sub.add_parser(
        "train", help="train BranchingIQN and write a run folder",
        description="Train BranchingIQN on a LOB market; write model.zip, config.json, diagnostics.jsonl, "
        "TensorBoard logs and training.png to the run folder, then print an evaluation of the "
        "deterministic policy on held-out data (LOBSTER test split, or a synthetic market with another "
        "seed).",
    )
    common(train_parser, DEFAULT_TRAIN_STEPS, DEFAULT_N_ENVS)
    train_parser.add_argument("--out", default=None, help="run folder (default: runs/<timestamp>)")
    train_parser.add_argument("--hindsight", action=argparse.BooleanOptionalAction, default=True,
                              help="hindsight replay injections (default: on)")
    train_parser.add_argument("--eval-steps", type=int, default=500,
                              help="vector steps of the final evaluation (default: 500)")
    train_parser.add_argument("--cuda-graph", action=argparse.BooleanOptionalAction, default=None,
                              help="run each gradient step as one CUDA graph replay (BranchingIQN's "
                                   "cuda_graph=True); CUDA only (default: on with --device cuda)")
    rollout_parser = sub.add_parser(
        "rollout", help="score a uniformly random policy (foxenv.rollout.random_rollout)",
        description="Run a uniformly random policy on the vector env and print foxenv.metrics.",
    )
    common(rollout_parser, 2000, 16)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``foxhunt`` console script.

    :param argv: arguments (default: ``sys.argv[1:]``).
    :return: the exit status.
    """
    args = build_parser().parse_args(argv)
    if args.threads < 1:
        raise ValueError(f"--threads={args.threads} must be >= 1")
    th.set_num_threads(args.threads)
    if args.device.startswith("cuda") and not th.cuda.is_available():
        print(f"--device={args.device}: no CUDA device available", file=sys.stderr)
        return 2
    if args.command == "train":
        train(args)
    else:
        rollout(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
