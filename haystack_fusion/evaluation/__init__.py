"""Evaluation: datasets, the papers' metrics and settings, the runner and its report (issue 3, in progress)."""
