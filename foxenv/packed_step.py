"""The single-book step packed into one vector, and compiled once per kind of core.

:class:`PackedStep` fuses the core's step with the packing of all its outputs into one float64 vector
(one host transfer and one ``tolist()`` per step at one book); :meth:`PackedStep.compile` compiles it
with ``torch.compile``, one code object per :func:`compiled_step_key`. :class:`~foxenv.gym_env.LOBEnv`
uses it for ``compile=True``.
"""

from __future__ import annotations

import dataclasses
import itertools
import types
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from foxenv.core import BatchedLOB
from foxenv.spec import ACTION_NVEC

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
    same key can run one graph: the config, every Python scalar the core and its tables hold (tick size,
    levels, fee rates, ...), and the shape, strides, dtype and device of every tensor they hold (with the
    value of a 0-dim one, on which ``torch.compile`` may specialise). Tensor values are graph inputs,
    read on every call, so cores on different markets of one shape share a graph.

    :param core: the core.
    :return: a hashable key.
    """
    key: list[Any] = [type(core), core.config]
    # the core's own attributes and those of the tables it holds (a dataclass of tensors and scalars)
    named = sorted(vars(core).items())
    for owner, value in list(named):
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            fields = dataclasses.fields(value)
            named += [(f"{owner}.{field.name}", getattr(value, field.name)) for field in fields]
    for name, value in named:
        for item in value if isinstance(value, tuple) else (value,):
            if isinstance(item, torch.Tensor):
                scalar = item.item() if item.dim() == 0 else None
                key.append((name, tuple(item.shape), item.stride(), item.dtype, str(item.device), scalar))
            elif isinstance(item, bool | int | float | str):
                key.append((name, item))
    return tuple(key)


#: The result of one single-book step: observation, reward, terminated, truncated, info.
StepResult = tuple[np.ndarray, float, bool, bool, dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class PackedStep:
    """A one-book core step whose outputs come back as ONE float64 vector, and how to unpack it.

    At one book a compiled step's cost is mostly per tensor crossing the compiled boundary, not
    arithmetic; packing the observation, reward, flags and the ~18 info scalars into one vector inside the
    compiled function, then unpacking it on the host with one ``tolist()``, costs less than one
    ``item()`` per output (``benchmarks/RESULTS.md``). Every value is exact in float64 (float32
    observations and reward, 0/1 flags, integer step counts below 2**53), so unpacking gives back the
    core's values bit for bit. The step is ``BatchedLOB._advance``, the step on a validated action that
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
        globals the step reads). At one book those checks cost as much as the fused kernels. Here
        they can never fail: the step is a closure over ONE core, whose tables and config do not change
        after it is built (``EnvConfig`` is frozen), whose state keeps its shapes and dtypes (``reset``,
        the step and ``load_state_dict``, which checks them, all keep them), and whose action is always
        the ``[1, 4]`` int64 row ``LOBEnv.step`` builds; the generated code still asserts every input's
        size and stride on each call. What makes this safe is the code object per key: with one for all,
        every env's packed step would share one cache, and a second env with another config, fee or
        market shape would run the first env's graph unchecked. With it, envs that differ in anything
        the graph is specialised on trace graphs of their own, and no cache entries accumulate on one
        code object, so no env hits ``torch.compile``'s recompile limit. Envs with the same key share the
        graph: it reads the core of the calling env's closure, like any function that reads its arguments.

        With no guards the compiled code is never traced again, so what ``dynamic=False`` and
        ``fullgraph=True`` ask for is set once, around the compiling call (static shapes; a graph break
        is an error): passed to ``torch.compile`` they would patch dynamo's config and check the graph
        count on every call, a cost paid on every step.

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
