"""The rollout side of an iteration: task sampling, collecting trajectories from the ingest,
rollout figures."""
