"""The single-book Gymnasium environment: one book of the batched core, numpy in and out.

``gymnasium.make("foxenv/LOB-v0", data="synthetic")`` builds a :class:`LOBEnv`. It owns a
:class:`~foxenv.core.BatchedLOB` with one book on the CPU and converts at the boundary only:
the action is checked on numpy and goes in with ``torch.from_numpy``, the observation comes out as a
float32 array and the info as Python scalars. ``compile=True`` steps the core through ``torch.compile``,
with every output packed into one vector inside the compiled step (:class:`PackedStep`).
:func:`make_core` is the shared factory that the vector env uses too.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import types
from collections import deque
from collections.abc import Callable
from os import PathLike
from typing import Any

import gymnasium
import numpy as np
import torch
from gymnasium import spaces

from foxenv.config import EnvConfig
from foxenv.core import BatchedLOB
from foxenv.data.market import MarketData
from foxenv.spec import ACTION_NVEC, check_actions

#: What ``data=`` may be: ``"synthetic"``, a LOBSTER folder, a ``(message, orderbook)`` file pair,
#: or an already loaded :class:`MarketData`.
DataSource = str | PathLike | tuple[str | PathLike, str | PathLike] | MarketData

#: Keyword arguments that go to :func:`foxenv.data.load_market` (``levels`` goes to both;
#: ``market_seed`` is its ``seed``, the synthetic generator's seed, 0 by default).
MARKET_KWARGS = (
    "step_events", "step_seconds", "split", "train_fraction", "num_steps", "cache_dir", "market_seed"
)

#: The shape of one action.
_ACTION_SHAPE = (len(ACTION_NVEC),)

#: Steps of mid history kept for rendering.
RENDER_HISTORY = 200

#: Inductor options of the compiled single-book step (:meth:`PackedStep.compile`): C++ glue between the
#: generated kernels (as ``BatchedLOB.enable_compile`` on a CPU), and the packing ``cat`` of ~25 pieces
#: computed in the kernel that makes them (on a CPU inductor otherwise gives every piece a view of the
#: output buffer: a tensor handle each per call).
COMPILE_OPTIONS: dict[str, Any] = {"cpp_wrapper": True, "force_pointwise_cat": True}

#: Numbers the code objects of the compiled packed steps (:meth:`PackedStep.compile`).
_compiled_step_ids = itertools.count()
#: The code object of the compiled packed steps, by what their graph is specialised on
#: (:func:`compiled_step_key`): envs whose cores agree on it share one code object, so one compiled graph.
_compiled_step_codes: dict[tuple[Any, ...], types.CodeType] = {}


def compiled_step_key(core: BatchedLOB) -> tuple[Any, ...]:
    """Everything of a core that its compiled packed step can bake into the graph, so two cores with the
    same key can run one graph: the config, every Python scalar the core holds (tick size, levels, fee
    rates, ...), and the shape, strides, dtype and device of every tensor it holds (with the value of a
    0-dim one, on which ``torch.compile`` may specialise). Tensor values are graph inputs, read on every
    call, so cores on different markets of one shape share a graph.

    :param core: the core.
    :return: a hashable key.
    """
    key: list[Any] = [type(core), core.config]
    for name, value in sorted(vars(core).items()):
        for item in value if isinstance(value, tuple) else (value,):
            if isinstance(item, torch.Tensor):
                scalar = item.item() if item.dim() == 0 else None
                key.append((name, tuple(item.shape), item.stride(), item.dtype, str(item.device), scalar))
            elif isinstance(item, bool | int | float | str):
                key.append((name, item))
    return tuple(key)


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
    env_config, market_kwargs = split_env_kwargs(config, kwargs)
    if isinstance(data, MarketData):
        if market_kwargs:
            raise ValueError(
                f"market options {sorted(market_kwargs)} cannot apply to an already loaded MarketData"
            )
        market = data.to(device)
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
    :return: ``MultiDiscrete(spec.ACTION_NVEC)``, int64.
    """
    return spaces.MultiDiscrete(np.array(ACTION_NVEC, dtype=np.int64))


