"""Evaluation of trained agents and baselines: one recorder, metrics with units, reports and plots.

:func:`evaluate` scores one model or baseline; :func:`evaluate_policies` scores several on the same books
and episode windows and compares each model with each baseline; ``foxhunt evaluate`` writes the report.
"""

from foxhunt.evaluation.api import Evaluation, EvaluationResult, build_market, evaluate, evaluate_policies

__all__ = ["Evaluation", "EvaluationResult", "build_market", "evaluate", "evaluate_policies"]
