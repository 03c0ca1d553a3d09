"""Evaluation: datasets, the papers' metrics and settings, the runner and its report (the `eval` extra)."""
