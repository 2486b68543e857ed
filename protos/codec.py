"""Convert `Trajectory` dataclasses to and from the `horizonrl.v1.Trajectory` protobuf.

The only place protobuf meets the rest of the code: generators call `to_proto`/`encode`, the
learner's ingest calls `from_proto`/`decode`, and everything else sees the frozen dataclass.

What survives a round trip exactly: ids, token ids, mask, counts, flags, failure, turn_seconds
(float64). What does not:
- `response_logprobs`, `rewards` and `reward` travel as float32 (the learner computes in float32
  and it halves the payload), so a Python float comes back rounded to the nearest float32.
- `info` travels as JSON: it must be JSON-serializable (else `TypeError` in `to_proto`), tuples
  come back as lists and non-string keys as strings. No pickle ever crosses the network.
Decoding rebuilds the dataclass, so its validation (length mismatches, turns above the horizon)
raises `ValueError` on the receiving side too; so do an unknown failure code and bad JSON.

A trajectory too large for one gRPC message travels as `Chunk`s: `to_chunks` slices its encoded
bytes, `ChunkAssembler` checks and joins them on the receiving side (see protos/trajectory.proto).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
from google.protobuf import json_format
from google.protobuf.message import DecodeError

from horizonrl.protos import trajectory_pb2
from horizonrl.protos.trajectory import Failure, Trajectory

# Explicit tables rather than name mangling: a new Failure member without a wire code fails
# loudly here (KeyError in to_proto) instead of silently travelling as FAILURE_NONE.
_FAILURE_TO_WIRE: dict[Failure, int] = {
    Failure.NONE: trajectory_pb2.FAILURE_NONE,
    Failure.ENV_ERROR: trajectory_pb2.FAILURE_ENV_ERROR,
    Failure.TIMEOUT: trajectory_pb2.FAILURE_TIMEOUT,
    Failure.GENERATOR_ERROR: trajectory_pb2.FAILURE_GENERATOR_ERROR,
}
_FAILURE_FROM_WIRE: dict[int, Failure] = {code: f for f, code in _FAILURE_TO_WIRE.items()}


def to_proto(t: Trajectory) -> trajectory_pb2.Trajectory:
    """Build the wire message for `t` (float32 logprobs/rewards, `info` as JSON)."""
    return trajectory_pb2.Trajectory(
        trajectory_id=t.trajectory_id,
        group_id=t.group_id,
        task_id=t.task_id,
        env_name=t.env_name,
        policy_version=t.policy_version,
        horizon=t.horizon,
        prompt_ids=t.prompt_ids,
        response_ids=t.response_ids,
        response_mask=t.response_mask,
        response_logprobs=t.response_logprobs,
        rewards=t.rewards,
        reward=t.reward,
        num_turns=t.num_turns,
        terminated=t.terminated,
        truncated=t.truncated,
        failure=_FAILURE_TO_WIRE[t.failure],
        turn_seconds=t.turn_seconds,
        # "" for the common empty dict: the proto3 default costs no bytes on the wire.
        info_json=json.dumps(t.info, separators=(",", ":")) if t.info else "",
        turn_spans=[x for span in t.turn_spans for x in span],
        turn_versions=t.turn_versions,
    )


def from_proto(m: trajectory_pb2.Trajectory) -> Trajectory:
    """Rebuild the dataclass from a wire message; raises `ValueError` if it is malformed."""
    failure = _FAILURE_FROM_WIRE.get(m.failure)
    if failure is None:
        raise ValueError(f"trajectory {m.trajectory_id}: unknown failure code {m.failure}")
    return Trajectory(
        trajectory_id=m.trajectory_id,
        group_id=m.group_id,
        task_id=m.task_id,
        env_name=m.env_name,
        policy_version=m.policy_version,
        horizon=m.horizon,
        prompt_ids=_as_tuple(m.prompt_ids),
        response_ids=_as_tuple(m.response_ids),
        response_mask=_as_tuple(m.response_mask),
        response_logprobs=_as_tuple(m.response_logprobs),
        rewards=tuple(m.rewards),
        reward=m.reward,
        num_turns=m.num_turns,
        terminated=m.terminated,
        truncated=m.truncated,
        failure=failure,
        turn_seconds=tuple(m.turn_seconds),
        info=_load_info(m.trajectory_id, m.info_json),
        turn_spans=_load_spans(m.trajectory_id, m.turn_spans),
        turn_versions=tuple(m.turn_versions),
    )


def _as_tuple(repeated: Any) -> tuple:
    """A long repeated scalar field as a tuple of Python numbers, through numpy: about twice
    as fast as `tuple(repeated)`, which crosses into the protobuf runtime once per element.
    Exact: int32 widens to int, and a float32 field's values are already doubles."""
    return tuple(np.array(repeated).tolist()) if len(repeated) else ()


def _load_spans(trajectory_id: str, flat: Any) -> tuple[tuple[int, int, int], ...]:
    if len(flat) % 3:
        raise ValueError(f"trajectory {trajectory_id}: turn_spans holds {len(flat)} numbers, "
                         "not whole (window_start, turn_start, turn_end) triples")
    return tuple((flat[i], flat[i + 1], flat[i + 2]) for i in range(0, len(flat), 3))


