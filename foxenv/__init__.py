"""foxenv: a batched PyTorch limit-order-book trading environment, exposed through Gymnasium.

- :class:`BatchedLOB` steps ``B`` books at once on CPU or GPU (the core; tensors in and out).
- :class:`LOBEnv` is one book as a ``gymnasium.Env`` (``gymnasium.make("foxenv/LOB-v0")``).
- :class:`LOBVectorEnv` / :func:`make_vec` is a ``gymnasium.vector.VectorEnv`` over the core
  (``gymnasium.make_vec("foxenv/LOB-v0", num_envs=N)``), optionally with torch tensors in and out.
- :func:`make_core` builds the core from a data source and settings: every face builds through it.
- :func:`load_market` reads LOBSTER files or generates a synthetic market (:class:`MarketData`).
- :mod:`foxenv.spec` is the action and info contract (branch names, nvec, magnitudes, info keys).
- :mod:`foxenv.metrics` defines every metric once, with its unit (Sharpe, Sortino, drawdown, turnover,
  hit rate, action mix with labels).

Attributes are imported lazily, so ``import foxenv`` only registers the Gymnasium id.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

import gymnasium

if TYPE_CHECKING:
    from foxenv import metrics, spec
    from foxenv.config import EnvConfig
    from foxenv.core import BatchedLOB
    from foxenv.data import load_market
    from foxenv.data.market import MarketData
    from foxenv.factory import make_core
    from foxenv.gym_env import LOBEnv
    from foxenv.vector_env import LOBVectorEnv, make_vec

ENV_ID = "foxenv/LOB-v0"

__all__ = [
    "ENV_ID",
    "BatchedLOB",
    "EnvConfig",
    "LOBEnv",
    "LOBVectorEnv",
    "MarketData",
    "load_market",
    "make_core",
    "make_vec",
    "metrics",
    "spec",
]

#: Where each lazily imported public name lives.
_LAZY = {
    "EnvConfig": "foxenv.config",
    "BatchedLOB": "foxenv.core",
    "LOBEnv": "foxenv.gym_env",
    "LOBVectorEnv": "foxenv.vector_env",
    "make_core": "foxenv.factory",
    "make_vec": "foxenv.vector_env",
    "load_market": "foxenv.data",
    "MarketData": "foxenv.data.market",
}


def __getattr__(name: str) -> Any:
    """Import a public name on first use.

    :param name: the attribute asked for.
    :return: the class, function or module.
    """
    if name in ("metrics", "spec"):
        return importlib.import_module(f"foxenv.{name}")
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'foxenv' has no attribute {name!r}")


if ENV_ID not in gymnasium.registry:
    gymnasium.register(
        id=ENV_ID,
        entry_point="foxenv.gym_env:LOBEnv",
        vector_entry_point="foxenv.vector_env:LOBVectorEnv",
    )
