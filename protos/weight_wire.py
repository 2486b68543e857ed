"""The broadcast weight sync's contract: the wire format (`Bucket`, `TensorSpec`), the process
group both ends join, and the receiving loop. Learner rank 0 sends (`learner.weights`); each
generator engine receives (`actors.weight_receiver`, a vLLM worker extension). Both import it
from here, so neither side imports the other.

Learner rank 0 and one receiver per generator engine form a process group of their own (rank 0
is the learner, generator i is rank i + 1). For each push the tensor metadata travels through Ray
(a few `Bucket`s) and the bytes through the group, one flat uint8 broadcast per bucket. The
backend is NCCL when every member has a GPU of its own and gloo otherwise, so a CPU machine runs
the very same code path.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

import torch

Backend = Literal["nccl", "gloo"]


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """Where one tensor lies in its bucket's flat byte buffer."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # a torch dtype name such as "float32": a plain string pickles anywhere
    offset: int  # bytes from the start of the bucket

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * getattr(torch, self.dtype).itemsize


@dataclass(frozen=True, slots=True)
class Bucket:
    """Tensors sent as one flat broadcast; `nbytes` counts the alignment padding too."""

    tensors: tuple[TensorSpec, ...]
    nbytes: int

    @property
    def payload_bytes(self) -> int:
        """The tensors' own bytes (what the state dict weighs), without padding."""
        return sum(t.nbytes for t in self.tensors)


def unpack_bucket(flat: torch.Tensor, bucket: Bucket) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs viewing `flat` (a uint8 buffer laid out by `bucket`); no copies."""
    out = []
    for spec in bucket.tensors:
        raw = flat[spec.offset:spec.offset + spec.nbytes]
        out.append((spec.name, raw.view(getattr(torch, spec.dtype)).view(spec.shape)))
    return out


def cuda_uuid(device: torch.device | str) -> str | None:
    """The UUID of `device`'s GPU, None off CUDA. NCCL refuses two members of one communicator
    on the same GPU, so the sync compares these before picking NCCL."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return str(torch.cuda.get_device_properties(device).uuid)


class BroadcastGroup:
    """One member of the weight group, outside torch.distributed's global state: learner rank 0
    already belongs to DeepSpeed's default group and each vLLM worker to vLLM's."""

    def __init__(self, *, host: str, port: int, rank: int, world_size: int, backend: Backend,
                 device: torch.device | str, timeout_s: float) -> None:
        self.rank, self.world_size, self.backend = rank, world_size, backend
        # gloo moves CPU tensors only: a GPU member stages each bucket in host memory.
        self.device = torch.device(device) if backend == "nccl" else torch.device("cpu")
        if backend == "nccl":
            from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
            from vllm.distributed.utils import StatelessProcessGroup

            store = StatelessProcessGroup.create(host=host, port=port, rank=rank,
                                                 world_size=world_size,
                                                 store_timeout=int(timeout_s))
            self._comm: Any = PyNcclCommunicator(store, device=self.device)
            if self._comm.disabled:  # it would turn every broadcast into a silent no-op
                raise RuntimeError("weight sync: the NCCL library could not be loaded "
                                   "(or VLLM_DISABLE_PYNCCL is set)")
        elif backend == "gloo":
            self._comm = _gloo_group(host, port, rank, world_size, timedelta(seconds=timeout_s))
        else:
            raise ValueError(f"unknown weight sync backend {backend!r}; use nccl or gloo")

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> None:
        """Rank `src` sends `tensor`; every other member receives into its `tensor`."""
        if self.backend == "nccl":
            self._comm.broadcast(tensor, src=src)
        else:
            opts = torch.distributed.BroadcastOptions()
            opts.rootRank = src
            self._comm.broadcast([tensor], opts).wait()

    def synchronize(self) -> None:
        """Wait for queued NCCL work (gloo calls are already complete when they return)."""
        if self.backend == "nccl":
            torch.cuda.synchronize(self.device)

    def close(self) -> None:
        if self.backend == "nccl" and self._comm is not None:
            self._comm.destroy()  # an abort: it must not hang on a peer that died
        self._comm = None


def _gloo_group(host: str, port: int, rank: int, world_size: int,
                timeout: timedelta) -> Any:
    """A standalone gloo process group rendezvousing at rank 0's TCPStore on `host:port`."""
    import socket

    import torch.distributed as dist

    listen_fd = None
    if rank == 0:  # bind to `host` ourselves: a TCPStore alone listens on every interface
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen()
        listen_fd = sock.detach()
    # Without libuv, as vLLM's StatelessProcessGroup does when it hands over a bound socket.
    store = dist.TCPStore(host, port, world_size, rank == 0, timeout=timeout,
                          master_listen_fd=listen_fd, use_libuv=False)
    return dist.ProcessGroupGloo(dist.PrefixStore("horizonrl-weights", store), rank,
                                 world_size, timeout)


def receive_buckets(group: BroadcastGroup,
                    buckets: Sequence[Bucket]) -> Iterator[tuple[str, torch.Tensor]]:
    """Each bucket's tensors as soon as its broadcast arrived, in plan order. A fresh buffer per
    bucket: vLLM's layer-wise reload keeps the tensors until their whole layer is loaded."""
    for bucket in buckets:
        flat = torch.empty(bucket.nbytes, dtype=torch.uint8, device=group.device)
        group.broadcast(flat, src=0)
        yield from unpack_bucket(flat, bucket)
