"""Names the ``foxhunt evaluate`` parser offers, in a module that imports nothing heavy (no torch), so the
command line is built and checked before the evaluation's libraries load."""

#: Names of the built-in baselines (:func:`foxhunt.evaluation.baselines.make_baseline`).
BASELINES = ("flat", "random", "buy_and_hold", "oracle", "imbalance", "market_maker")
#: Baselines that read the same signal as the agent (the imbalance rule is fitted on the fit data).
SIGNAL_BASELINES = ("imbalance", "market_maker")
#: Baselines run beside every evaluated model by default (on LOBSTER data also :data:`SIGNAL_BASELINES`;
#: the oracle joins on a planted-signal market).
DEFAULT_BASELINES = ("flat", "random", "buy_and_hold")
