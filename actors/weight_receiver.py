"""The generators' half of the broadcast weight sync: a vLLM worker extension that joins the
learner's weight group and loads each push in place, and the `GeneratorActor` methods the
learner's group calls to drive it (`learner.weight_sync="broadcast"`). The wire format and the
group are the contract in `protos.weight_wire`; the sender's half is in `learner.weights`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from horizonrl.protos.weight_wire import Backend, BroadcastGroup, Bucket, cuda_uuid, receive_buckets


class WeightReceiverExtension:
    """Mixed into vLLM's worker class (`LLM(worker_extension_cls=...)`); `VLLMEngine` calls these
    through `collective_rpc`, so they run where the model lives, in-process or in a worker
    process alike. One worker per engine (no tensor parallelism): each engine is one rank."""

    def weight_receiver_device(self) -> str | None:
        return cuda_uuid(self.device)

    def join_weight_broadcast(self, *, host: str, port: int, rank: int, world_size: int,
                              backend: Backend, timeout_s: float) -> None:
        """Join the learner's weight group as `rank` (leaving any earlier group first)."""
        self.leave_weight_broadcast()
        self._weight_broadcast_group = BroadcastGroup(
            host=host, port=port, rank=rank, world_size=world_size, backend=backend,
            device=self.device, timeout_s=timeout_s)

    def receive_weight_buckets(self, buckets: Sequence[Bucket]) -> int:
        """Receive one push and load it in place; returns the payload bytes received."""
        group = getattr(self, "_weight_broadcast_group", None)
        if group is None:
            raise RuntimeError("receive_weight_buckets before join_weight_broadcast")
        stream = receive_buckets(group, buckets)
        # reload_weights, not a bare model.load_weights: it re-runs each layer's post-load
        # processing, where the CPU backend repacks linear weights (a bare load left the
        # repacked copies stale). It calls the model's load_weights on the stream.
        self.reload_weights(weights_iterator=stream)
        for _ in stream:  # match every broadcast even if the loader stopped early
            pass
        group.synchronize()
        return sum(b.payload_bytes for b in buckets)

    def leave_weight_broadcast(self) -> None:
        group = getattr(self, "_weight_broadcast_group", None)
        self._weight_broadcast_group = None
        if group is not None:
            group.close()


class GeneratorWeightSync:
    """Mixed into `GeneratorActor`: needs `self.engine` (a `VLLMEngine`) and sets
    `self.policy_version` on each push."""

    def weight_device(self) -> str | None:
        """The engine's GPU UUID, None on CPU (NCCL needs a GPU of its own per member)."""
        return self.engine.weight_device()

    def join_weight_group(self, *, host: str, port: int, rank: int, world_size: int,
                          backend: str, timeout_s: float) -> bool:
        """Join learner rank 0's weight group as `rank`; returns once every member joined."""
        self.engine.join_weight_group(host=host, port=port, rank=rank, world_size=world_size,
                                      backend=backend, timeout_s=timeout_s)
        return True

    def receive_weights(self, buckets: Sequence[Any], version: int) -> float:
        """Receive one broadcast push (the bytes come over the group); returns seconds."""
        t0 = time.perf_counter()
        self.engine.receive_weights(buckets)
        self.policy_version = int(version)
        return time.perf_counter() - t0

    def leave_weight_group(self) -> None:
        self.engine.leave_weight_group()
