"""horizonrl actors."""
