"""horizonrl learner."""
