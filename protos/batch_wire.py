"""A batch of trajectories on the wire, without a message in between.

The sender holds each trajectory encoded once (bytes); a `PushRequest{batch: TrajectoryBatch{
trajectories: ...}}` is those bytes with a tag and a length in front of each, so it is put
together by joining bytes (`batch_request`) instead of parsing them into a message to serialize
again. The ingest does the reverse (`split_batch`): it finds each trajectory's bytes by their
lengths, so it parses each trajectory once, on its own, and knows its encoded size without
asking protobuf to compute it.
"""

from __future__ import annotations

from collections.abc import Iterable

from horizonrl.protos import trajectory_pb2

_BATCH_FIELD = trajectory_pb2.PushRequest.DESCRIPTOR.fields_by_name["batch"].number
_TRAJECTORIES_FIELD = trajectory_pb2.TrajectoryBatch.DESCRIPTOR.fields_by_name[
    "trajectories"].number
_LENGTH_DELIMITED = 2  # protobuf wire type of messages and bytes
_BATCH_TAG = _BATCH_FIELD << 3 | _LENGTH_DELIMITED
_TRAJECTORY_TAG = _TRAJECTORIES_FIELD << 3 | _LENGTH_DELIMITED
_MAX_VARINT_BYTES = 10


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _length_delimited(field_number: int, payload: bytes) -> bytes:
    """One length-delimited protobuf field around `payload`."""
    return _varint(field_number << 3 | _LENGTH_DELIMITED) + _varint(len(payload)) + payload


def batch_request(encoded: Iterable[bytes]) -> bytes:
    """The serialized PushRequest carrying these encoded trajectories as one batch, byte for
    byte what serializing the message would give."""
    return _length_delimited(_BATCH_FIELD, b"".join(
        _length_delimited(_TRAJECTORIES_FIELD, data) for data in encoded))


def _read_varint(data: bytes, pos: int) -> tuple[int, int] | None:
    """(value, position after it), or None if the varint is cut off or too long."""
    value = shift = 0
    for i in range(pos, min(pos + _MAX_VARINT_BYTES, len(data))):
        value |= (data[i] & 0x7F) << shift
        if data[i] < 0x80:
            return value, i + 1
        shift += 7
    return None


def split_batch(data: bytes) -> list[bytes] | None:
    """The encoded trajectories of `data` if it is exactly one batch as `batch_request` builds
    it (what horizonrl's senders send), else None: the caller then parses the request whole,
    which handles every other valid or invalid form."""
    if not data or data[0] != _BATCH_TAG:
        return None
    head = _read_varint(data, 1)
    if head is None or head[1] + head[0] != len(data):
        return None
    pos, parts = head[1], []
    while pos < len(data):
        if data[pos] != _TRAJECTORY_TAG:
            return None
        size = _read_varint(data, pos + 1)
        if size is None or size[1] + size[0] > len(data):
            return None
        pos = size[1] + size[0]
        parts.append(data[size[1]:pos])
    return parts
