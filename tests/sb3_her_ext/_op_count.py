"""Counting the ops a call runs (each non-view aten or cuda_ext op is about one GPU kernel of a vector step),
so that tests can bound them and catch a regression."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

#: ops that only make views (no kernel)
VIEW_OPS = frozenset({
    "view", "_unsafe_view", "expand", "slice", "select", "unsqueeze", "squeeze", "t", "transpose", "permute",
    "alias", "as_strided", "detach", "reshape", "unbind", "split", "lift_fresh",
})


class OpCount(TorchDispatchMode):
    """The non-view ops dispatched inside the ``with`` block, in order (:attr:`ops`)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        name = func.overloadpacket.__name__
        if name not in VIEW_OPS:
            self.ops.append(name)
        return func(*args, **(kwargs or {}))


def ops_of(call: Callable[[], Any]) -> list[str]:
    """The non-view ops ``call()`` runs.

    :param call: the call (its arguments made beforehand).
    :return: their names, in order.
    """
    with OpCount() as count:
        call()
    return count.ops
