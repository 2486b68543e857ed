"""Weight sync from the learner to the generators, behind one interface.

CPU strategy (the one verified on this machine): rank 0 gathers the full HF state dict, it goes
to every generator through Ray's object store, and each engine reloads it in place. An NCCL
broadcast group is the GPU strategy to add behind the same `WeightSync` protocol.
"""

from __future__ import annotations

import time
from typing import Any, Protocol


class WeightSync(Protocol):
    """Pushes the learner's current weights to the generators as `version`."""

    def push(self, version: int) -> dict[str, float]: ...


class ObjectStoreWeightSync:
    """Full state dict through the Ray object store; generators reload from it."""

    def __init__(self, learner: Any, generators: list[Any], *, timeout_s: float = 300.0):
        self.learner = learner
        self.generators = generators  # the driver's own list: a restarted generator is in it
        self.timeout_s = timeout_s

    def push(self, version: int) -> dict[str, float]:
        import ray

        t0 = time.perf_counter()
        ref = self.learner.state_dict_ref()
        reload_s = ray.get([g.update_weights.remote(ref, version) for g in self.generators],
                           timeout=self.timeout_s)
        return {"weight_sync_seconds": time.perf_counter() - t0,
                "weight_reload_seconds": max(reload_s)}
