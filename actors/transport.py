"""TrajectorySender: the generator's client for the learner's `TrajectoryService`.

A batch goes out on one `Push` stream against credits (protos/trajectory.proto): the sender
asks for credits, sends one trajectory per credit, waits when it has none (the learner's buffer
is full), and gets an ack for each trajectory. Small trajectories share messages; one too large
for a message goes as chunks. If the stream breaks (UNAVAILABLE: learner restarting, network
blip, learner full for too long) a new stream resends every trajectory without an ack, after a
backoff; the learner deduplicates by `trajectory_id`, so a retry never stores anything twice.

Batches are pipelined: `send_async` returns at once and up to `max_inflight` batches are on
their own streams at the same time, so the sender encodes the next batch while the learner
decodes the last one instead of waiting for its acks. Each trajectory is encoded to bytes once
(its token lists copied once, into the message that is serialized); requests are put together
from those bytes on the wire format, never by copying messages into a batch message.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import grpc

from horizonrl.protos import trajectory_pb2
from horizonrl.protos.codec import encode, to_chunks
from horizonrl.protos.trajectory import Trajectory

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # matches the ingest's receive limit
DEFAULT_CHUNK_BYTES = 4 * 1024 * 1024  # gRPC's default message limit: fine for any peer
_HEADROOM_BYTES = 4096  # a chunk's id, counters and framing on top of its data
_MERGE_TRAJECTORIES = 256  # at most this many trajectories of waiting batches on one stream
_PUSH_METHOD = "/{}/Push".format(
    trajectory_pb2.DESCRIPTOR.services_by_name["TrajectoryService"].full_name)
_BATCH_FIELD = trajectory_pb2.PushRequest.DESCRIPTOR.fields_by_name["batch"].number
_TRAJECTORIES_FIELD = trajectory_pb2.TrajectoryBatch.DESCRIPTOR.fields_by_name[
    "trajectories"].number


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

    trajectory_id: str
    data: bytes  # the encoded horizonrl.v1.Trajectory
    status: int = trajectory_pb2.ACK_STATUS_UNSPECIFIED  # the learner's verdict, once acked

    @property
    def size(self) -> int:
        return len(self.data)


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _length_delimited(field: int, payload: bytes) -> bytes:
    """One length-delimited protobuf field (wire type 2) around `payload`."""
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def _batch_request(items: Sequence[_Item]) -> bytes:
    """A serialized PushRequest{batch: TrajectoryBatch{trajectories: ...}} from the items'
    bytes, byte for byte what serializing the message would give."""
    return _length_delimited(_BATCH_FIELD, b"".join(
        _length_delimited(_TRAJECTORIES_FIELD, i.data) for i in items))


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

    def requests(self) -> Iterator[bytes]:
        """The stream's serialized PushRequests: a credit request, then messages as credits
        allow."""
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
                for chunk in to_chunks(group[0].trajectory_id, group[0].data, chunk_bytes):
                    yield trajectory_pb2.PushRequest(chunk=chunk).SerializeToString()
            else:
                yield _batch_request(group)

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
                        or self._unacked[0].trajectory_id != ack.trajectory_id):
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
    def _ask(want: int) -> bytes:
        return trajectory_pb2.PushRequest(
            credit_request=trajectory_pb2.CreditRequest(want=want)).SerializeToString()


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
        max_inflight: int = 2,
    ) -> None:
        """`deadline_s` bounds each attempt, waiting for the learner to come up or for credits
        included; `retries` extra attempts follow a broken stream with backoff
        `backoff_s * 2**k`. Trajectories above `chunk_bytes` (or the learner's message limit,
        whichever is lower) travel in chunks. `tls_ca_path`: PEM roots to trust; the channel is
        then TLS (the learner must serve TLS), else plaintext. `max_inflight`: batches of
        `send_async` on the wire at once (each on its own stream; 1 sends one after another)."""
        if max_inflight < 1:
            raise ValueError(f"max_inflight must be >= 1, got {max_inflight}")
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
        # Requests go out as the bytes `_Attempt` put together (no message to serialize again).
        self._push = self._channel.stream_stream(
            _PUSH_METHOD, request_serializer=bytes,
            response_deserializer=trajectory_pb2.PushResponse.FromString)
        # Batches waiting for a stream; a free worker takes every one waiting (whole batches,
        # up to _MERGE_TRAJECTORIES) onto one stream: one credit round trip and one set of acks
        # for all of them, instead of one per batch.
        self._queue: deque[tuple[list[_Item], Future[PushResult]]] = deque()
        self._queue_cond = threading.Condition()
        self._workers = [threading.Thread(target=self._work, daemon=True,
                                          name=f"trajectory-push-{k}")
                         for k in range(max_inflight)]
        for w in self._workers:
            w.start()
        self._metadata = (("authorization", f"Bearer {auth_token}"),) if auth_token else None

    def send(self, trajectories: Sequence[Trajectory]) -> PushResult:
        """Send `trajectories`; after a broken stream, resend those without an ack.

        Raises `grpc.RpcError` for other errors (DEADLINE_EXCEEDED, UNAUTHENTICATED, a protocol
        error) and for a broken stream once the retries are spent.
        """
        return self.send_async(trajectories).result()

    def send_async(self, trajectories: Sequence[Trajectory]) -> Future[PushResult]:
        """`send` on one of the sender's `max_inflight` workers: returns once the batch is
        encoded (a trajectory that cannot be encoded raises here); the future gives the
        PushResult or raises what `send` would. Batches are independent (each has its own
        stream, acks and retries), so they may be stored in any order."""
        if self._closed:
            raise RuntimeError("TrajectorySender is closed")
        # Encoded here, once (resent as is): the caller encodes the next batch while the
        # workers' streams wait for the learner, which keeps the learner busy decoding.
        items = [_Item(t.trajectory_id, encode(t)) for t in trajectories]
        future: Future[PushResult] = Future()
        with self._queue_cond:
            self._queue.append((items, future))
            self._queue_cond.notify()
        return future

    def _work(self) -> None:
        """A worker: send whatever batches wait, merged onto one stream; settle each batch's
        future from its own items' acks."""
        while True:
            with self._queue_cond:
                while not self._queue and not self._closed:
                    self._queue_cond.wait()
                if self._closed:
                    return
                taken = [self._queue.popleft()]
                size = len(taken[0][0])
                while self._queue and size + len(self._queue[0][0]) <= _MERGE_TRAJECTORIES:
                    size += len(self._queue[0][0])
                    taken.append(self._queue.popleft())
            live = [(items, f) for items, f in taken if f.set_running_or_notify_cancel()]
            try:
                merged = self._send([i for items, _ in live for i in items])
            except BaseException as e:  # every batch on the stream fails alike
                for _, f in live:
                    f.set_exception(e)
                continue
            for items, f in live:
                f.set_result(_result(items, attempts=merged.attempts,
                                     credit_waits=merged.credit_waits))

    def _send(self, items: list[_Item]) -> PushResult:
        if not items:
            return PushResult(received=0, duplicates=0, rejected=0, attempts=0)
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
        call = self._push(stream.requests(), timeout=self._deadline_s, wait_for_ready=True,
                          metadata=self._metadata)
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
        with self._queue_cond:
            waiting, self._queue = list(self._queue), deque()
            self._queue_cond.notify_all()
        for _, f in waiting:
            if f.set_running_or_notify_cancel():
                f.set_exception(RuntimeError("TrajectorySender closed before the batch was sent"))

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
