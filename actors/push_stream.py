"""One Push stream of the trajectory sender: what goes out on it and what its acks settle.

The stream keeps the wire busy the way a TCP window does: it asks for more credits while it
still holds half of its last grant (so trajectories keep flowing while the learner answers),
sends as credits allow, and takes batches queued meanwhile onto the same stream (`pull`), so
a sender pushing batch after batch pays one stream setup and no credit round trip between
batches. Acks arrive while it sends; each settles its batch's future as soon as the batch's
last trajectory has a verdict, and sent trajectories are dropped from the stream once acked,
so memory is bounded by the credits however long the stream lives.

Messages are put together from each trajectory's encoded bytes (protos/batch_wire.py).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field

from horizonrl.protos import trajectory_pb2
from horizonrl.protos.batch_wire import batch_request
from horizonrl.protos.codec import to_chunks

HEADROOM_BYTES = 4096  # a chunk's id, counters and framing on top of its data
# Whole trajectories share messages up to this size: small enough that the learner decodes one
# while the next travels, large enough that per-message costs do not count.
MESSAGE_BYTES = 1 << 20
_UNSPECIFIED = trajectory_pb2.ACK_STATUS_UNSPECIFIED


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
    """Streams this batch went out on (1 = no retry)."""
    stale: int = 0
    """Trajectories the learner dropped as too far behind its policy version."""
    credit_waits: int = 0
    """Credit grants the learner held back because its buffer was full, on those streams."""


@dataclass(slots=True, eq=False)
class Batch:
    """One `send_async` call: its trajectories and the future their acks settle."""

    items: list[Item]
    future: Future[PushResult] = field(default_factory=Future)
    pending: int = 0  # items without a verdict yet
    attempts: int = 0  # streams it went out on
    credit_waits: int = 0  # of its earlier, broken streams

    def __post_init__(self) -> None:
        self.pending = len(self.items)
        for item in self.items:
            item.batch = self

    def unacked(self) -> list[Item]:
        return [i for i in self.items if i.status == _UNSPECIFIED]

    def result(self, credit_waits: int) -> PushResult:
        count = [i.status for i in self.items].count
        return PushResult(received=count(trajectory_pb2.ACK_STORED),
                          duplicates=count(trajectory_pb2.ACK_DUPLICATE),
                          rejected=count(trajectory_pb2.ACK_REJECTED), attempts=self.attempts,
                          stale=count(trajectory_pb2.ACK_STALE),
                          credit_waits=self.credit_waits + credit_waits)


@dataclass(slots=True, eq=False)
class Item:
    """One trajectory: encoded once, resent as is."""

    trajectory_id: str
    data: bytes  # the encoded horizonrl.v1.Trajectory
    batch: Batch | None = None
    status: int = _UNSPECIFIED  # the learner's verdict, once acked

    @property
    def size(self) -> int:
        return len(self.data)


def take_queued(queue: deque[Batch]) -> list[Batch]:
    """Empty `queue` (caller holds its lock): the batches in it not cancelled, now running."""
    live = [b for b in queue if b.future.set_running_or_notify_cancel()]
    queue.clear()
    return live


def _ask(want: int) -> bytes:
    return trajectory_pb2.PushRequest(
        credit_request=trajectory_pb2.CreditRequest(want=want)).SerializeToString()


class PushStream:
    """One Push stream. gRPC's request thread runs `requests`; the caller feeds the responses
    to `on_response` and calls `close` when the stream ends, however it ends; `open_batches`
    then says which batches still wait for acks (to resend or to fail)."""

    def __init__(self, batches: list[Batch], chunk_bytes: int,
                 pull: Callable[[PushStream], bool] | None = None) -> None:
        """`pull(stream)`, called when everything taken is sent, adopts batches queued
        meanwhile (`adopt`) and says whether it did; False ends the stream."""
        self._chunk_bytes = chunk_bytes  # lowered to the learner's limit by its first grant
        self._pull = pull
        self._cond = threading.Condition()
        self._todo: deque[Item] = deque()  # taken, not sent yet
        self._unacked: deque[Item] = deque()  # sent, in order; at most the credits granted
        self._open: dict[Batch, None] = {}  # taken and not settled, oldest first
        self._credits = 0
        self._granted = 0  # the last grant's credits
        self._asking = True  # the opening request asks
        self._closed = False
        self.credit_waits = 0
        self.opened = time.monotonic()
        self._adopt(batches)

    @property
    def closed(self) -> bool:
        return self._closed

    def adopt(self, queue: deque[Batch]) -> bool:
        """Take every batch of `queue` onto this stream, unless it has ended (then leave them
        there for another stream); whether the stream took them."""
        with self._cond:
            if self._closed:
                return False
            self._adopt(take_queued(queue))
            self._cond.notify_all()
            return True

    def _adopt(self, batches: list[Batch]) -> None:
        for b in batches:
            b.attempts += 1
            self._open[b] = None
            self._todo.extend(b.unacked())

    def open_batches(self) -> list[Batch]:
        """(After `close`.) Batches taken onto this stream and not settled, oldest first."""
        return list(self._open)

    def requests(self) -> Iterator[bytes]:
        """The stream's serialized PushRequests: a credit request, then messages as credits
        allow, asking ahead for more; ends (half-closes) when `pull` finds nothing more."""
        with self._cond:
            want = len(self._todo)
        yield _ask(want)
        while True:
            if not self._todo and not (self._pull is not None and self._pull(self)):
                return
            with self._cond:
                need = len(self._todo)
                # Ask ahead for the rest while credits remain (the learner answers after
                # decoding what was sent before the ask, while what is sent after it waits),
                # unless the last grant was empty: then only once out of credits, when the
                # learner holds the answer until it has room.
                ask = (not self._asking and self._credits < need
                       and (self._credits == 0 or self._granted > 0))
                self._asking |= ask
                want = need - self._credits
            if ask:
                yield _ask(want)
            with self._cond:
                # Bounded by the call: close() runs when the stream ends, deadline included.
                # Only while an ask is out: an empty grant to an ask made ahead can arrive
                # after the last credit was spent, and then the loop must ask again.
                while self._credits == 0 and not self._closed and self._asking:
                    self._cond.wait()
                if self._closed:
                    return
                group, chunk_bytes = self._spend(), self._chunk_bytes
            if not group:  # out of credits, no ask out: ask at the top
                continue
            if group[0].size > chunk_bytes:  # _spend gives one too large for a message alone
                for chunk in to_chunks(group[0].trajectory_id, group[0].data, chunk_bytes):
                    yield trajectory_pb2.PushRequest(chunk=chunk).SerializeToString()
            else:
                yield batch_request(i.data for i in group)

    def _spend(self) -> list[Item]:
        """(Lock held.) Credits for the next message: as many whole trajectories as fit
        `chunk_bytes` and MESSAGE_BYTES, or the next one alone if it needs chunks."""
        group: list[Item] = []
        size = 0
        while self._todo and len(group) < self._credits:
            item = self._todo[0]
            size += item.size + 8  # + its tag and length inside the batch
            if group and size > min(self._chunk_bytes, MESSAGE_BYTES):
                break
            group.append(self._todo.popleft())
            if item.size > self._chunk_bytes:
                break
        self._credits -= len(group)
        self._unacked.extend(group)
        return group

    def on_response(self, response: trajectory_pb2.PushResponse) -> None:
        """Apply acks (settling every batch they complete) and a grant."""
        done: list[Batch] = []
        with self._cond:
            for ack in response.acks:
                if (not self._unacked
                        or self._unacked[0].trajectory_id != ack.trajectory_id):
                    raise RuntimeError(f"ingest acknowledged {ack.trajectory_id!r} out of order")
                item = self._unacked.popleft()
                item.status = ack.status
                batch = item.batch
                assert batch is not None
                batch.pending -= 1
                if batch.pending == 0:
                    del self._open[batch]
                    done.append(batch)
            if response.HasField("grant"):
                grant = response.grant
                self._credits += grant.credits
                self._granted = grant.credits
                self._asking = False
                self.credit_waits += grant.waited
                if grant.max_message_bytes:
                    self._chunk_bytes = max(1024, min(self._chunk_bytes,
                                                      grant.max_message_bytes - HEADROOM_BYTES))
                self._cond.notify_all()
            waits = self.credit_waits
        for batch in done:  # outside the lock: a future's callbacks run here
            batch.future.set_result(batch.result(waits))

    def close(self) -> None:
        """End the stream (idempotent): wakes the request thread; no batch is adopted after."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            for b in self._open:  # what this stream waited for counts with the batch
                b.credit_waits += self.credit_waits
            self._cond.notify_all()
