"""The learner's half of the weight sync, mixed into `LearnerWorker`: rank 0's full HF state
dict (gathered across ZeRO-3 ranks), for the object-store push and checkpoints in HF format, and
membership of the broadcast weight group (`learner.weight_sync="broadcast"`). The strategies
themselves are in `learner.weights`; the generators' half is in `actors.weight_receiver`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch


class WeightSource:
    """Needs `self.engine` (the DeepSpeed policy engine), `self.rank` and `self.cfg.zero_stage`.
    Every method that gathers must be called on every rank: ZeRO-3 gathers collectively."""

    def state_dict(self) -> dict[str, np.ndarray] | None:
        """Full HF state dict on rank 0 (every rank must call: ZeRO-3 gathers collectively).

        Keeps `lm_head.weight` even when tied to the embeddings: vLLM leaves a tied head stale
        if it is missing from the reload.
        """
        with self._full_state() as sd:  # bf16 weights leave as fp32 (numpy has no bf16)
            return None if sd is None else {k: v.float().cpu().numpy().copy()
                                            for k, v in sd.items()}

    # -- the broadcast group (learner.weight_sync="broadcast") ---------------------------------
    def weight_device(self) -> str | None:
        """This rank's GPU UUID, None on CPU (the sync picks NCCL only for distinct GPUs)."""
        from horizonrl.protos.weight_wire import cuda_uuid

        return cuda_uuid(self.engine.device)

    def weight_specs(self) -> list[tuple[str, tuple[int, ...], str]] | None:
        """(name, shape, dtype) of every tensor a push sends, on rank 0 (every rank must call)."""
        from horizonrl.learner.weights import state_specs

        with self._full_state() as sd:
            return None if sd is None else state_specs(sd)

    def join_weight_group(self, *, host: str, port: int, world_size: int, backend: str,
                          timeout_s: float) -> bool:
        """Rank 0: host the weight group's rendezvous on `host:port` and join as its source."""
        from horizonrl.protos.weight_wire import BroadcastGroup

        self.leave_weight_group()
        self.weight_group = BroadcastGroup(host=host, port=port, rank=0, world_size=world_size,
                                           backend=backend, device=self.engine.device,
                                           timeout_s=timeout_s)
        return True

    def broadcast_weights(self, buckets: Sequence[Any]) -> int:
        """Every rank joins the (ZeRO-3) gather; rank 0 broadcasts `buckets` to the generators.
        Returns the payload bytes sent (0 on the other ranks)."""
        from horizonrl.learner.weights import send_buckets

        with self._full_state() as sd:
            if sd is None:
                return 0
            return send_buckets(self.weight_group, buckets, sd)

    def leave_weight_group(self) -> None:
        group, self.weight_group = getattr(self, "weight_group", None), None
        if group is not None:
            group.close()

    @contextlib.contextmanager
    def _full_state(self) -> Iterator[dict[str, torch.Tensor] | None]:
        """The full HF state dict as tensors on this rank's device, valid inside the block, on
        rank 0 (None elsewhere); `lm_head.weight` kept even when tied, as in `state_dict`."""
        import deepspeed

        from horizonrl.learner.weights import hf_state_dict

        module = self.engine.module
        with deepspeed.zero.GatheredParameters(list(module.parameters()),
                                               enabled=self.cfg.zero_stage == 3):
            yield hf_state_dict(module) if self.rank == 0 else None
