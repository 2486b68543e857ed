"""Evaluation: on each env's fixed eval split, its per-episode records, metrics and report."""
