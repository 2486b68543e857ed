"""TrajectorySender: the generator's client for the learner's `TrajectoryService`.

A batch goes out on one `Push` stream against credits (protos/trajectory.proto): the sender
asks for credits, sends one trajectory per credit, waits when it has none (the learner's buffer
is full), and gets an ack for each trajectory. Small trajectories share messages; one too large
for a message goes as chunks. If the stream breaks (UNAVAILABLE: learner restarting, network
blip, learner full for too long) a new stream resends every trajectory without an ack, after a
backoff; the learner deduplicates by `trajectory_id`, so a retry never stores anything twice.

Batches are pipelined: `send_async` encodes the batch and returns; a stream (actors/
push_stream.py) takes it, and keeps taking the batches pushed while it runs, asking for credits
before it runs out and settling each batch's future as its acks arrive. So the sender encodes
the next batch while the learner decodes the last one, and nothing waits for a round trip
between batches. Up to `max_inflight` streams run at once. Each trajectory is encoded to bytes
once (its token lists copied once, into the message that is serialized) and resent as is.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Self

import grpc

from horizonrl.actors.push_stream import (
    HEADROOM_BYTES,
    Batch,
    Item,
    PushResult,
    PushStream,
    take_queued,
)
from horizonrl.protos import trajectory_pb2
from horizonrl.protos.codec import encode
from horizonrl.protos.trajectory import Trajectory

__all__ = ["PushResult", "TrajectorySender"]

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # matches the ingest's receive limit
DEFAULT_CHUNK_BYTES = 4 * 1024 * 1024  # gRPC's default message limit: fine for any peer
# A stream with nothing left to send waits this long for another batch before it half-closes:
# batches pushed turn after turn ride one stream, and an idle one holds few credits.
LINGER_S = 0.5
_PUSH_METHOD = "/{}/Push".format(
    trajectory_pb2.DESCRIPTOR.services_by_name["TrajectoryService"].full_name)


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
        max_inflight: int = 1,
    ) -> None:
        """`deadline_s` bounds each stream, waiting for the learner to come up or for credits
        included (a stream adopts new batches only in its first half); `retries` extra
        attempts follow a broken stream with backoff `backoff_s * 2**k`. Trajectories above
        `chunk_bytes` (or the learner's message limit, whichever is lower) travel in chunks.
        `tls_ca_path`: PEM roots to trust; the channel is then TLS (the learner must serve
        TLS), else plaintext. `max_inflight`: streams open at once for `send_async` batches
        (1: one stream at a time)."""
        if max_inflight < 1:
            raise ValueError(f"max_inflight must be >= 1, got {max_inflight}")
        if chunk_bytes < 1 or chunk_bytes > max_message_bytes - HEADROOM_BYTES:
            raise ValueError(f"chunk_bytes {chunk_bytes} must be in [1, max_message_bytes - "
                             f"{HEADROOM_BYTES}]")
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
        # Requests go out as the bytes `PushStream` put together (no message to serialize
        # again).
        self._push = self._channel.stream_stream(
            _PUSH_METHOD, request_serializer=bytes,
            response_deserializer=trajectory_pb2.PushResponse.FromString)
        # Batches waiting for a stream: a free worker opens one with every batch waiting, and
        # the stream keeps taking batches queued while it runs (`_pull`).
        self._queue: deque[Batch] = deque()
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
        """`send` on one of the sender's `max_inflight` streams: returns once the batch is
        encoded (a trajectory that cannot be encoded raises here); the future gives the
        PushResult as soon as the learner acked the batch's last trajectory, or raises what
        `send` would. Batches may be stored in any order."""
        if self._closed:
            raise RuntimeError("TrajectorySender is closed")
        # Encoded here, once (resent as is): the caller encodes the next batch while the
        # streams wait for the learner, which keeps the learner busy decoding.
        items = []
        for t in trajectories:
            items.append(Item(t.trajectory_id, encode(t)))
            # Encoding holds the GIL; without a pause the streams' threads wait up to the
            # interpreter's switch interval (5 ms) for each step of each message.
            time.sleep(0)
        batch = Batch(items)
        if not batch.items:
            batch.future.set_result(batch.result(0))
            return batch.future
        with self._queue_cond:
            self._queue.append(batch)
            # All: a stream that has just ended may be among the waiters, and it leaves the
            # batch for a worker, which must be awake to take it.
            self._queue_cond.notify_all()
        return batch.future

    def _work(self) -> None:
        """A worker: a stream for whatever batches wait (and those queued while it runs)."""
        while True:
            with self._queue_cond:
                while not self._queue and not self._closed:
                    self._queue_cond.wait()
                if self._closed:
                    return
                taken = take_queued(self._queue)
            if taken:
                self._deliver(taken)

    def _deliver(self, batches: list[Batch]) -> None:
        """Send `batches` (and what their stream adopts) until every one is settled: resend
        what has no ack on a new stream after a break, within the retries; else fail them."""
        pull = self._pull
        for attempt in range(self._retries + 1):
            stream = PushStream(batches, self._chunk_bytes, pull)
            pull = None  # a retry resends; new batches go to a fresh stream
            try:
                self._stream(stream)
                error: Exception | None = None
            except Exception as e:  # a broken stream (RpcError), or an ingest breaking protocol
                error = e
            batches = stream.open_batches()
            if not batches:
                return
            if error is None:
                error = RuntimeError(f"ingest closed the stream with {len(batches)} batches "
                                     "unacknowledged")
            elif (isinstance(error, grpc.RpcError) and self._retryable(error)
                  and attempt < self._retries):
                time.sleep(self._backoff_s * 2**attempt)
                continue
            break
        for b in batches:
            b.future.set_exception(error)

    def _pull(self, stream: PushStream) -> bool:
        """(gRPC's request thread.) Adopt the batches queued while `stream` sent, waiting up to
        LINGER_S for one; False ends the stream. A stream stops adopting halfway to its
        deadline, so that what it adopted has time to be acked."""
        until = min(time.monotonic() + LINGER_S, stream.opened + self._deadline_s / 2)
        with self._queue_cond:
            while not self._queue:
                left = until - time.monotonic()
                if self._closed or stream.closed or left <= 0:
                    return False
                self._queue_cond.wait(min(left, 0.05))  # wakes for the stream's end, too
            return stream.adopt(self._queue)

    def _stream(self, stream: PushStream) -> None:
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
        for b in waiting:
            if b.future.set_running_or_notify_cancel():
                b.future.set_exception(
                    RuntimeError("TrajectorySender closed before the batch was sent"))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

