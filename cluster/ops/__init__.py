"""Running it: Ray start-up, placement plan and memory plan, several nodes, checkpoints, export,
Prometheus, provenance, figures."""
