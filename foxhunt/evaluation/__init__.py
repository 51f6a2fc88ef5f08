"""Evaluation of trained agents and baselines: rollout recording, reports and plots."""
