"""Optuna studies over BranchingIQN's knobs and rollout evaluation.

Not built yet: no issue has asked for it so far.
"""
