"""What the trajectory ingest (learner/ingest.py) keeps per Push stream and how it reads one:
the stream's credits and chunk set, the trajectories whose credit was spent (`Entry`), decoding
one into its verdict, and parsing requests so that bad bytes get a status code, not INTERNAL."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import grpc
from google.protobuf.message import DecodeError

from horizonrl.protos import trajectory_pb2
from horizonrl.protos.codec import ChunkAssembler
from horizonrl.protos.trajectory import Trajectory

logger = logging.getLogger("horizonrl.learner.ingest")  # the ingest's log, as before the split

_Status = trajectory_pb2.AckStatus.ValueType
STAT_OF = {trajectory_pb2.ACK_STORED: "received", trajectory_pb2.ACK_DUPLICATE: "duplicates",
           trajectory_pb2.ACK_REJECTED: "rejected"}  # the ingest's counter of each verdict


class StreamState:
    """Per-stream state: credits reserved for it and the chunk set it is sending."""

    def __init__(self) -> None:
        self.credits = 0  # granted and not spent yet
        self.held = 0  # reservations: unspent credits + spent ones not yet resolved
        self.closed = False
        self.assembler = ChunkAssembler()
        self.chunked_status: tuple[_Status, str] | None = None  # verdict on the set's 1st chunk


@dataclass(frozen=True, slots=True)
class Entry:
    """A trajectory whose credit was spent: `build` decodes it (None: not to be stored, for
    the reason in `verdict`); `size` is its encoded bytes."""

    trajectory_id: str
    build: Callable[[], Trajectory] | None
    size: int = 0
    verdict: tuple[_Status, str] | None = None


def decode_entry(entry: Entry, known: bool) -> tuple[Trajectory | None, _Status, str]:
    """The trajectory of `entry` and its verdict; duplicates are not decoded."""
    if entry.build is None or known:
        return None, *(entry.verdict or (trajectory_pb2.ACK_DUPLICATE, ""))
    try:
        trajectory = entry.build()
        if not trajectory.trajectory_id:  # dedup is keyed on it: no id, no exactly-once
            raise ValueError("empty trajectory_id")
    except (ValueError, TypeError) as e:
        logger.warning("rejected malformed trajectory %r: %s", entry.trajectory_id, e)
        return None, trajectory_pb2.ACK_REJECTED, str(e)
    return trajectory, trajectory_pb2.ACK_STORED, ""


def parse_trajectory(data: bytes, context: grpc.ServicerContext) -> trajectory_pb2.Trajectory:
    """One trajectory of a batch split on the wire; undecodable bytes end the stream."""
    m = trajectory_pb2.Trajectory()
    try:
        m.ParseFromString(data)
    except DecodeError:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                      "undecodable horizonrl.v1.Trajectory in a batch")
    return m


def parse_request(data: bytes) -> trajectory_pb2.PushRequest:
    try:
        return trajectory_pb2.PushRequest.FromString(data)
    except DecodeError:  # not None: gRPC itself would answer None with INTERNAL
        return trajectory_pb2.PushRequest()  # empty: the handler answers INVALID_ARGUMENT
