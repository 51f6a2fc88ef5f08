"""Evaluation of trained agents and baselines: one recorder, metrics with units, reports and plots.

:func:`evaluate` scores one model or baseline; :func:`evaluate_policies` scores several on the same books
and episode windows and compares each model with each baseline; ``foxhunt evaluate`` writes the report. The
API is imported on first use, so the command line is parsed before torch loads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from foxhunt.evaluation.api import Evaluation, EvaluationResult, build_market, evaluate, evaluate_policies

__all__ = ["Evaluation", "EvaluationResult", "build_market", "evaluate", "evaluate_policies"]


def __getattr__(name: str) -> Any:
    """The API's names, imported on first use (``foxhunt evaluate``'s parser loads no torch)."""
    if name in __all__:
        from foxhunt.evaluation import api

        return getattr(api, name)
    raise AttributeError(f"module 'foxhunt.evaluation' has no attribute {name!r}")
