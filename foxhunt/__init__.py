"""foxhunt, the application: the ``foxhunt`` command line, run configs and training runs, evaluation.

It is the one package that knows all three libraries: :mod:`foxenv` (the LOB environment),
:mod:`sb3_her_ext` (BranchingIQN for Stable-Baselines3) and :mod:`cuda_ext` (the kernels).

- :mod:`foxhunt.cli`: ``foxhunt train | evaluate | rollout | tune``;
- :mod:`foxhunt.runs`: :class:`~foxhunt.runs.RunConfig` and ``train(config) -> run folder``;
- :mod:`foxhunt.envs`: the SB3 faces of foxenv (:class:`~foxhunt.envs.LOBVecEnv`);
- :mod:`foxhunt.presets`: the trading defaults BranchingIQN receives as arguments;
- :mod:`foxhunt.evaluation`: rollouts, metrics reports and plots.
"""