#: The result of one single-book step: observation, reward, terminated, truncated, info.
StepResult = tuple[np.ndarray, float, bool, bool, dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class PackedStep:
    """A one-book core step whose outputs come back as ONE float64 vector, and how to unpack it.

    At one book a compiled step's cost is mostly per tensor crossing the compiled boundary, not
    arithmetic; packing the observation, reward, flags and the ~18 info scalars into one vector inside the
    compiled function, then unpacking it on the host with one ``tolist()``, made ``env.step`` 10-26%
    faster than ``BatchedLOB.enable_compile`` plus one ``item()`` per info key (medians and best blocks
    of interleaved runs on a busy 2-core CPU). Every value is exact in float64 (float32 observations and
    reward, 0/1 flags, integer step counts below 2**53), so unpacking gives back the core's values bit
    for bit. The step is ``BatchedLOB._advance``, the step on a validated action that
    ``BatchedLOB.enable_compile`` compiles.

    :param step: ``step(action [1, 4] int64) -> [D + 3 + len(info_keys)] float64``: obs, reward,
        terminated, truncated, then the info values in ``info_keys`` order.
    :param observation_dim: ``D``.
    :param info_keys: the core's info keys, in the order packed.
    :param info_casts: ``(key, bool or int)`` for the info values that are not floats.
    """

    step: Callable[[torch.Tensor], torch.Tensor]
    observation_dim: int
    info_keys: tuple[str, ...]
    info_casts: tuple[tuple[str, type], ...]

    @classmethod
    def of(cls, core: BatchedLOB) -> PackedStep:
        """The packed (not yet compiled) step of a one-book core. Learns the info's keys and types from
        one eager step, after which the core's state is restored.

        :param core: the core, ``num_books == 1``, reset (so a step is valid).
        :return: the packed step.
        """
        if core.num_books != 1:
            raise ValueError(f"num_books={core.num_books}: a packed step is for one book")
        saved = core.state_dict()
        info = core._advance(torch.ones(1, len(ACTION_NVEC), dtype=torch.int64, device=core.device))[4]
        core.load_state_dict(saved)
        casts = tuple(
            (key, bool if value.dtype == torch.bool else int)
            for key, value in info.items()
            if not value.dtype.is_floating_point
        )

        def packed_step(action: torch.Tensor) -> torch.Tensor:
            obs, reward, terminated, truncated, info = core._advance(action)
            values = (obs[0], reward, terminated, truncated, *info.values())
            return torch.cat([value.double() for value in values])

        return cls(packed_step, core.observation_dim, tuple(info), casts)

    def compile(self, core: BatchedLOB) -> PackedStep:
        """This packed step through ``torch.compile``, with a code object shared only by the steps of
        cores with the same :func:`compiled_step_key`, and no guards; compiled now.

        ``torch.compile`` keeps its compiled graphs per code object and checks ~50 guards on every call
        before it picks one (the core's tensors' shapes, dtypes and strides, its config's values, the
        globals the step reads). At one book those checks cost about as much as the fused kernels. Here
        they can never fail: the step is a closure over ONE core, whose tables and config do not change
        after it is built (``EnvConfig`` is frozen), whose state keeps its shapes and dtypes (``reset``,
        the step and ``load_state_dict``, which checks them, all keep them), and whose action is always
        the ``[1, 4]`` int64 row ``LOBEnv.step`` builds; the generated code still asserts every input's
        size and stride on each call. What makes this safe is the code object per key: with one for all,
        every env's packed step would share one cache, and a second env with another config, fee or
        market shape would run the first env's graph unchecked. With it, envs that differ in anything
        the graph is specialised on trace graphs of their own (about 0.5 s when the inductor cache already
        holds the kernels), and no cache entries accumulate on one code object, so no env hits
        ``torch.compile``'s recompile limit. Envs with the same key share the graph: it reads the core of
        the calling env's closure, like any function that reads its arguments.

        With no guards the compiled code is never traced again, so what ``dynamic=False`` and
        ``fullgraph=True`` ask for is set once, around the compiling call (static shapes; a graph break
        is an error): passed to ``torch.compile`` they would patch dynamo's config and check the graph
        count on every call, which cost about 15 us per step here.

        :param core: the core :meth:`of` made this packed step for; the compiling call steps it once and
            restores its state.
        :return: the packed step with :attr:`step` compiled (:data:`COMPILE_OPTIONS`).
        """
        function = self.step
        key = compiled_step_key(core)
        if key not in _compiled_step_codes:
            name = f"{function.__name__}_{next(_compiled_step_ids)}"
            _compiled_step_codes[key] = function.__code__.replace(co_name=name, co_qualname=name)
        code = _compiled_step_codes[key]
        own = types.FunctionType(code, function.__globals__, code.co_name, closure=function.__closure__)
        options = {**COMPILE_OPTIONS, "guard_filter_fn": torch.compiler.skip_all_guards_unsafe}
        compiled = torch.compile(own, options=options)
        saved = core.state_dict()
        static = torch._dynamo.config.patch(automatic_dynamic_shapes=False, assume_static_by_default=True)
        with static, torch._dynamo.error_on_graph_break(True):
            compiled(torch.ones(1, len(ACTION_NVEC), dtype=torch.int64, device=core.device))
        core.load_state_dict(saved)
        return dataclasses.replace(self, step=compiled)

    def unpack(self, packed: torch.Tensor) -> StepResult:
        """Gymnasium's step result from a packed vector.

        :param packed: what :attr:`step` returned (on the CPU).
        :return: observation (float32 array), reward, terminated, truncated, info (Python scalars).
        """
        values = packed.numpy()
        dim = self.observation_dim
        scalars = values[dim:].tolist()
        info = dict(zip(self.info_keys, scalars[3:], strict=True))
        for key, cast in self.info_casts:
            info[key] = cast(info[key])
        return values[:dim].astype(np.float32), scalars[0], scalars[1] != 0.0, scalars[2] != 0.0, info


class LOBEnv(gymnasium.Env[np.ndarray, np.ndarray]):
    """One limit-order book as a Gymnasium environment (the batched core with ``B = 1`` on the CPU).

    Action: ``MultiDiscrete(spec.ACTION_NVEC)`` = ``spec.BRANCH_NAMES`` (direction, magnitude, order,
    urgency), see :mod:`foxenv.spec`. Observation: ``Box(-inf, inf, (D,), float32)``, the first
    ``n_market_features`` entries are market features, the rest portfolio features. Info after a step:
    ``spec.INFO_KEYS`` as Python scalars. ``reset`` returns an empty info.

    A step is bound by per-op overhead at one book: the eager core runs ~200 tiny tensor ops (about
    1e3 steps/s on one CPU core), the compiled one two fused kernels (about 1e4 steps/s). The env
    checks the action on numpy and the episode end on a Python counter, so the core skips its own checks
    (which would copy the action and the step counter out of tensors every step). ``env.compiled`` says
    whether the step is compiled.

    :param data: ``"synthetic"``, a LOBSTER folder, a ``(message, orderbook)`` pair, or a :class:`MarketData`.
    :param render_mode: ``None`` or ``"rgb_array"`` (a picture of the book, see :mod:`foxenv.render`).
    :param seed: seed of the core (episode start offsets); ``reset(seed=...)`` reseeds. The market does
        not depend on it (``market_seed=`` picks the synthetic market).
    :param config: base :class:`EnvConfig`; keyword arguments naming its fields override it.
    :param compile: step through ``torch.compile`` (opt-in): the core's step, the function
        :meth:`BatchedLOB.enable_compile` compiles, fused with the packing of all its outputs into one
        vector (:class:`PackedStep`); ``env.core.step`` itself stays eager. Needs a C++ compiler. The
        env compiles while it is built: about 25 s with a cold inductor cache and 3 s with a warm one
        (measured on a busy 2-core x86 machine); a further env in the process with the same config and
        market shape reuses the compiled step (0.04 s), one that differs traces its own (about 0.5 s
        when the cache holds its kernels, see :meth:`PackedStep.compile`). Steps are about 10x faster
        than eager. Floats may differ from the eager step in the last bits (a fused
        multiply-add). Off by default: a single-book env is often built for a short run, an env check or
        a test, where the compile would cost more than it saves.
    :param kwargs: :class:`EnvConfig` fields and ``load_market`` options, see :func:`make_core`.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(
        self,
        data: DataSource = "synthetic",
        render_mode: str | None = None,
        seed: int | None = None,
        config: EnvConfig | None = None,
        compile: bool = False,
        **kwargs: Any,
    ) -> None:
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            modes = self.metadata["render_modes"]
            raise ValueError(f"render_mode={render_mode!r} must be None or one of {modes}")
        if not isinstance(compile, bool):
            raise ValueError(f"compile={compile!r} must be True or False")
        self.render_mode = render_mode
        # The env checks actions and the episode end itself (on numpy and a Python int, see step).
        self.core = make_core(
            data, 1, device="cpu", seed=seed, config=config, validate_actions=False, **kwargs
        )
        #: The compiled packed step (``compile=True``), else None (the eager core's step).
        self._packed_step: PackedStep | None = None
        if compile:
            self._packed_step = PackedStep.of(self.core).compile(self.core)
        self.compiled = compile
        self.config: EnvConfig = self.core.config
        self.market: MarketData = self.core.market
        self.n_market_features: int = int(self.core.n_market_features)
        self.observation_space = observation_space_of(self.core)
        self.action_space = action_space_of(self.core)
        #: Steps taken in this episode (the core's step counter, kept on the host to check the end).
        self._episode_step = 0
        self._mids: deque[float] = deque(maxlen=RENDER_HISTORY)
        self._last_info: dict[str, Any] = {}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Start a new episode.

        :param seed: reseeds the core (and ``np_random``) when given.
        :param options: unused.
        :return: the first observation and an empty info.
        """
        super().reset(seed=seed)
        obs = self.core.reset(seed=seed)
        self._episode_step = 0
        self._mids.clear()
        self._last_info = {}
        return obs.numpy()[0].copy(), {}

    def check_action(self, action: Any) -> np.ndarray:
        """Check one action's shape, dtype and range (:func:`foxenv.spec.check_actions`).

        :param action: anything array-like of 4 integers, each in ``[0, nvec)``.
        :return: the action as a contiguous int64 array of shape ``(4,)``.
        :raises ValueError: naming the action, when its shape, dtype or a value is wrong.
        """
        if isinstance(action, torch.Tensor):
            action = action.numpy(force=True)
        return check_actions(action, _ACTION_SHAPE)

    def step(self, action: Any) -> StepResult:
        """Advance the book by one step.

        :param action: ``[direction, magnitude, order, urgency]`` integers.
        :return: observation, reward, terminated, truncated, info (Python scalars).
        :raises ValueError: on a bad action, or a step after the episode was truncated (reset first).
        """
        action_row = torch.from_numpy(self.check_action(action).reshape(1, -1))  # numpy's reshape is cheaper
        if self._episode_step >= self.config.episode_length:
            raise ValueError(
                f"step={self._episode_step} >= episode_length={self.config.episode_length}: "
                "the episode is over, call reset() before stepping again"
            )
        if self._packed_step is not None:
            result = self._packed_step.unpack(self._packed_step.step(action_row))
        else:  # eager: one item() per value (cheaper than packing mixed dtypes with eager ops)
            obs, reward, terminated, truncated, core_info = self.core.step(action_row)
            info = {key: value.item() for key, value in core_info.items()}
            result = obs.numpy()[0].copy(), reward.item(), terminated.item(), truncated.item(), info
        info = result[4]
        self._episode_step = info["step"]
        if self.render_mode is not None:
            self._mids.append(info["mid"])
            self._last_info = info
        return result

    def render(self) -> np.ndarray | None:
        """Draw the book, the agent's resting order, its position and the recent mid path.

        :return: an ``H x W x 3`` uint8 image in ``"rgb_array"`` mode, else ``None``.
        """
        if self.render_mode is None:
            return None
        from foxenv.render import render_core_book

        return render_core_book(self.core, 0, list(self._mids), self._last_info)
