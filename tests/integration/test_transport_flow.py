"""Flow control and chunking of the gRPC transport, on 127.0.0.1:0.

Realistic payloads: multi-turn trajectories of a few thousand tokens with masks and logprobs,
and one of ~20 MB that only fits the wire in chunks."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from test_transport import wait_until  # the same dir's helpers

from horizonrl.actors.transport import TrajectorySender
from horizonrl.learner.ingest import TrajectoryIngest
from horizonrl.protos import trajectory_pb2, trajectory_pb2_grpc
from horizonrl.protos.codec import encode, to_chunks
from horizonrl.protos.trajectory import Trajectory

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def episode(i: int, *, response_tokens: int = 4000, policy_version: int = 0) -> Trajectory:
    """A multi-turn episode: 4 turns of model tokens (mask 1) between env observations (0)."""
    mask = tuple(1 if (k // 250) % 2 == 0 else 0 for k in range(response_tokens))
    return Trajectory(
        trajectory_id=f"ep-{i:06d}", group_id=f"g{i // 8}", task_id=f"task-{i // 8}",
        env_name="textcraft", policy_version=policy_version, horizon=8,
        prompt_ids=tuple(100 + k % 50_000 for k in range(1000)),
        response_ids=tuple(20_000 + (i + k) % 30_000 for k in range(response_tokens)),
        response_mask=mask,
        # float32-exact values, so the round trip can be compared exactly
        response_logprobs=tuple(-0.5 if m else 0.0 for m in mask),
        rewards=(0.0, 0.0, 0.0, 1.0), reward=1.0, num_turns=4, terminated=True,
        truncated=False, turn_seconds=(0.5, 0.25, 0.125, 1.0), info={"i": i})


def test_slow_learner_makes_senders_wait_on_credits_with_the_buffer_bounded() -> None:
    capacity, senders, per_sender = 12, 3, 30
    batches = [[episode(s * 1000 + i) for i in range(per_sender)] for s in range(senders)]
    largest = max(len(encode(t)) for b in batches for t in b)
    samples: list[dict[str, int]] = []
    with (
        TrajectoryIngest(port=0, capacity=capacity, max_credits_per_grant=4,
                         credit_timeout_s=20.0) as ingest,
        ThreadPoolExecutor(max_workers=senders) as pool,
    ):
        clients = [TrajectorySender(ingest.address, deadline_s=30.0) for _ in range(senders)]
        pending = [pool.submit(c.send, b) for c, b in zip(clients, batches)]
        # Nobody takes for a while: the senders must stall on credits, not pile up data.
        t_end = time.monotonic() + 1.0
        while time.monotonic() < t_end:
            samples.append(ingest.stats())
            time.sleep(0.005)
        stalled = ingest.stats()
        assert stalled["queue_depth"] == capacity and stalled["credit_waits"] >= 1
        assert not any(p.done() for p in pending)

        got: list[Trajectory] = []
        deadline = time.monotonic() + 30.0
        while len(got) < senders * per_sender and time.monotonic() < deadline:
            got += ingest.take(5, timeout=0.2)  # a slow learner: small bites
            samples.append(ingest.stats())
        results = [p.result(timeout=30.0) for p in pending]
        for c in clients:
            c.close()

    for s in samples:  # what the server holds never exceeds the capacity, in any state
        assert s["queue_depth"] + s["reserved"] <= capacity
        assert s["buffered_bytes"] <= capacity * largest
    assert ingest.stats()["queue_depth_peak"] == capacity
    assert sum(r.credit_waits for r in results) >= 1
    assert [r.received for r in results] == [per_sender] * senders
    assert sorted(t.trajectory_id for t in got) == sorted(
        t.trajectory_id for b in batches for t in b)


def test_20mb_trajectory_arrives_intact_in_chunks() -> None:
    # ~8 bytes per response token (3-byte id, 1-byte mask, 4-byte logprob): 2.5M tokens ~ 20 MB
    big = episode(1, response_tokens=2_500_000)
    size = len(encode(big))
    assert size > 20_000_000
    with (
        TrajectoryIngest(port=0, max_message_bytes=4 << 20) as ingest,
        TrajectorySender(ingest.address, deadline_s=30.0, chunk_bytes=1 << 20) as sender,
    ):
        result = sender.send([episode(0), big, episode(2)])
        assert (result.received, result.rejected) == (3, 0)
        stats = ingest.stats()
        assert stats["chunks"] == -(-size // (1 << 20))  # ceil: the big one only
        assert stats["buffered_bytes"] >= size
        got = ingest.take(3, timeout=5.0)
    assert [t.trajectory_id for t in got] == ["ep-000000", "ep-000001", "ep-000002"]
    assert got[1] == big


def test_partial_chunk_set_of_a_broken_stream_is_discarded_and_resent_whole() -> None:
    t = episode(5)
    chunks = to_chunks(t.trajectory_id, encode(t), 4096)
    assert len(chunks) > 4
    with TrajectoryIngest(port=0) as ingest:
        opened, done = threading.Event(), threading.Event()

        def requests():  # a credit, then half the chunks, then the stream hangs until cancelled
            yield trajectory_pb2.PushRequest(
                credit_request=trajectory_pb2.CreditRequest(want=1))
            for c in chunks[: len(chunks) // 2]:
                yield trajectory_pb2.PushRequest(chunk=c)
            opened.set()
            done.wait(30)

        with grpc.insecure_channel(ingest.address) as channel:
            call = trajectory_pb2_grpc.TrajectoryServiceStub(channel).Push(requests(), timeout=20)
            assert next(call).grant.credits == 1
            assert opened.wait(10)
            wait_until(lambda: ingest.stats()["chunks"] == len(chunks) // 2)
            call.cancel()
            done.set()  # ends gRPC's request thread now, not 30 s into later tests
        wait_until(lambda: ingest.stats()["partial_discarded"] == 1)
        assert ingest.stats()["reserved"] == 0 and ingest.stats()["queue_depth"] == 0

        with TrajectorySender(ingest.address, deadline_s=10.0, chunk_bytes=4096) as sender:
            assert sender.send([t]).received == 1
        assert ingest.take(1, timeout=5.0) == [t]


def test_trajectory_above_max_trajectory_bytes_is_rejected_without_buffering() -> None:
    big = episode(1, response_tokens=200_000)  # ~1.6 MB
    with (
        TrajectoryIngest(port=0, max_trajectory_bytes=1 << 20) as ingest,
        TrajectorySender(ingest.address, deadline_s=10.0, chunk_bytes=256 << 10) as sender,
    ):
        result = sender.send([episode(0), big, episode(2)])
        assert (result.received, result.rejected) == (2, 1)
        stats = ingest.stats()
        assert (stats["rejected"], stats["queue_depth"], stats["reserved"]) == (1, 2, 0)
        assert stats["buffered_bytes"] < 1 << 20
        assert [t.trajectory_id for t in ingest.drain()] == ["ep-000000", "ep-000002"]


