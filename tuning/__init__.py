"""Optuna studies over BranchingIQN: ``foxhunt tune``.

A study is a search space (:mod:`tuning.space`, fitted and checked before the first trial by
:mod:`tuning.preflight`), an objective (:mod:`tuning.objective`: a :class:`foxhunt.runs.RunConfig` per
trial, trained by :func:`foxhunt.runs.train`, scored on held-out data by :mod:`tuning.evaluation`) and a
storage (:mod:`tuning.study`: an SQLite file in the study folder by default, any SQLAlchemy URL such as
PostgreSQL for many workers, launched together by :mod:`tuning.workers`).

::

    foxhunt tune --n-trials 30 --steps 5000                   # writes studies/foxhunt/
    foxhunt tune --n-trials 10 --resume                       # ten more trials of the same study
    foxhunt tune --space space.yaml --metric pnl --pruner hyperband --sampler random
    foxhunt tune --storage postgresql://host/db --resume --n-workers auto  # a worker per visible GPU
    foxhunt train --config studies/foxhunt/best_config.json   # the best trial's run again

Failure semantics: a trial whose worker dies is re-run by another worker (heartbeats); a trial that
raises is marked FAIL and not re-run; see :mod:`tuning.study`.
"""
