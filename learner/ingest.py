"""TrajectoryIngest: the learner's gRPC endpoint for finished trajectories.

Generators open a client stream (`TrajectoryService.Push`) and send trajectories; the ingest
decodes each one into a `Trajectory`, drops duplicates by `trajectory_id` and keeps the rest in a
bounded buffer that the learner drains with `take` / `drain`.

Guarantees:
- exactly-once: every `trajectory_id` is stored at most once for the lifetime of this object, so
  a sender may resend a whole batch after a broken stream. Ids are remembered forever (a set of
  short strings: a whole run is ~10^5 episodes, a few MB).
- backpressure: when the buffer is full the stream blocks (up to `put_timeout_s`) instead of
  dropping; if no room frees up the stream ends with UNAVAILABLE and the sender retries later.
- a malformed message (length mismatch, unknown failure code, bad info JSON) is counted as
  rejected and skipped; the stream and the server go on.
- `stop()` then `start()` serves again on the same port with the same buffer and seen ids, so
  a restart does not break exactly-once.
"""

from __future__ import annotations

import hmac
import logging
import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent import futures
from typing import Any, Self

import grpc

from protos import trajectory_pb2, trajectory_pb2_grpc
from protos.codec import from_proto
from protos.trajectory import Trajectory

logger = logging.getLogger(__name__)

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # a 32k-token episode is ~0.3 MB: ample headroom


def is_wildcard(host: str) -> bool:
    """An address that binds every interface ("", 0.0.0.0, ::)."""
    return host.strip("[]") in ("", "0.0.0.0", "::")


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 and localhost: addresses no other machine can reach."""
    import ipaddress

    if host.strip("[]") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class _TokenCheck(grpc.ServerInterceptor):
    """Refuses calls without `authorization: Bearer <token>` (UNAUTHENTICATED)."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()
        self._refuse = grpc.stream_unary_rpc_method_handler(
            lambda _requests, ctx: ctx.abort(grpc.StatusCode.UNAUTHENTICATED,
                                             "missing or wrong ingest token"))

    def intercept_service(self, continuation: Any, details: Any) -> Any:
        sent = dict(details.invocation_metadata or ()).get("authorization", "")
        if hmac.compare_digest(str(sent).encode(), self._expected):
            return continuation(details)
        return self._refuse


