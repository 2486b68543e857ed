"""The starting checkpoint: a user's path, or the tiny model built locally (with its reading pre-
training)."""
