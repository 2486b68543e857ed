"""horizonrl envpool."""