def encode(t: Trajectory) -> bytes:
    """Serialize `t` to protobuf bytes."""
    return to_proto(t).SerializeToString()


def decode(b: bytes) -> Trajectory:
    """Parse protobuf bytes into a `Trajectory`; raises `ValueError` if malformed."""
    m = trajectory_pb2.Trajectory()
    try:
        m.ParseFromString(b)
    except DecodeError as e:  # callers handle one exception type for every malformed input
        raise ValueError(f"not a horizonrl.v1.Trajectory: {e}") from e
    return from_proto(m)


def to_json_line(t: Trajectory) -> str:
    """One line of protobuf JSON (the run's trajectory log; readable without horizonrl)."""
    return json_format.MessageToJson(to_proto(t), indent=None)


def from_json_line(line: str) -> Trajectory:
    """Inverse of `to_json_line`; raises `ValueError` if malformed."""
    m = trajectory_pb2.Trajectory()
    try:
        json_format.Parse(line, m)
    except json_format.ParseError as e:
        raise ValueError(f"not a horizonrl.v1.Trajectory JSON line: {e}") from e
    return from_proto(m)


def _load_info(trajectory_id: str, info_json: str) -> dict[str, Any]:
    if not info_json:
        return {}
    info = json.loads(info_json)  # JSONDecodeError is a ValueError
    if not isinstance(info, dict):
        # ValueError like every other malformed message: callers catch one type
        raise ValueError(f"trajectory {trajectory_id}: info_json is not a JSON object")
    return info


def to_chunks(trajectory_id: str, data: bytes, chunk_bytes: int) -> list[trajectory_pb2.Chunk]:
    """Slice the encoded trajectory `data` into ordered chunks of at most `chunk_bytes`."""
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
    view = memoryview(data)
    count = max(1, -(-len(data) // chunk_bytes))  # ceil; an empty payload is one empty chunk
    return [trajectory_pb2.Chunk(trajectory_id=trajectory_id, index=i, count=count,
                                 total_bytes=len(data),
                                 data=bytes(view[i * chunk_bytes:(i + 1) * chunk_bytes]))
            for i in range(count)]


class ChunkError(ValueError):
    """A chunk sequence that breaks the protocol (out of order, inconsistent, too long)."""


@dataclass(frozen=True, slots=True)
class Reassembled:
    """A completed chunk set: `data` is the encoded trajectory, None if it was not kept."""

    trajectory_id: str
    data: bytes | None


class ChunkAssembler:
    """Rebuilds the chunked trajectories of one stream, one set at a time.

    The sender sends each set in order with nothing in between, so a stream needs only the set
    in progress; memory is bounded by the `total_bytes` the first chunk declares, which the
    caller checks before choosing to keep the data. A set that is not kept (a duplicate id, an
    oversized trajectory) is still checked chunk by chunk but its bytes are dropped at once.
    """

    def __init__(self) -> None:
        self._first: trajectory_pb2.Chunk | None = None  # metadata of the set in progress
        self._parts: list[bytes] | None = None
        self._next = 0
        self._size = 0

    @property
    def active(self) -> str | None:
        """The id of the set in progress, if any."""
        return None if self._first is None else self._first.trajectory_id

    def add(self, chunk: trajectory_pb2.Chunk, *, keep: bool = True) -> Reassembled | None:
        """Take the next chunk (`keep` is read on a set's first chunk); the completed set at its
        last chunk, else None. Raises `ChunkError` on a broken sequence."""
        if self._first is None:
            if chunk.index != 0 or chunk.count < 1 or chunk.total_bytes < 0:
                raise ChunkError(f"chunk set {chunk.trajectory_id!r} must start at index 0 "
                                 f"with count >= 1 (got index {chunk.index}/{chunk.count})")
            self._first = trajectory_pb2.Chunk(trajectory_id=chunk.trajectory_id,
                                               count=chunk.count, total_bytes=chunk.total_bytes)
            self._parts = [] if keep else None
        first = self._first
        if (chunk.trajectory_id, chunk.index, chunk.count, chunk.total_bytes) != (
                first.trajectory_id, self._next, first.count, first.total_bytes):
            why = (f"expected chunk {first.trajectory_id!r} {self._next}/{first.count}, got "
                   f"{chunk.trajectory_id!r} {chunk.index}/{chunk.count}")
            self.discard()
            raise ChunkError(why)
        self._size += len(chunk.data)
        if self._size > first.total_bytes:
            self.discard()
            raise ChunkError(f"chunk set {first.trajectory_id!r} exceeds its declared "
                             f"{first.total_bytes} bytes")
        if self._parts is not None:
            self._parts.append(chunk.data)
        self._next += 1
        if self._next < first.count:
            return None
        if self._size != first.total_bytes:
            self.discard()
            raise ChunkError(f"chunk set {first.trajectory_id!r} ended with {self._size} of "
                             f"{first.total_bytes} bytes")
        done = Reassembled(first.trajectory_id,
                           None if self._parts is None else b"".join(self._parts))
        self.discard()
        return done

    def discard(self) -> bool:
        """Drop the set in progress (a broken stream); True if there was one."""
        had = self._first is not None
        self._first, self._parts, self._next, self._size = None, None, 0, 0
        return had
