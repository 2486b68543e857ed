"""TrajectorySender: the generator's client for the learner's `TrajectoryService`.

A batch goes out as one client stream. If the connection breaks (UNAVAILABLE: learner
restarting, network blip, learner buffer full) the whole batch is sent again after a backoff;
the learner deduplicates by `trajectory_id`, so a retry never stores anything twice.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Self

import grpc

from protos import trajectory_pb2_grpc
from protos.codec import to_proto
from protos.trajectory import Trajectory

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # matches the ingest's receive limit


@dataclass(frozen=True, slots=True)
class PushResult:
    """The learner's answer to the attempt that succeeded.

    After a retry, `duplicates` includes trajectories stored by the broken earlier attempt.
    """

    received: int
    """New trajectories stored by the learner."""
    duplicates: int
    """Trajectories whose id the learner already had (acknowledged, not stored again)."""
    rejected: int
    """Malformed trajectories the learner skipped."""
    attempts: int
    """Streams opened for this batch (1 = no retry)."""


class TrajectorySender:
    """Streams finished trajectories to one learner ingest address. Thread-safe."""

    def __init__(
        self,
        address: str,
        *,
        deadline_s: float = 60.0,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        retries: int = 3,
        backoff_s: float = 0.5,
        auth_token: str | None = None,
    ) -> None:
        """`deadline_s` bounds each attempt, waiting for the learner to come up included;
        `retries` extra attempts follow an UNAVAILABLE with backoff `backoff_s * 2**k`."""
        self._deadline_s = deadline_s
        self._retries = retries
        self._backoff_s = backoff_s
        self._channel = grpc.insecure_channel(
            address,
            options=[
                ("grpc.max_send_message_length", max_message_bytes),
                # gRPC's default reconnect backoff starts at 1 s and grows to 120 s; a learner
                # that restarts should be found again within a couple of seconds.
                ("grpc.initial_reconnect_backoff_ms", 100),
                ("grpc.max_reconnect_backoff_ms", 2000),
            ],
        )
        self._stub = trajectory_pb2_grpc.TrajectoryServiceStub(self._channel)
        self._metadata = (("authorization", f"Bearer {auth_token}"),) if auth_token else None

    def send(self, trajectories: Sequence[Trajectory]) -> PushResult:
        """Send `trajectories` in one stream; retry the whole batch on UNAVAILABLE.

        Raises `grpc.RpcError` for other errors (DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED for a
        message above the size limit) and for UNAVAILABLE once the retries are spent.
        """
        if not trajectories:
            return PushResult(received=0, duplicates=0, rejected=0, attempts=0)
        messages = [to_proto(t) for t in trajectories]  # encode once, resend as is
        for attempt in range(self._retries + 1):
            try:
                # wait_for_ready: a learner that is (re)starting is waited for within the
                # deadline instead of failing the attempt at once.
                ack = self._stub.Push(iter(messages), timeout=self._deadline_s,
                                      wait_for_ready=True, metadata=self._metadata)
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE or attempt == self._retries:
                    raise
                time.sleep(self._backoff_s * 2**attempt)
                continue
            return PushResult(
                received=ack.received,
                duplicates=ack.duplicates,
                rejected=ack.rejected,
                attempts=attempt + 1,
            )
        raise AssertionError("unreachable: the last attempt returns or raises")

    def close(self) -> None:
        """Close the channel; in-flight sends fail with CANCELLED."""
        self._channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
