"""Configuration of the batched book core: position limits, episode length, fees, reward and features."""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from foxenv.execution import DEFAULT_CHILD_SIZES, ExecutionGrid, check_execution_config
from foxenv.spec import DEFAULT_GRID, ActionGrid, action_grid

#: The maker fill models of :attr:`EnvConfig.fill_model` (see :func:`foxenv.matching.meet_flow`).
FILL_MODELS = ("conservative", "optimistic")


def _require_finite(name: str, value: Any) -> None:
    """A real number (not a bool), finite; else a ``ValueError`` naming ``name`` and the value."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{name}={value!r} must be a finite number")


def is_whole(value: Any) -> bool:
    """Whether ``value`` is a whole number: an int, or a finite float without a fraction (never raises).

    :param value: anything.
    :return: True for ``3``, ``np.int64(3)``, ``3.0``; False for ``3.5``, NaN, inf, strings, bools.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    return isinstance(value, numbers.Integral) or (math.isfinite(value) and float(value).is_integer())


@dataclass(frozen=True)
class EnvConfig:
    """Settings of :class:`foxenv.core.BatchedLOB`, validated on construction.

    :param max_position: largest absolute position, in lots (1 lot = 1 share); > 0.
    :param episode_length: steps before an episode is truncated; >= 1.
    :param levels: book levels per side in the observation; ``1 <= levels <= market.num_levels``
        (the upper bound is checked by ``BatchedLOB``, which knows the market).
    :param maker_fee_bps: fee on resting (LimitMaker) fills in basis points of notional; negative = rebate.
    :param taker_fee_bps: fee on Market and IoC fills in basis points of notional; >= 0.
    :param reward_scale: reward = change of equity * ``reward_scale`` (minus the inventory penalty); > 0.
    :param inventory_penalty: per-step penalty ``inventory_penalty * (position / max_position) ** 2``; >= 0.
    :param max_drawdown: terminate a book when its equity falls this far (currency) below its episode peak;
        ``None`` never terminates; > 0 otherwise.
    :param queue_power: exponent ``n`` of the ProbQueue cancellation split ``f(x) = x ** n``; >= 0.
    :param return_horizons: steps over which mid returns enter the observation; each >= 1.
    :param vol_window: steps of 1-step mid returns in the realized-volatility feature; >= 2.
    :param flow_window: steps summed in the signed trade-flow feature; >= 1.
    :param fill_model: how a resting LimitMaker order fills (:func:`foxenv.matching.meet_flow`):
        ``"conservative"`` (default) fills it only from volume the market traded at its price after the
        queue ahead, or through it (strictly beyond), and no more shares than that volume less the queue
        ahead; ``"optimistic"`` (the model before the simulator audit) fills the whole order on any trade
        through its price, whatever the volume.
    :param order_latency: steps a newly posted LimitMaker order waits before it rests in the book: it
        meets no flow during them, and joins the queue behind the size visible at its price when it
        arrives; 0 (default) rests it at once behind the size visible when it is posted; >= 0.
    :param action_grid: what the magnitude and urgency branches mean (:class:`foxenv.spec.ActionGrid`): a
        name (``"default"``: ``MultiDiscrete([3, 3, 3, 3])``; ``"wide"``: ``[3, 10, 3, 12]``, 1,080 joint
        codes), a mapping of the grid's fields, or a grid; held as the :class:`~foxenv.spec.ActionGrid`.
    :param task: ``"trade"`` (default: target positions, reward the change of equity) or ``"execute"``
        (work a parent order within ``episode_length`` steps, reward minus its shortfall in bps:
        :mod:`foxenv.execution`).
    :param exec_side: the execute task's parent side: ``"buy"``, ``"sell"`` or ``"both"`` (a fixed
        pseudo-random side per window start).
    :param exec_quantity: the parent quantity: shares (> 0), or with ``exec_quantity_unit="volume"`` a share
        in ``(0, 1]`` of the volume the window trades.
    :param exec_quantity_unit: ``"shares"`` or ``"volume"``.
    :param exec_child_sizes: the child sizes of the execute task's size branch, in TWAP slices
        (``exec_quantity / episode_length``), strictly increasing, each >= 0.
    """

    max_position: float = 100.0
    episode_length: int = 1000
    levels: int = 10
    maker_fee_bps: float = 0.0
    taker_fee_bps: float = 0.5
    reward_scale: float = 1.0
    inventory_penalty: float = 0.0
    max_drawdown: float | None = None
    queue_power: float = 2.0
    return_horizons: tuple[int, ...] = (1, 5, 20, 100)
    vol_window: int = 20
    flow_window: int = 10
    fill_model: str = "conservative"
    order_latency: int = 0
    action_grid: ActionGrid | str | Mapping[str, Any] = "default"
    task: str = "trade"
    exec_side: str = "both"
    exec_quantity: float = 100.0
    exec_quantity_unit: str = "shares"
    exec_child_sizes: tuple[float, ...] = DEFAULT_CHILD_SIZES

    def __post_init__(self) -> None:
        for name in (
            "max_position",
            "maker_fee_bps",
            "taker_fee_bps",
            "reward_scale",
            "inventory_penalty",
            "queue_power",
        ):
            _require_finite(name, getattr(self, name))
        if self.max_position <= 0:
            raise ValueError(f"max_position={self.max_position} must be > 0")
        if not is_whole(self.episode_length) or self.episode_length < 1:
            raise ValueError(f"episode_length={self.episode_length} must be an integer >= 1")
        if not is_whole(self.levels) or self.levels < 1:
            raise ValueError(f"levels={self.levels} must be an integer >= 1")
        if self.taker_fee_bps < 0:
            raise ValueError(f"taker_fee_bps={self.taker_fee_bps} must be >= 0 (takers never earn a rebate)")
        if self.reward_scale <= 0:
            raise ValueError(f"reward_scale={self.reward_scale} must be > 0")
        if self.inventory_penalty < 0:
            raise ValueError(f"inventory_penalty={self.inventory_penalty} must be >= 0")
        if self.max_drawdown is not None:
            _require_finite("max_drawdown", self.max_drawdown)
            if self.max_drawdown <= 0:
                raise ValueError(f"max_drawdown={self.max_drawdown} must be > 0 or None")
        if self.queue_power < 0:
            raise ValueError(f"queue_power={self.queue_power} must be >= 0")
        if isinstance(self.return_horizons, (str, bytes)) or not hasattr(self.return_horizons, "__len__"):
            raise ValueError(f"return_horizons={self.return_horizons!r} must be a sequence of integers >= 1")
        if len(self.return_horizons) == 0:
            raise ValueError(f"return_horizons={self.return_horizons} must name at least one horizon")
        for horizon in self.return_horizons:
            if not is_whole(horizon) or horizon < 1:
                raise ValueError(
                    f"return_horizons={self.return_horizons} must hold integers >= 1, got {horizon}"
                )
        if not is_whole(self.vol_window) or self.vol_window < 2:
            raise ValueError(f"vol_window={self.vol_window} must be an integer >= 2")
        if not is_whole(self.flow_window) or self.flow_window < 1:
            raise ValueError(f"flow_window={self.flow_window} must be an integer >= 1")
        if self.fill_model not in FILL_MODELS:
            raise ValueError(f"fill_model={self.fill_model!r} must be one of {FILL_MODELS}")
        if not is_whole(self.order_latency) or self.order_latency < 0:
            raise ValueError(f"order_latency={self.order_latency!r} must be an integer >= 0")
        object.__setattr__(self, "action_grid", action_grid(self.action_grid))
        check_execution_config(self)
        object.__setattr__(self, "exec_child_sizes", tuple(float(s) for s in self.exec_child_sizes))

    @property
    def grid(self) -> ActionGrid:
        """The action grid (:attr:`action_grid`, typed); on the execute task its
        :class:`~foxenv.execution.ExecutionGrid`, which answers the same questions."""
        assert isinstance(self.action_grid, ActionGrid)
        if self.task == "execute":
            return ExecutionGrid(self.action_grid, self.exec_child_sizes)  # type: ignore[return-value]
        return self.action_grid


def config_settings(config: EnvConfig) -> dict[str, Any]:
    """A config's fields as JSON-able values, as fingerprints and reports record them: the action grid as its
    fields, and left out when it is the default one (so a default config records what it did before grids).

    :param config: the config.
    :return: ``{field: value}``.
    """
    settings = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    grid = settings.pop("action_grid")
    if grid != DEFAULT_GRID:
        settings["action_grid"] = grid.to_dict()
    if config.task == "trade":  # a trading config records what it did before the execute task
        for name in ("task", "exec_side", "exec_quantity", "exec_quantity_unit", "exec_child_sizes"):
            settings.pop(name)
    return settings


def split_env_kwargs(env_kwargs: Mapping[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split a run's env kwargs into :class:`EnvConfig` fields and market options.

    :param env_kwargs: a run's ``resolved_env_kwargs()`` (or any mix of the two).
    :return: ``(config fields, market options)``; ``market_seed`` stays among the market options.
    """
    fields = {f.name for f in dataclasses.fields(EnvConfig)}
    env_kwargs = dict(env_kwargs or {})
    config = {k: v for k, v in env_kwargs.items() if k in fields}
    market = {k: v for k, v in env_kwargs.items() if k not in fields}
    return config, market
