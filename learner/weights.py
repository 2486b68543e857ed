"""Weight sync from the learner to the generators, behind one interface (`WeightSync`): the
only way weights reach generators, whether all of them reload in lock-step (sync mode), one
picks them up between rollouts (async mode) or a restarted one catches up.

Two strategies, picked by `learner.weight_sync`:
- object_store: rank 0 gathers the full HF state dict, it goes to every generator through Ray's
  object store, and each engine reloads it from a safetensors file.
- broadcast: rank 0 and the generators' engines form a process group of their own and rank 0
  broadcasts the state dict in buckets (NCCL on GPUs, gloo on CPU; the same code path). The
  receivers' half is in `actors.weight_receiver`.
Both send the full state dict including a tied `lm_head.weight`: vLLM leaves a tied head stale
when it is missing. A single generator (an async hand-off, a restart) always reloads through the
object store: a broadcast group is re-formed at the next full push instead.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch

from horizonrl.learner.config import LearnerConfig
from horizonrl.protos.weight_wire import Backend, BroadcastGroup, Bucket, TensorSpec

ALIGN = 16  # bytes: each tensor starts aligned so the receiver can view it in any dtype


@dataclass(frozen=True, slots=True)
class SyncStats:
    """What one push cost. The broadcast-only figures are None for the object store."""

    seconds: float  # the push as its caller waited for it
    reload_seconds: float  # the slowest generator's load of the new weights
    bytes: float | None = None  # sent by learner rank 0
    buckets: float | None = None
    group_setup_seconds: float | None = None  # forming the group (0 when it already existed)

    def metrics(self) -> dict[str, float]:
        """The figures under their metric names (`weight_sync_seconds`, ...)."""
        names = {"seconds": "weight_sync_seconds", "reload_seconds": "weight_reload_seconds",
                 "bytes": "weight_sync_bytes", "buckets": "weight_sync_buckets",
                 "group_setup_seconds": "weight_group_setup_seconds"}
        return {names[k]: getattr(self, k) for k in names if getattr(self, k) is not None}


class WeightSync(Protocol):
    """The learner's current weights to the generators (the driver's own list, so a restarted
    generator swapped into it is the one reached)."""

    def push(self, version: int) -> SyncStats:
        """Every generator reloads `version`; returns when all have."""
        ...

    def hand_off(self, index: int, version: int) -> Any:
        """Generator `index` reloads `version` without waiting (async mode); an ObjectRef of
        its reload seconds."""
        ...

    def resync(self, index: int, version: int) -> float:
        """Generator `index` (restarted) reloads `version`; returns its reload seconds."""
        ...

    def state(self, version: int) -> Any:
        """An ObjectRef of the weights as `version` (partial rollouts fetch it mid-rollout)."""
        ...

    def close(self) -> None: ...


def make_weight_sync(cfg: LearnerConfig, learner: Any, generators: list[Any]) -> WeightSync:
    """The strategy `cfg.weight_sync` names. `generators` is the driver's own list: a restarted
    generator swapped into it is seen by the next push."""
    timeout_s = cfg.weight_sync_timeout_s
    if cfg.weight_sync == "broadcast":
        return BroadcastWeightSync(learner, generators, timeout_s=timeout_s,
                                   bucket_bytes=int(cfg.weight_bucket_mb * 2**20))
    return ObjectStoreWeightSync(learner, generators, timeout_s=timeout_s)


class ObjectStoreWeightSync:
    """Full state dict through the Ray object store; generators reload from it."""

    def __init__(self, learner: Any, generators: list[Any], *, timeout_s: float = 300.0):
        self.learner = learner
        self.generators = generators  # the driver's own list: a restarted generator is in it
        self.timeout_s = timeout_s
        # Async hand-offs of one version share one copy; dropped when a newer one is asked for.
        self._state: tuple[int, Any] | None = None

    def push(self, version: int) -> SyncStats:
        import ray

        t0 = time.perf_counter()
        self._state = None  # not kept past the push: the object store holds it only while used
        ref = self.learner.state_dict_ref()
        reload_s = ray.get([g.update_weights.remote(ref, version) for g in self.generators],
                           timeout=self.timeout_s)
        return SyncStats(seconds=time.perf_counter() - t0, reload_seconds=max(reload_s))

    def state(self, version: int) -> Any:
        """An ObjectRef of the learner's state dict as `version`, one copy per version for
        every hand-off (async mode); the older one is dropped."""
        if self._state is None or self._state[0] != version:
            self._state = (version, self.learner.state_dict_ref())
        return self._state[1]

    def hand_off(self, index: int, version: int) -> Any:
        return self.generators[index].update_weights.remote(self.state(version), version)

    def resync(self, index: int, version: int) -> float:
        import ray

        return ray.get(self.hand_off(index, version), timeout=self.timeout_s)

    def close(self) -> None:
        self._state = None


# -- broadcast --------------------------------------------------------------------------------
def bucket_plan(names_shapes_dtypes: Iterable[tuple[str, Sequence[int], str]],
                bucket_bytes: int) -> list[Bucket]:
    """Tensors in the given order, packed greedily into buckets of at most `bucket_bytes`
    (alignment padding included); a tensor larger than a bucket travels alone.
    Dtypes are torch dtype names ("float32"; a "torch." prefix is dropped)."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    buckets: list[Bucket] = []
    current: list[TensorSpec] = []
    end = 0  # bytes used in the current bucket
    for name, shape, dtype in names_shapes_dtypes:
        spec = TensorSpec(name, tuple(int(d) for d in shape), str(dtype).removeprefix("torch."),
                          offset=0)
        start = -(-end // ALIGN) * ALIGN
        if current and start + spec.nbytes > bucket_bytes:
            buckets.append(Bucket(tuple(current), end))
            current, start = [], 0
        current.append(replace(spec, offset=start))
        end = start + spec.nbytes
    if current:
        buckets.append(Bucket(tuple(current), end))
    return buckets


def hf_state_dict(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """`module`'s state dict, detached, with `lm_head.weight` even when tied to the embeddings
    (vLLM leaves a tied head stale if the push lacks it)."""
    sd = {k: v.detach() for k, v in module.state_dict().items()}
    if "lm_head.weight" not in sd and "model.embed_tokens.weight" in sd:
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    return sd


def state_specs(state: Mapping[str, torch.Tensor]) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, dtype name) per tensor, in order: the input of `bucket_plan`."""
    return [(k, tuple(v.shape), str(v.dtype).removeprefix("torch.")) for k, v in state.items()]


def pack_bucket(bucket: Bucket, tensors: Mapping[str, torch.Tensor],
                device: torch.device | str = "cpu") -> torch.Tensor:
    """One flat uint8 buffer on `device` holding `bucket`'s tensors at their offsets."""
    flat = torch.zeros(bucket.nbytes, dtype=torch.uint8, device=device)
    for spec in bucket.tensors:
        t = tensors[spec.name]
        if tuple(t.shape) != spec.shape or t.dtype != getattr(torch, spec.dtype):
            raise ValueError(f"{spec.name} is {tuple(t.shape)} {t.dtype}, the bucket plan says "
                             f"{spec.shape} {spec.dtype}: the model changed after the plan")
        flat[spec.offset:spec.offset + spec.nbytes].copy_(
            t.detach().contiguous().reshape(-1).view(torch.uint8))
    return flat


def send_buckets(group: BroadcastGroup, buckets: Sequence[Bucket],
                 state: Mapping[str, torch.Tensor]) -> int:
    """Rank 0's half of a push: pack and broadcast each bucket in plan order (one bucket in
    flight at a time bounds the extra memory); returns the payload bytes sent."""
    for bucket in buckets:
        group.broadcast(pack_bucket(bucket, state, group.device), src=0)
    group.synchronize()
    return sum(b.payload_bytes for b in buckets)


def choose_backend(devices: Sequence[str | None]) -> Backend:
    """NCCL when every member has a GPU of its own (`devices` are GPU UUIDs, None for a CPU
    member); gloo otherwise: NCCL has no CPU tensors and refuses two members on one GPU."""
    if devices and all(d is not None for d in devices) and len(set(devices)) == len(devices):
        return "nccl"
    return "gloo"


def _get_all(refs: list[Any], timeout_s: float) -> list[Any]:
    """`ray.get(refs)`, but raising as soon as any of them fails: the other members of a
    collective would otherwise keep us waiting for their own timeouts."""
    import ray

    pending, deadline = list(refs), time.monotonic() + timeout_s
    while pending:
        ready, pending = ray.wait(pending, num_returns=1,
                                  timeout=max(0.0, deadline - time.monotonic()))
        if not ready:
            raise TimeoutError(f"weight sync: {len(pending)} member call(s) still running after "
                               f"{timeout_s:.0f}s")
        ray.get(ready)  # re-raises that member's error now
    return ray.get(refs)


class BroadcastWeightSync(ObjectStoreWeightSync):
    """Learner rank 0 broadcasts the full state dict in buckets to one receiver per generator;
    single generators (`hand_off`, `resync`) reload through the object store as the base does.

    The group (learner rank 0 is rank 0, generator i is rank i + 1) is formed on the first push.
    It is re-formed as a whole when the driver's generator list changed (a restarted generator
    is swapped into it) or a push failed: simpler and safer than patching one rank into a live
    NCCL communicator, and restarts are rare. Each member leaves its old group when it joins
    anew.
    """

    def __init__(self, learner: Any, generators: list[Any], *, bucket_bytes: int,
                 timeout_s: float = 300.0) -> None:
        super().__init__(learner, generators, timeout_s=timeout_s)
        self.bucket_bytes = bucket_bytes
        self.buckets: list[Bucket] = []
        self.backend: Backend | None = None
        self._members: list[Any] | None = None  # the handles the live group was formed with

    def push(self, version: int) -> SyncStats:
        t0 = time.perf_counter()
        self._state = None
        setup_s = 0.0 if self._formed() else self._form()
        try:
            sent = self.learner.broadcast_weights_refs(self.buckets)
            received = [g.receive_weights.remote(self.buckets, version) for g in self.generators]
            results = _get_all([*sent, *received], self.timeout_s)
        except Exception:
            self._members = None  # a member died or hung: the next push forms a new group
            raise
        nbytes, reload_s = max(results[:len(sent)]), results[len(sent):]
        return SyncStats(seconds=time.perf_counter() - t0, reload_seconds=max(reload_s),
                         bytes=float(nbytes), buckets=float(len(self.buckets)),
                         group_setup_seconds=setup_s)

    def _formed(self) -> bool:
        members = self._members
        return members is not None and len(members) == len(self.generators) and all(
            a is b for a, b in zip(members, self.generators))

    def _form(self) -> float:
        """(Re)build the group over the current generators; returns the seconds it took."""
        import ray

        t0 = time.perf_counter()
        gens = list(self.generators)
        self.buckets = bucket_plan(self.learner.weight_specs(), self.bucket_bytes)
        devices = [self.learner.weight_device(),
                   *ray.get([g.weight_device.remote() for g in gens], timeout=self.timeout_s)]
        self.backend = choose_backend(devices)
        host, port = self.learner.weight_group_address()
        common = {"host": host, "port": port, "world_size": 1 + len(gens),
                  "backend": self.backend, "timeout_s": self.timeout_s}
        # Every member must be joining at once: each join returns when the group is complete.
        joins = [self.learner.join_weight_group_ref(**common)]
        joins += [g.join_weight_group.remote(rank=i + 1, **common) for i, g in enumerate(gens)]
        _get_all(joins, self.timeout_s)
        self._members = gens
        return time.perf_counter() - t0

    def close(self) -> None:
        """Leave the group on every member still alive (best effort)."""
        import ray

        super().close()
        members, self._members = self._members, None
        if members is None:
            return  # no live group: none formed, or a failed push dropped it
        refs = [g.leave_weight_group.remote() for g in members]
        refs.append(self.learner.leave_weight_group_ref())
        for ref in refs:
            try:
                ray.get(ref, timeout=30)
            except (ray.exceptions.RayError, TimeoutError):
                pass  # a dead member has nothing left to close
