"""TrajectoryIngest: the learner's gRPC endpoint for finished trajectories.

Generators open a `TrajectoryService.Push` stream, ask for credits and send one trajectory per
credit (several to a message, or one in chunks when too large for one); the ingest decodes
each into a `Trajectory`, drops duplicates by `trajectory_id`, acknowledges every one, and keeps
the new ones in a bounded buffer that the learner drains with `take` / `drain`. The protocol is
described in protos/trajectory.proto.

Guarantees:
- bounded memory: credits are granted only for free buffer space (capacity - buffered -
  granted but unused), so the buffer never exceeds `capacity`; a stream that finds no space waits
  (up to `credit_timeout_s`, counted in `credit_waits`) and then ends with UNAVAILABLE. A stream
  reassembles at most one chunked trajectory, of at most `max_trajectory_bytes`.
- exactly-once: a `trajectory_id` is stored at most once among the latest `dedup_window` stored
  ids (learner/recent_ids.py), so a sender may resend whatever was not acknowledged after a
  broken stream; memory stays bounded on long runs.
- a malformed trajectory (length mismatch, unknown failure code, bad info JSON) is acked
  REJECTED and skipped; protocol errors end only their own stream, with a status code.
- `stop()` then `start()` serves again on the same port with the same buffer and seen ids, so
  a restart does not break exactly-once.
- the standard `grpc.health.v1.Health/Check` answers SERVING while the ingest runs; it needs no
  token (probes cannot send one, and it reveals nothing).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent import futures
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Self

import grpc

from horizonrl.learner.ingest_guard import Health, TokenCheck, is_loopback
from horizonrl.learner.ingest_stream import (
    STAT_OF,
    Entry,
    StreamState,
    decode_entry,
    parse_request,
    parse_trajectory,
)
from horizonrl.learner.recent_ids import RecentIds
from horizonrl.protos import health_pb2_grpc, trajectory_pb2
from horizonrl.protos.batch_wire import split_batch
from horizonrl.protos.codec import ChunkError, decode, from_proto
from horizonrl.protos.placement import is_wildcard
from horizonrl.protos.trajectory import Trajectory

if TYPE_CHECKING:
    from horizonrl.learner.config import IngestConfig

logger = logging.getLogger(__name__)

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # a 32k-token episode is ~0.3 MB: ample headroom
DEFAULT_MAX_TRAJECTORY_BYTES = 64 * 1024 * 1024  # reassembly bound per stream
SERVICE_NAME = trajectory_pb2.DESCRIPTOR.services_by_name["TrajectoryService"].full_name
class TrajectoryIngest:
    """gRPC server plus bounded, deduplicating buffer of trajectories. Thread-safe."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        capacity: int = 4096,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        max_trajectory_bytes: int = DEFAULT_MAX_TRAJECTORY_BYTES,
        credit_timeout_s: float = 30.0,
        max_credits_per_grant: int = 64,
        max_workers: int = 8,
        auth_token: str | None = None,
        tls_cert_path: str | None = None,
        tls_key_path: str | None = None,
        dedup_window: int = 1_000_000,
    ) -> None:
        """Configure the server; nothing listens until `start()`.

        `port=0` picks a free port at the first `start()` and keeps it for later restarts.
        `max_workers` bounds concurrent streams (one thread each); more streams queue in gRPC.
        `max_credits_per_grant` keeps one stream from reserving the whole buffer.
        `auth_token`: clients must send `authorization: Bearer <token>`; required when `host`
        is not a loopback address, so an ingest is never open to a network unauthenticated.
        `tls_cert_path`/`tls_key_path` (PEM): serve TLS instead of plaintext.
        `dedup_window`: how many of the latest stored ids are remembered for exactly-once.
        """
        if auth_token is None and not is_loopback(host):
            raise ValueError(f"the trajectory ingest binds {host!r}, which is not loopback: "
                             "give it an auth token (learner.ingest.auth_token_env names the "
                             "environment variable that holds it)")
        if capacity < 1 or max_credits_per_grant < 1:
            raise ValueError(f"capacity ({capacity}) and max_credits_per_grant "
                             f"({max_credits_per_grant}) must be >= 1")
        if (tls_cert_path is None) != (tls_key_path is None):
            raise ValueError("give tls_cert_path and tls_key_path together, or neither")
        self._host, self._port, self._capacity = host, port, capacity
        self._max_message_bytes = max_message_bytes
        self._max_trajectory_bytes = max_trajectory_bytes
        self._credit_timeout_s = credit_timeout_s
        self._max_grant = max_credits_per_grant
        self._max_workers = max_workers
        self._auth_token = auth_token
        self._tls = (tls_cert_path, tls_key_path) if tls_cert_path and tls_key_path else None
        self._cond = threading.Condition()
        self._buffer: deque[tuple[Trajectory, int]] = deque()  # (trajectory, encoded bytes)
        self._buffered_bytes = 0
        self._reserved = 0  # credits held by streams: buffer + reserved <= capacity
        self._seen = RecentIds(dedup_window)
        self._stats = dict.fromkeys(
            ("received", "duplicates", "rejected", "bytes", "chunks",
             "partial_discarded", "credit_waits", "queue_depth_peak"), 0)
        self._stopping = False
        self._server: grpc.Server | None = None

    @classmethod
    def from_config(cls, cfg: IngestConfig, *, auth_token: str | None = None) -> Self:
        """An ingest configured by the run config's `learner.ingest` section."""
        return cls(host=cfg.host, port=cfg.port, capacity=cfg.capacity,
                   max_message_bytes=cfg.max_message_bytes,
                   max_trajectory_bytes=cfg.max_trajectory_bytes, auth_token=auth_token,
                   tls_cert_path=cfg.tls_cert_path, tls_key_path=cfg.tls_key_path,
                   dedup_window=cfg.dedup_window)

    # ---- server lifecycle -------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The bound port (the requested one before the first `start()`)."""
        return self._port

    @property
    def address(self) -> str:
        """`host:port` a client on this machine can dial."""
        host = "127.0.0.1" if is_wildcard(self._host) else self._host
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"{host}:{self._port}"

    def start(self) -> Self:
        """Bind and serve. Starting a running ingest is an error."""
        if self._server is not None:
            raise RuntimeError("TrajectoryIngest is already running")
        options = [
            ("grpc.max_receive_message_length", self._max_message_bytes),
            ("grpc.max_send_message_length", self._max_message_bytes),
            # gRPC enables SO_REUSEPORT by default: a second server on the same explicit port
            # would then bind silently and steal half the streams. Fail the bind instead.
            ("grpc.so_reuseport", 0),
        ]
        interceptors = [] if self._auth_token is None else [TokenCheck(self._auth_token)]
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=self._max_workers, thread_name_prefix="ingest"),
            options=options,
            interceptors=interceptors,
        )
        # Registered by hand rather than with the generated helper: its deserializer would turn
        # undecodable bytes into INTERNAL; the handler parses and answers INVALID_ARGUMENT.
        push = grpc.stream_stream_rpc_method_handler(
            self._push, request_deserializer=None,  # bytes: batches are split, not parsed whole
            response_serializer=trajectory_pb2.PushResponse.SerializeToString)
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE_NAME, {"Push": push}),))
        health_pb2_grpc.add_HealthServicer_to_server(
            Health(SERVICE_NAME, lambda: self.serving), server)
        target = f"{self._host}:{self._port}"
        try:
            if self._tls is None:
                bound = server.add_insecure_port(target)
            else:
                cert, key = (Path(p).read_bytes() for p in self._tls)
                bound = server.add_secure_port(target, grpc.ssl_server_credentials([(key, cert)]))
        except RuntimeError as e:  # grpc raises when the port is taken
            raise RuntimeError(f"cannot bind trajectory ingest to {target}") from e
        if bound == 0:
            raise RuntimeError(f"cannot bind trajectory ingest to {target}")
        self._port = bound
        with self._cond:
            self._stopping = False
        server.start()
        self._server = server
        logger.info("trajectory ingest listening on %s%s", self.address,
                    " (TLS)" if self._tls else "")
        return self

    def stop(self, grace: float = 1.0) -> None:
        """Stop serving; streams end (UNAVAILABLE for those waiting on credits). Keeps the data."""
        server, self._server = self._server, None
        if server is None:
            return
        with self._cond:
            self._stopping = True  # health says NOT_SERVING; wakes streams waiting on credits
            self._cond.notify_all()
        server.stop(grace).wait()

    @property
    def serving(self) -> bool:
        """Whether the server is up and accepting streams (what the health check reports)."""
        return self._server is not None and not self._stopping

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- learner side -----------------------------------------------------------------------

    def take(self, n: int, timeout: float) -> list[Trajectory]:
        """Wait up to `timeout` s for `n` trajectories; return up to `n`, possibly fewer."""
        deadline = time.monotonic() + max(timeout, 0.0)
        with self._cond:
            while len(self._buffer) < n:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            return self._pop(min(n, len(self._buffer)))

    def drain(self) -> list[Trajectory]:
        """Return everything buffered now, without waiting."""
        with self._cond:
            return self._pop(len(self._buffer))

    def stats(self) -> dict[str, int]:
        """Counters since construction (received, duplicates, rejected; bytes of
        encoded trajectories received, duplicates included; chunks, partial_discarded chunk
        sets, credit_waits, queue_depth_peak) and the state now (queue_depth, buffered_bytes,
        reserved credits, capacity)."""
        with self._cond:
            return {**self._stats, "queue_depth": len(self._buffer),
                    "buffered_bytes": self._buffered_bytes, "reserved": self._reserved,
                    "capacity": self._capacity}

    def _pop(self, n: int) -> list[Trajectory]:
        out = [self._buffer.popleft() for _ in range(n)]
        self._buffered_bytes -= sum(size for _, size in out)
        self._cond.notify_all()  # free space: streams waiting for credits may go on
        return [t for t, _ in out]

    # ---- generator side (called from gRPC handler threads) ----------------------------------

    def _push(self, requests: Iterator[bytes],
              context: grpc.ServicerContext) -> Iterator[trajectory_pb2.PushResponse]:
        stream = StreamState()
        # Whatever ends the stream (client gone, deadline, stop) returns its credits and wakes
        # it if it waits for space; the finally below does the same for a normal end.
        context.add_callback(lambda: self._close(stream))
        try:
            for data in requests:
                parts = split_batch(data)
                if parts is not None:  # a batch as senders build it: no whole-message parse
                    messages = [(parse_trajectory(p, context), len(p)) for p in parts]
                    yield trajectory_pb2.PushResponse(acks=self._whole(stream, messages, context))
                    continue
                request = parse_request(data)
                kind = request.WhichOneof("kind")
                if kind == "credit_request":
                    grant = self._grant(stream, request.credit_request.want, context)
                    yield trajectory_pb2.PushResponse(grant=grant)
                    continue
                if kind == "batch":
                    acks = self._whole(stream, [(m, m.ByteSize())
                                                for m in request.batch.trajectories], context)
                elif kind == "chunk":
                    ack = self._chunk(stream, request.chunk, context)
                    acks = [ack] if ack is not None else []
                else:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                  "empty or undecodable horizonrl.v1.PushRequest")
                if acks:  # one response per message (up to 4 MB of them), not per trajectory
                    yield trajectory_pb2.PushResponse(acks=acks)
        finally:
            self._close(stream)

    def _grant(self, stream: StreamState, want: int,
               context: grpc.ServicerContext) -> trajectory_pb2.CreditGrant:
        """Reserve up to `want` free slots for `stream`, waiting while there are none, unless
        the stream still holds credits: it asked ahead, and what it sends with them is behind
        this request, so waiting could hold space that only this stream can free."""
        want = max(0, min(want, self._max_grant))
        deadline = time.monotonic() + self._credit_timeout_s
        waited = False
        with self._cond:
            while (want and stream.credits == 0
                   and self._capacity - len(self._buffer) - self._reserved <= 0):
                if not waited:
                    self._stats["credit_waits"] += 1
                    waited = True
                remaining = deadline - time.monotonic()
                if self._stopping or stream.closed or remaining <= 0:
                    # UNAVAILABLE: the sender retries later what was not acknowledged.
                    why = "stopping" if self._stopping else "buffer full"
                    context.abort(grpc.StatusCode.UNAVAILABLE, f"trajectory ingest {why}")
                self._cond.wait(remaining)
            if stream.closed:  # its reservations were returned already: reserve no more
                context.abort(grpc.StatusCode.CANCELLED, "stream closed")
            n = max(0, min(want, self._capacity - len(self._buffer) - self._reserved))
            self._reserved += n
            stream.credits += n
            stream.held += n
        return trajectory_pb2.CreditGrant(credits=n, waited=waited,
                                          max_message_bytes=self._max_message_bytes,
                                          max_trajectory_bytes=self._max_trajectory_bytes)

    def _spend(self, stream: StreamState, context: grpc.ServicerContext) -> None:
        """Count one trajectory against the stream's credits; none left is a protocol error."""
        if stream.credits <= 0:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          "trajectory sent without a credit: ask with a CreditRequest first")
        stream.credits -= 1

    def _whole(self, stream: StreamState, messages: list[tuple[trajectory_pb2.Trajectory, int]],
               context: grpc.ServicerContext) -> list[trajectory_pb2.Ack]:
        """Take the trajectories of one batch message (each sent whole; its encoded size)."""
        if stream.assembler.active is not None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"trajectory sent inside chunk set {stream.assembler.active!r}")
        entries = []
        for m, size in messages:
            self._spend(stream, context)
            entries.append(Entry(m.trajectory_id, partial(from_proto, m), size))
        with self._cond:
            self._stats["bytes"] += sum(e.size for e in entries)
        return self._resolve(stream, entries)

    def _chunk(self, stream: StreamState, chunk: trajectory_pb2.Chunk,
               context: grpc.ServicerContext) -> trajectory_pb2.Ack | None:
        """Add one chunk; the trajectory's ack once its set is complete."""
        if chunk.index == 0 and stream.assembler.active is None:
            self._spend(stream, context)
            with self._cond:
                seen = chunk.trajectory_id in self._seen
            stream.chunked_status = None
            if chunk.total_bytes > self._max_trajectory_bytes:
                stream.chunked_status = (trajectory_pb2.ACK_REJECTED,
                                         f"{chunk.total_bytes} bytes exceed the ingest's "
                                         f"max_trajectory_bytes {self._max_trajectory_bytes}")
            elif seen:  # a resend of a stored trajectory: check the chunks, keep no bytes
                stream.chunked_status = (trajectory_pb2.ACK_DUPLICATE, "")
        with self._cond:
            self._stats["bytes"] += len(chunk.data)
            self._stats["chunks"] += 1
        try:
            done = stream.assembler.add(chunk, keep=stream.chunked_status is None)
        except ChunkError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        if done is None:
            return None
        if done.data is None:
            verdict = stream.chunked_status or (trajectory_pb2.ACK_REJECTED, "")
            entry = Entry(done.trajectory_id, None, verdict=verdict)
        else:
            entry = Entry(done.trajectory_id, partial(decode, done.data), len(done.data))
        return self._resolve(stream, [entry])[0]

    def _resolve(self, stream: StreamState, entries: list[Entry]) -> list[trajectory_pb2.Ack]:
        """Settle spent credits: store what each entry's `build` decodes, or give the reason
        it is not stored. One message's entries share the locking and one wake-up of take()."""
        with self._cond:
            known = [e.trajectory_id in self._seen for e in entries]
        decoded = [decode_entry(e, k) for e, k in zip(entries, known)]  # outside the lock
        with self._cond:
            if stream.closed:
                # Its reservations went back to the pool already, so storing could overfill
                # the buffer; its sender never sees these acks and resends the trajectories.
                return [trajectory_pb2.Ack(trajectory_id=e.trajectory_id) for e in entries]
            acks = []
            for e, (trajectory, status, detail) in zip(entries, decoded):
                stream.held -= 1
                self._reserved -= 1
                # Checked again under the lock: another stream (or an earlier trajectory of
                # this message) may have stored the same id.
                if trajectory is not None and trajectory.trajectory_id in self._seen:
                    status, trajectory = trajectory_pb2.ACK_DUPLICATE, None
                if trajectory is not None:
                    self._seen.add(trajectory.trajectory_id)
                    self._buffer.append((trajectory, e.size))
                    self._buffered_bytes += e.size
                self._stats[STAT_OF[status]] += 1
                acks.append(trajectory_pb2.Ack(trajectory_id=e.trajectory_id, status=status,
                                               detail=detail))
            self._stats["queue_depth_peak"] = max(self._stats["queue_depth_peak"],
                                                  len(self._buffer))
            self._cond.notify_all()  # wakes take(), and grant() if a credit came back
        return acks

    def _close(self, stream: StreamState) -> None:
        """Return the stream's reservations and drop its partial chunk set (idempotent)."""
        with self._cond:
            if stream.closed:
                return
            stream.closed = True
            self._reserved -= stream.held
            stream.held = stream.credits = 0
            if stream.assembler.discard():
                self._stats["partial_discarded"] += 1
            self._cond.notify_all()

    def __repr__(self) -> str:
        return f"TrajectoryIngest({self.address}, {self.stats()})"
