"""horizonrl protos."""
