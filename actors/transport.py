"""TrajectorySender: the generator's client for the learner's `TrajectoryService`.

A batch goes out on one `Push` stream against credits (protos/trajectory.proto): the sender
asks for credits, sends one trajectory per credit, waits when it has none (the learner's buffer
is full), and gets an ack for each trajectory. Small trajectories share messages; one too large
for a message goes as chunks. If the stream breaks (UNAVAILABLE: learner restarting, network
blip, learner full for too long) a new stream resends every trajectory without an ack, after a
backoff; the learner deduplicates by `trajectory_id`, so a retry never stores anything twice.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import grpc

from horizonrl.protos import trajectory_pb2, trajectory_pb2_grpc
from horizonrl.protos.codec import to_chunks, to_proto
from horizonrl.protos.trajectory import Trajectory

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # matches the ingest's receive limit
DEFAULT_CHUNK_BYTES = 4 * 1024 * 1024  # gRPC's default message limit: fine for any peer
_HEADROOM_BYTES = 4096  # a chunk's id, counters and framing on top of its data


@dataclass(frozen=True, slots=True)
class PushResult:
    """What the learner acknowledged for one batch, over all attempts.

    A trajectory stored by a broken earlier attempt whose ack was lost counts as a duplicate.
    """

    received: int
    """New trajectories stored by the learner."""
    duplicates: int
    """Trajectories whose id the learner already had (acknowledged, not stored again)."""
    rejected: int
    """Malformed or oversized trajectories the learner skipped."""
    attempts: int
    """Streams opened for this batch (1 = no retry)."""
    stale: int = 0
    """Trajectories the learner dropped as too far behind its policy version."""
    credit_waits: int = 0
    """Credit grants the learner held back because its buffer was full."""


@dataclass(slots=True)
class _Item:
    """One trajectory of the batch: encoded once, resent as is."""

    message: trajectory_pb2.Trajectory
    size: int
    status: int = trajectory_pb2.ACK_STATUS_UNSPECIFIED  # the learner's verdict, once acked


class _Attempt:
    """One Push stream. gRPC's request thread runs `requests`; the caller feeds the responses
    to `on_response` and calls `close` when the stream ends, however it ends."""

    def __init__(self, todo: list[_Item], chunk_bytes: int) -> None:
        self._todo = todo
        self._chunk_bytes = chunk_bytes  # lowered to the learner's limit by its first grant
        self._cond = threading.Condition()
        self._credits = 0
        self._asking = True  # the opening request asks
        self._closed = False
        self._unacked: deque[_Item] = deque()  # sent, in order; at most the credits granted
        self.credit_waits = 0

    def requests(self) -> Iterator[trajectory_pb2.PushRequest]:
        yield self._ask(len(self._todo))
        pos = 0
        while pos < len(self._todo):
            with self._cond:
                ask = self._credits == 0 and not self._asking
                self._asking |= ask
            if ask:
                yield self._ask(len(self._todo) - pos)
            with self._cond:
                # Bounded by the call: close() runs when the stream ends, deadline included.
                while self._credits == 0 and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                group, chunk_bytes = self._spend(pos), self._chunk_bytes
            pos += len(group)
            if group[0].size > chunk_bytes:  # _spend gives one too large for a message alone
                data = group[0].message.SerializeToString()
                for chunk in to_chunks(group[0].message.trajectory_id, data, chunk_bytes):
                    yield trajectory_pb2.PushRequest(chunk=chunk)
            else:
                batch = trajectory_pb2.TrajectoryBatch(trajectories=[i.message for i in group])
                yield trajectory_pb2.PushRequest(batch=batch)

    def _spend(self, pos: int) -> list[_Item]:
        """(Lock held.) Credits for the next message: as many whole trajectories from `pos` as
        fit `chunk_bytes`, or the one at `pos` alone if it needs chunks."""
        group: list[_Item] = []
        size = 0
        for item in self._todo[pos:pos + self._credits]:
            size += item.size + 8  # + its tag and length inside the batch
            if group and size > self._chunk_bytes:
                break
            group.append(item)
            if item.size > self._chunk_bytes:
                break
        self._credits -= len(group)
        self._unacked.extend(group)
        return group

    def on_response(self, response: trajectory_pb2.PushResponse) -> None:
        with self._cond:
            for ack in response.acks:
                if (not self._unacked
                        or self._unacked[0].message.trajectory_id != ack.trajectory_id):
                    raise RuntimeError(f"ingest acknowledged {ack.trajectory_id!r} out of order")
                self._unacked.popleft().status = ack.status
            if response.HasField("grant"):
                grant = response.grant
                self._credits += grant.credits
                self._asking = False
                self.credit_waits += grant.waited
                if grant.max_message_bytes:
                    self._chunk_bytes = max(1024, min(self._chunk_bytes,
                                                      grant.max_message_bytes - _HEADROOM_BYTES))
                self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @staticmethod
    def _ask(want: int) -> trajectory_pb2.PushRequest:
        return trajectory_pb2.PushRequest(
            credit_request=trajectory_pb2.CreditRequest(want=want))


class TrajectorySender:
    """Streams finished trajectories to one learner ingest address. Thread-safe."""

    def __init__(
        self,
        address: str,
        *,
        deadline_s: float = 60.0,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        retries: int = 3,
        backoff_s: float = 0.5,
        auth_token: str | None = None,
        tls_ca_path: str | None = None,
    ) -> None:
        """`deadline_s` bounds each attempt, waiting for the learner to come up or for credits
        included; `retries` extra attempts follow a broken stream with backoff
        `backoff_s * 2**k`. Trajectories above `chunk_bytes` (or the learner's message limit,
        whichever is lower) travel in chunks. `tls_ca_path`: PEM roots to trust; the channel is
        then TLS (the learner must serve TLS), else plaintext."""
        if chunk_bytes < 1 or chunk_bytes > max_message_bytes - _HEADROOM_BYTES:
            raise ValueError(f"chunk_bytes {chunk_bytes} must be in [1, max_message_bytes - "
                             f"{_HEADROOM_BYTES}]")
        self._deadline_s = deadline_s
        self._chunk_bytes = chunk_bytes
        self._retries = retries
        self._backoff_s = backoff_s
        self._closed = False
        options = [
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
            # gRPC's default reconnect backoff starts at 1 s and grows to 120 s; a learner
            # that restarts should be found again within a couple of seconds.
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 2000),
        ]
        if tls_ca_path is None:
            self._channel = grpc.insecure_channel(address, options=options)
        else:
            creds = grpc.ssl_channel_credentials(root_certificates=Path(tls_ca_path).read_bytes())
            self._channel = grpc.secure_channel(address, creds, options=options)
        self._stub = trajectory_pb2_grpc.TrajectoryServiceStub(self._channel)
        self._metadata = (("authorization", f"Bearer {auth_token}"),) if auth_token else None

    def send(self, trajectories: Sequence[Trajectory]) -> PushResult:
        """Send `trajectories`; after a broken stream, resend those without an ack.

        Raises `grpc.RpcError` for other errors (DEADLINE_EXCEEDED, UNAUTHENTICATED, a protocol
        error) and for a broken stream once the retries are spent.
        """
        if not trajectories:
            return PushResult(received=0, duplicates=0, rejected=0, attempts=0)
        items = []
        for t in trajectories:  # encode once, resend as is
            message = to_proto(t)
            items.append(_Item(message, message.ByteSize()))
        waits = 0
        for attempt in range(self._retries + 1):
            todo = [i for i in items if i.status == trajectory_pb2.ACK_STATUS_UNSPECIFIED]
            if not todo:  # the broken stream had delivered every ack already
                return _result(items, attempts=attempt, credit_waits=waits)
            stream = _Attempt(todo, self._chunk_bytes)
            try:
                self._stream(stream)
            except grpc.RpcError as e:
                if not self._retryable(e) or attempt == self._retries:
                    raise
                time.sleep(self._backoff_s * 2**attempt)
                continue
            finally:
                waits += stream.credit_waits
            missing = sum(i.status == trajectory_pb2.ACK_STATUS_UNSPECIFIED for i in todo)
            if missing:
                raise RuntimeError(f"ingest closed the stream with {missing} trajectories "
                                   "unacknowledged")
            return _result(items, attempts=attempt + 1, credit_waits=waits)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _stream(self, stream: _Attempt) -> None:
        # wait_for_ready: a learner that is (re)starting is waited for within the deadline
        # instead of failing the attempt at once.
        call = self._stub.Push(stream.requests(), timeout=self._deadline_s,
                               wait_for_ready=True, metadata=self._metadata)
        try:
            for response in call:
                stream.on_response(response)
        finally:
            stream.close()  # frees gRPC's request thread if it waits for credits
            call.cancel()  # no-op once the call ended; ends it after an out-of-order ack

    def _retryable(self, e: grpc.RpcError) -> bool:
        """UNAVAILABLE, or CANCELLED by a learner shutting down (not by our own close())."""
        code = e.code()  # type: ignore[attr-defined]  # every RpcError a stub raises is a Call
        return code == grpc.StatusCode.UNAVAILABLE or (
            code == grpc.StatusCode.CANCELLED and not self._closed)

    def close(self) -> None:
        """Close the channel; in-flight sends fail with CANCELLED."""
        self._closed = True
        self._channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _result(items: list[_Item], *, attempts: int, credit_waits: int) -> PushResult:
    count = [i.status for i in items].count
    return PushResult(received=count(trajectory_pb2.ACK_STORED),
                      duplicates=count(trajectory_pb2.ACK_DUPLICATE),
                      rejected=count(trajectory_pb2.ACK_REJECTED), attempts=attempts,
                      stale=count(trajectory_pb2.ACK_STALE), credit_waits=credit_waits)