class TrajectoryIngest:
    """gRPC server plus bounded, deduplicating buffer of trajectories. Thread-safe."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        capacity: int = 4096,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        put_timeout_s: float = 30.0,
        max_workers: int = 8,
        auth_token: str | None = None,
    ) -> None:
        """Configure the server; nothing listens until `start()`.

        `port=0` picks a free port at the first `start()` and keeps it for later restarts.
        `max_workers` bounds concurrent streams (one thread each); more streams queue in gRPC.
        `auth_token`: clients must send `authorization: Bearer <token>`; required when `host`
        is not a loopback address, so an ingest is never open to a network unauthenticated.
        """
        if auth_token is None and not is_loopback(host):
            raise ValueError(f"the trajectory ingest binds {host!r}, which is not loopback: "
                             "give it an auth token (learner.ingest.auth_token_env names the "
                             "environment variable that holds it)")
        self._auth_token = auth_token
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self._host = host
        self._port = port
        self._capacity = capacity
        self._max_message_bytes = max_message_bytes
        self._put_timeout_s = put_timeout_s
        self._max_workers = max_workers
        self._cond = threading.Condition()
        self._buffer: deque[Trajectory] = deque()
        self._seen: set[str] = set()
        self._stats = {"received": 0, "duplicates": 0, "rejected": 0, "bytes": 0}
        self._stopping = False
        self._server: grpc.Server | None = None

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
            # gRPC enables SO_REUSEPORT by default: a second server on the same explicit port
            # would then bind silently and steal half the streams. Fail the bind instead.
            ("grpc.so_reuseport", 0),
        ]
        interceptors = [] if self._auth_token is None else [_TokenCheck(self._auth_token)]
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=self._max_workers, thread_name_prefix="ingest"),
            options=options,
            interceptors=interceptors,
        )
        trajectory_pb2_grpc.add_TrajectoryServiceServicer_to_server(_Servicer(self), server)
        try:
            bound = server.add_insecure_port(f"{self._host}:{self._port}")
        except RuntimeError as e:  # grpc raises when the port is taken
            raise RuntimeError(f"cannot bind trajectory ingest to {self._host}:{self._port}") from e
        if bound == 0:
            raise RuntimeError(f"cannot bind trajectory ingest to {self._host}:{self._port}")
        self._port = bound
        with self._cond:
            self._stopping = False
        server.start()
        self._server = server
        logger.info("trajectory ingest listening on %s", self.address)
        return self

    def stop(self, grace: float = 1.0) -> None:
        """Stop serving; streams blocked on a full buffer end with UNAVAILABLE. Keeps the data."""
        server, self._server = self._server, None
        if server is None:
            return
        with self._cond:
            self._stopping = True  # wakes handlers blocked on a full buffer
            self._cond.notify_all()
        server.stop(grace).wait()

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
            out = [self._buffer.popleft() for _ in range(min(n, len(self._buffer)))]
            self._cond.notify_all()  # room for blocked senders
        return out

    def drain(self) -> list[Trajectory]:
        """Return everything buffered now, without waiting."""
        with self._cond:
            out = list(self._buffer)
            self._buffer.clear()
            self._cond.notify_all()
        return out

    def stats(self) -> dict[str, int]:
        """Counters since construction: received, duplicates, rejected, bytes, queue_depth."""
        with self._cond:
            return {**self._stats, "queue_depth": len(self._buffer)}

    # ---- generator side (called from gRPC handler threads) ----------------------------------

    def _push(
        self, requests: Iterator[trajectory_pb2.Trajectory], context: grpc.ServicerContext
    ) -> trajectory_pb2.PushAck:
        ack = trajectory_pb2.PushAck()
        # A cancelled stream (client deadline, disconnect) must not sit out put_timeout_s.
        context.add_callback(self._wake)
        for message in requests:
            with self._cond:
                self._stats["bytes"] += message.ByteSize()
            try:
                trajectory = from_proto(message)
                if not trajectory.trajectory_id:  # dedup is keyed on it: no id, no exactly-once
                    raise ValueError("empty trajectory_id")
            except (ValueError, TypeError) as e:
                logger.warning("rejected malformed trajectory %r: %s", message.trajectory_id, e)
                with self._cond:
                    self._stats["rejected"] += 1
                ack.rejected += 1
                continue
            if self._store(trajectory, context):
                ack.received += 1
            else:
                ack.duplicates += 1
        return ack

    def _store(self, t: Trajectory, context: grpc.ServicerContext) -> bool:
        """Buffer `t` unless its id was seen; True if stored. Blocks while the buffer is full."""
        deadline = time.monotonic() + self._put_timeout_s
        with self._cond:
            while t.trajectory_id not in self._seen and len(self._buffer) >= self._capacity:
                remaining = deadline - time.monotonic()
                if self._stopping or remaining <= 0 or not context.is_active():
                    # UNAVAILABLE tells the sender to retry the batch later; what this stream
                    # stored so far is in _seen, so the retry cannot duplicate it.
                    why = "stopping" if self._stopping else "buffer full"
                    context.abort(grpc.StatusCode.UNAVAILABLE, f"trajectory ingest {why}")
                self._cond.wait(remaining)
            # Checked after waiting: another stream may have stored the same id meanwhile.
            if t.trajectory_id in self._seen:
                self._stats["duplicates"] += 1
                return False
            self._seen.add(t.trajectory_id)
            self._buffer.append(t)
            self._stats["received"] += 1
            self._cond.notify_all()  # wake take()
            return True

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def __repr__(self) -> str:
        return f"TrajectoryIngest({self.address}, {self.stats()})"


class _Servicer(trajectory_pb2_grpc.TrajectoryServiceServicer):
    """Thin adapter: the generated servicer interface calls into the ingest."""

    def __init__(self, ingest: TrajectoryIngest) -> None:
        self._ingest = ingest

    def Push(self, request_iterator: Any, context: grpc.ServicerContext) -> Any:
        return self._ingest._push(request_iterator, context)
