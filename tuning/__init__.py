"""Optuna studies over BranchingIQN's knobs and rollout evaluation (not built yet: no issue has asked for it)."""
