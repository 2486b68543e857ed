"""The generators' half of the broadcast weight sync: a vLLM worker extension that joins the
learner's weight group and loads each push in place. The wire format and the group are the
contract in `protos.weight_wire`; the sender's half is in `learner.weights`.
"""

from __future__ import annotations

from collections.abc import Sequence

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
