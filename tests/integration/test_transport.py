"""gRPC transport end to end: a real TrajectoryIngest on 127.0.0.1:0 and a real TrajectorySender."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from actors.transport import PushResult, TrajectorySender
from learner.ingest import TrajectoryIngest
from protos import trajectory_pb2_grpc
from protos.codec import to_proto
from protos.trajectory import Trajectory

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def make_trajectory(i: int, *, prompt_len: int = 8) -> Trajectory:
    return Trajectory(
        trajectory_id=f"traj-{i:05d}",
        group_id=f"group-{i // 4}",
        task_id=f"task-{i // 4}",
        env_name="babyai",
        policy_version=3,
        horizon=5,
        prompt_ids=tuple(range(100, 100 + prompt_len)),
        response_ids=(11, 12, 13, 198, 14),
        response_mask=(1, 1, 0, 0, 1),
        response_logprobs=(-0.5, -0.25, 0.0, 0.0, -1.0),
        rewards=(0.0, 1.0),
        reward=1.0,
        num_turns=2,
        terminated=True,
        truncated=False,
        turn_seconds=(0.25, 0.5),
        info={"i": i},
    )


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


@pytest.fixture
def ingest() -> Iterator[TrajectoryIngest]:
    with TrajectoryIngest(port=0, capacity=1000, put_timeout_s=5.0) as server:
        yield server


@pytest.fixture
def sender(ingest: TrajectoryIngest) -> Iterator[TrajectorySender]:
    with TrajectorySender(ingest.address, deadline_s=10.0, backoff_s=0.1) as client:
        yield client


def test_batch_arrives_exactly_once(ingest: TrajectoryIngest, sender: TrajectorySender) -> None:
    batch = [make_trajectory(i) for i in range(200)]
    assert ingest.address == f"127.0.0.1:{ingest.port}" and ingest.port > 0

    assert sender.send(batch) == PushResult(received=200, duplicates=0, rejected=0, attempts=1)
    assert ingest.take(200, timeout=5.0) == batch  # in order, decoded back to equal dataclasses

    again = sender.send(batch)
    assert (again.received, again.duplicates) == (0, 200)
    assert ingest.take(1, timeout=0.05) == []
    stats = ingest.stats()
    assert (stats["received"], stats["duplicates"], stats["queue_depth"]) == (200, 200, 0)
    assert stats["bytes"] > 0


def test_concurrent_senders_of_the_same_ids_store_each_once(ingest: TrajectoryIngest) -> None:
    batch = [make_trajectory(i) for i in range(50)]
    results: list[PushResult] = []

    def push() -> None:
        with TrajectorySender(ingest.address, deadline_s=10.0) as client:
            results.append(client.send(batch))

    threads = [threading.Thread(target=push) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=15.0)
    assert len(results) == 3
    assert sum(r.received for r in results) == 50
    assert sum(r.duplicates for r in results) == 100
    assert sorted(t.trajectory_id for t in ingest.drain()) == [t.trajectory_id for t in batch]


def test_malformed_message_is_rejected_and_server_keeps_serving(
    ingest: TrajectoryIngest, sender: TrajectorySender
) -> None:
    bad = to_proto(make_trajectory(1))
    del bad.response_mask[-1]  # length mismatch: the dataclass raises ValueError on decode
    messages = [to_proto(make_trajectory(0)), bad, to_proto(make_trajectory(2))]
    with grpc.insecure_channel(ingest.address) as channel:
        ack = trajectory_pb2_grpc.TrajectoryServiceStub(channel).Push(iter(messages), timeout=10)
    assert (ack.received, ack.duplicates, ack.rejected) == (2, 0, 1)
    assert ingest.stats()["rejected"] == 1

    assert sender.send([make_trajectory(3)]).received == 1
    ids = [t.trajectory_id for t in ingest.drain()]
    assert ids == ["traj-00000", "traj-00002", "traj-00003"]


def test_oversized_message_gets_resource_exhausted_and_server_keeps_serving() -> None:
    with TrajectoryIngest(port=0, max_message_bytes=1 << 20) as ingest:
        # 400k ids of 100_000 are 3-byte varints: ~1.2 MB, above the 1 MiB limit
        huge = make_trajectory(0, prompt_len=400_000)
        huge = to_proto(huge)
        huge.prompt_ids[:] = [100_000] * 400_000
        assert huge.ByteSize() > 1 << 20
        with grpc.insecure_channel(ingest.address) as channel:
            stub = trajectory_pb2_grpc.TrajectoryServiceStub(channel)
            with pytest.raises(grpc.RpcError) as err:
                stub.Push(iter([huge]), timeout=10)
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

        with TrajectorySender(ingest.address, deadline_s=10.0) as sender:
            assert sender.send([make_trajectory(1)]).received == 1
        assert [t.trajectory_id for t in ingest.drain()] == ["traj-00001"]


def test_sender_retries_across_restart_and_ingests_exactly_once() -> None:
    batch = [make_trajectory(i) for i in range(200)]
    # capacity 50 with nobody taking: the stream blocks after 50, mid-batch, when we stop
    with (
        TrajectoryIngest(port=0, capacity=50, put_timeout_s=10.0) as ingest,
        TrajectorySender(ingest.address, deadline_s=10.0, backoff_s=0.1) as sender,
        ThreadPoolExecutor(max_workers=1) as pool,
    ):
        port = ingest.port
        pending = pool.submit(sender.send, batch)
        wait_until(lambda: ingest.stats()["queue_depth"] == 50)

        ingest.stop(grace=0.5)  # breaks the stream: the sender sees UNAVAILABLE
        got = ingest.drain()
        ingest.start()
        assert ingest.port == port

        deadline = time.monotonic() + 15.0
        while len(got) < 200 and time.monotonic() < deadline:
            got += ingest.take(50, timeout=0.2)
        result = pending.result(timeout=15.0)

        assert [t.trajectory_id for t in got] == [t.trajectory_id for t in batch]
        assert result.attempts >= 2
        assert result.received + result.duplicates == 200
        assert ingest.stats()["received"] == 200
