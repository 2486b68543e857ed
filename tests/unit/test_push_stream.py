"""One Push stream of the sender (actors/push_stream.py) driven by hand, without gRPC: the
requests it yields and what the learner's answers do to it, in orders a real stream can see
them. The real sender and ingest are tested together in tests/integration/test_transport*.py."""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import pytest

from horizonrl.actors.push_stream import Batch, Item, PushStream
from horizonrl.protos import trajectory_pb2
from horizonrl.protos.batch_wire import split_batch

pytestmark = pytest.mark.timeout(20)  # a lost wake-up hangs the stream: fail, do not hang
STORED = trajectory_pb2.ACK_STORED


def batch(*ids: str, queued: bool = False) -> Batch:
    """A batch as a worker hands it to a stream (running), or as it waits in the queue."""
    b = Batch([Item(i, i.encode() * 10) for i in ids])
    assert queued or b.future.set_running_or_notify_cancel()
    return b


def grant(credits: int) -> trajectory_pb2.PushResponse:
    return trajectory_pb2.PushResponse(grant=trajectory_pb2.CreditGrant(credits=credits))


def acks(*ids: str) -> trajectory_pb2.PushResponse:
    return trajectory_pb2.PushResponse(
        acks=[trajectory_pb2.Ack(trajectory_id=i, status=STORED) for i in ids])


def kind(request: bytes) -> tuple[str, object]:
    """("ask", want) or ("batch", [ids]) for one serialized request."""
    parts = split_batch(request)
    if parts is not None:
        return "batch", [p[:2].decode() for p in parts]  # the test payloads repeat the id
    return "ask", trajectory_pb2.PushRequest.FromString(request).credit_request.want


def test_asks_ahead_and_asks_again_after_an_empty_grant_to_an_early_ask():
    """The ask for the rest goes out while credits remain; if its answer is empty and comes
    after the last credit was spent, the stream must ask again instead of waiting forever."""
    b = batch(*(f"t{k}" for k in range(6)))
    stream = PushStream([b], chunk_bytes=1 << 20)
    requests = stream.requests()
    assert kind(next(requests)) == ("ask", 6)
    stream.on_response(grant(2))
    assert kind(next(requests)) == ("ask", 4)  # ahead: 2 credits still to send with
    assert kind(next(requests)) == ("batch", ["t0", "t1"])
    with ThreadPoolExecutor(max_workers=1) as pool:
        upcoming = pool.submit(next, requests)  # out of credits, the ask out: it waits
        time.sleep(0.2)
        assert not upcoming.done()
        stream.on_response(grant(0))  # the learner had no room and answered at once
        assert kind(upcoming.result(timeout=5)) == ("ask", 4)  # asks again, does not hang
    stream.on_response(grant(4))
    assert kind(next(requests)) == ("batch", ["t2", "t3", "t4", "t5"])
    stream.on_response(acks("t0", "t1", "t2", "t3", "t4", "t5"))
    assert b.future.result(timeout=0).received == 6
    stream.close()
    assert next(requests, None) is None and stream.open_batches() == []


def test_each_batch_settles_on_its_own_last_ack_and_adopted_batches_ride_along():
    first, second = batch("a0", "a1"), batch("b0", queued=True)
    queue = deque([second])
    pulls = []

    def pull(s: PushStream) -> bool:
        pulls.append(len(queue))
        return bool(queue) and s.adopt(queue)

    stream = PushStream([first], chunk_bytes=1 << 20, pull=pull)
    requests = stream.requests()
    assert kind(next(requests)) == ("ask", 2)
    stream.on_response(grant(8))
    assert kind(next(requests)) == ("batch", ["a0", "a1"])
    assert kind(next(requests)) == ("batch", ["b0"])  # adopted: no new stream, no new ask
    assert pulls == [1] and not queue
    stream.on_response(acks("a0"))
    assert not first.future.done()
    stream.on_response(acks("a1"))
    assert first.future.result(timeout=0).received == 2 and not second.future.done()
    with pytest.raises(RuntimeError, match="out of order"):
        stream.on_response(acks("zz"))
    stream.close()
    assert stream.open_batches() == [second] and second.attempts == 1
    assert [i.trajectory_id for i in second.unacked()] == ["b0"]


def test_a_closed_stream_adopts_nothing():
    stream = PushStream([batch("a0")], chunk_bytes=1 << 20)
    stream.close()
    queue = deque([batch("b0", queued=True)])
    assert not stream.adopt(queue)
    assert len(queue) == 1  # left for another stream
