"""The one factory of foxenv's faces: a market (synthetic, LOBSTER or loaded) and settings in, a
:class:`~foxenv.core.BatchedLOB` out. :class:`~foxenv.gym_env.LOBEnv`,
:class:`~foxenv.vector_env.LOBVectorEnv` and the application's SB3 env all build their core through
:func:`make_core`, so they read the same keywords the same way.
"""

from __future__ import annotations

import dataclasses
import functools
from os import PathLike
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from foxenv.checks import check_device, check_seed
from foxenv.config import EnvConfig
from foxenv.core import BatchedLOB
from foxenv.data.market import MarketData
from foxenv.data.synthetic import WAVE_KNOBS

#: What ``data=`` may be: ``"synthetic"``, a LOBSTER folder, a ``(message, orderbook)`` file pair,
#: or an already loaded :class:`MarketData`.
DataSource = str | PathLike | tuple[str | PathLike, str | PathLike] | MarketData

#: Keyword arguments that go to :func:`foxenv.data.load_market` (``levels`` goes to both;
#: ``market_seed`` is its ``seed``, the synthetic generator's seed, 0 by default).
MARKET_KWARGS = (
    "step_events", "step_seconds", "split", "train_fraction", "validation_fraction", "split_times", "days",
    "num_steps", "cache_dir", "market_seed", "price_band", "tick_size", "signal_strength", "signal_horizon",
    *WAVE_KNOBS,
)


def split_env_kwargs(
    config: EnvConfig | None, kwargs: dict[str, Any]
) -> tuple[EnvConfig, dict[str, Any]]:
    """Sort keyword arguments into the env config and the market loader's options.

    :param config: a base config (``None``: the defaults); config keywords override its fields.
    :param kwargs: any mix of :class:`EnvConfig` field names and :data:`MARKET_KWARGS`.
    :return: the final config and the keyword arguments for ``load_market``.
    """
    config_names = {field.name for field in dataclasses.fields(EnvConfig)}
    config_kwargs: dict[str, Any] = {}
    market_kwargs: dict[str, Any] = {}
    for key, value in kwargs.items():
        if key in config_names:
            config_kwargs[key] = value
        elif key == "market_seed":
            market_kwargs["seed"] = value
        elif key in MARKET_KWARGS:
            market_kwargs[key] = value
        else:
            raise ValueError(
                f"{key}={value!r} is neither an EnvConfig field {sorted(config_names)} "
                f"nor a load_market option {list(MARKET_KWARGS)}"
            )
    if config is not None and not isinstance(config, EnvConfig):
        raise ValueError(f"config={config!r} must be an EnvConfig or None")
    base = config if config is not None else EnvConfig()
    return dataclasses.replace(base, **config_kwargs), market_kwargs


@functools.lru_cache(maxsize=4)
def _cached_synthetic_market(
    levels: int, seed: int, market_kwargs: tuple[tuple[str, Any], ...]
) -> MarketData:
    """Generate a synthetic market on the CPU once per process for each set of arguments.

    :param levels: book levels per side.
    :param seed: the generator's seed.
    :param market_kwargs: the other ``load_market`` options, as sorted ``(name, value)`` pairs.
    :return: the (immutable) market, shared by every env built with the same arguments.
    """
    from foxenv.data import load_market

    return load_market("synthetic", levels=levels, seed=seed, device="cpu", **dict(market_kwargs))


def make_core(
    data: DataSource = "synthetic",
    num_books: int = 1,
    *,
    device: torch.device | str = "cpu",
    seed: int | None = None,
    config: EnvConfig | None = None,
    validate_actions: bool | None = None,
    **kwargs: Any,
) -> BatchedLOB:
    """Load a market and build the batched book core over it.

    :param data: ``"synthetic"``, a LOBSTER folder, a ``(message, orderbook)`` pair of files, or a
        loaded :class:`MarketData` (then no market keywords may be given).
    :param num_books: number of books ``B``.
    :param device: device of the core (and of the loaded market). A synthetic market is generated once
        per process for each set of arguments and shared (markets are never modified).
    :param seed: seeds the core (the books' episode start offsets); it does not change the market, so
        envs with different seeds see the same data (``market_seed`` picks another synthetic market).
    :param config: base env config; keyword arguments naming its fields override it.
    :param validate_actions: let the core check action ranges (a host sync); ``None``: on the CPU only.
    :param kwargs: :class:`EnvConfig` fields and :func:`~foxenv.data.load_market` options
        (``step_events``, ``step_seconds``, ``split``, ``train_fraction``, ``num_steps``, ``cache_dir``,
        ``market_seed``).
    :return: the core, not yet reset.
    """
    device = check_device(device)
    seed = check_seed(seed)
    env_config, market_kwargs = split_env_kwargs(config, kwargs)
    if "seed" in market_kwargs:  # market_seed
        check_seed(market_kwargs["seed"], "market_seed", optional=False)
    if isinstance(data, MarketData):
        if market_kwargs:
            given = ", ".join(
                f"{'market_seed' if key == 'seed' else key}={value!r}" for key, value in market_kwargs.items()
            )
            raise ValueError(f"market options {given} cannot apply to an already loaded MarketData")
        market = data.to(device)
    elif not isinstance(data, str | PathLike | tuple):
        raise ValueError(
            f"data={data!r} must be 'synthetic', a LOBSTER folder, a (message, orderbook) pair "
            "or a MarketData"
        )
    elif isinstance(data, str) and data == "synthetic":
        market_seed = market_kwargs.pop("seed", 0)
        options = tuple(sorted(market_kwargs.items()))
        market = _cached_synthetic_market(env_config.levels, market_seed, options).to(device)
    else:
        from foxenv.data import load_market

        market = load_market(data, levels=env_config.levels, device=device, **market_kwargs)
    return BatchedLOB(
        market, num_books, config=env_config, device=device, seed=seed, validate_actions=validate_actions
    )


def observation_space_of(core: BatchedLOB) -> spaces.Box:
    """The single-book observation space of a core.

    :param core: the batched core.
    :return: ``Box(-inf, inf, (observation_dim,), float32)``.
    """
    return spaces.Box(-np.inf, np.inf, shape=(core.observation_dim,), dtype=np.float32)


def action_space_of(core: BatchedLOB) -> spaces.MultiDiscrete:
    """The single-book action space of a core.

    :param core: the batched core.
    :return: ``MultiDiscrete`` of its grid's ``nvec`` (``spec.ACTION_NVEC`` on the default grid), int64.
    """
    return spaces.MultiDiscrete(np.array(core.ACTION_NVEC, dtype=np.int64))
