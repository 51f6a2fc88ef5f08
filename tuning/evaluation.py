"""The one place where tuning scores a policy on held-out data.

A trial's intermediate values come from :func:`held_out_metrics`, on the same held-out data as the final
evaluation that :func:`foxhunt.runs.train` writes to ``evaluation.json`` (the trial's value), so tuned
and reported numbers mean the same thing: the run's ``eval_split``, the validation data in a study. The
scoring lives in :mod:`foxhunt.held_out`, where ``foxhunt train --eval-freq`` scores too.
"""

from __future__ import annotations

from foxhunt.held_out import isolated_rng
from foxhunt.runs import held_out_metrics

__all__ = ["held_out_metrics", "isolated_rng"]
