"""gRPC transport end to end: a real TrajectoryIngest on 127.0.0.1:0 and a real TrajectorySender.

Protocol errors are provoked with a raw stub speaking the Push stream directly."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from horizonrl.actors.transport import PushResult, TrajectorySender
from horizonrl.learner.ingest import SERVICE_NAME, TrajectoryIngest
from horizonrl.protos import health_pb2, health_pb2_grpc, trajectory_pb2, trajectory_pb2_grpc
from horizonrl.protos.codec import from_proto, to_chunks, to_proto
from horizonrl.protos.trajectory import Trajectory

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


def credits(want: int) -> trajectory_pb2.PushRequest:
    return trajectory_pb2.PushRequest(credit_request=trajectory_pb2.CreditRequest(want=want))


def whole(*ts: Trajectory | trajectory_pb2.Trajectory) -> trajectory_pb2.PushRequest:
    """One message carrying `ts` whole."""
    messages = [t if isinstance(t, trajectory_pb2.Trajectory) else to_proto(t) for t in ts]
    return trajectory_pb2.PushRequest(
        batch=trajectory_pb2.TrajectoryBatch(trajectories=messages))


def raw_push(address: str, requests: list[trajectory_pb2.PushRequest],
             **kwargs: object) -> list[trajectory_pb2.PushResponse]:
    """One Push stream with exactly these requests; the responses, or grpc.RpcError."""
    with grpc.insecure_channel(address, **kwargs) as channel:  # type: ignore[arg-type]
        return list(trajectory_pb2_grpc.TrajectoryServiceStub(channel).Push(
            iter(requests), timeout=10))


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


@pytest.fixture
def ingest() -> Iterator[TrajectoryIngest]:
    with TrajectoryIngest(port=0, capacity=1000, credit_timeout_s=5.0) as server:
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


def test_dedup_window_remembers_the_latest_ids() -> None:
    """A bounded window (learner.ingest.dedup_window): recent resends are duplicates; an id
    older than the window is forgotten and would be stored again."""
    batch = [make_trajectory(i) for i in range(10)]
    with (TrajectoryIngest(port=0, capacity=100, dedup_window=4) as ingest,
          TrajectorySender(ingest.address, deadline_s=10.0) as sender):
        assert sender.send(batch).received == 10
        recent = sender.send(batch[-4:])
        assert (recent.received, recent.duplicates) == (0, 4)
        assert sender.send(batch[:1]).received == 1  # forgotten: outside the window


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


def test_malformed_trajectory_is_acked_rejected_and_the_stream_goes_on(
    ingest: TrajectoryIngest, sender: TrajectorySender
) -> None:
    bad = to_proto(make_trajectory(1))
    del bad.response_mask[-1]  # length mismatch: the dataclass raises ValueError on decode
    responses = raw_push(ingest.address, [credits(3), whole(make_trajectory(0), bad),
                                          whole(make_trajectory(2))])
    assert responses[0].grant.credits == 3
    acks = [a for r in responses for a in r.acks]  # batched: before grants and at the end
    assert [(a.trajectory_id, a.status) for a in acks] == [
        ("traj-00000", trajectory_pb2.ACK_STORED), ("traj-00001", trajectory_pb2.ACK_REJECTED),
        ("traj-00002", trajectory_pb2.ACK_STORED)]
    assert "same length" in acks[1].detail
    assert ingest.stats()["rejected"] == 1

    assert sender.send([make_trajectory(3)]).received == 1
    ids = [t.trajectory_id for t in ingest.drain()]
    assert ids == ["traj-00000", "traj-00002", "traj-00003"]


def _chunks(i: int) -> list[trajectory_pb2.PushRequest]:
    data = to_proto(make_trajectory(i)).SerializeToString()
    return [trajectory_pb2.PushRequest(chunk=c) for c in to_chunks(f"traj-{i:05d}", data, 64)]


@pytest.mark.parametrize(("requests", "code"), [
    ([b"\xff\xff\xff"], grpc.StatusCode.INVALID_ARGUMENT),  # not a PushRequest at all
    ([credits(1), trajectory_pb2.PushRequest()], grpc.StatusCode.INVALID_ARGUMENT),  # empty
    ([whole(make_trajectory(0))], grpc.StatusCode.FAILED_PRECONDITION),  # no credit asked
    ([credits(1), whole(make_trajectory(0), make_trajectory(1))],
     grpc.StatusCode.FAILED_PRECONDITION),  # one credit, two trajectories
    ([credits(2), *_chunks(0)[:2], *_chunks(1)], grpc.StatusCode.INVALID_ARGUMENT),  # cut in
    ([credits(1), *reversed(_chunks(0))], grpc.StatusCode.INVALID_ARGUMENT),  # out of order
], ids=["garbage", "empty", "no-credit", "over-credit", "interleaved-chunks", "reordered"])
def test_protocol_errors_get_status_codes_and_server_keeps_serving(
    ingest: TrajectoryIngest, sender: TrajectorySender, requests: list, code: grpc.StatusCode
) -> None:
    serialize = [r if isinstance(r, bytes) else r.SerializeToString() for r in requests]
    with grpc.insecure_channel(ingest.address) as channel:
        push = channel.stream_stream(f"/{SERVICE_NAME}/Push")  # raw bytes in and out
        with pytest.raises(grpc.RpcError) as err:
            list(push(iter(serialize), timeout=10))
    assert err.value.code() == code
    wait_until(lambda: ingest.stats()["reserved"] == 0)  # the broken stream's credits came back

    assert sender.send([make_trajectory(7)]).received == 1
    assert "traj-00007" in [t.trajectory_id for t in ingest.drain()]


def test_oversized_message_gets_resource_exhausted_and_a_sender_chunks_it() -> None:
    with TrajectoryIngest(port=0, max_message_bytes=1 << 20) as ingest:
        # 400k ids of 100_000 are 3-byte varints: ~1.2 MB, above the 1 MiB limit
        huge = to_proto(make_trajectory(0, prompt_len=400_000))
        huge.prompt_ids[:] = [100_000] * 400_000
        assert huge.ByteSize() > 1 << 20
        with pytest.raises(grpc.RpcError) as err:
            raw_push(ingest.address, [credits(1), whole(huge)])
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

        # The sender learns the 1 MiB limit from its first grant and sends the same trajectory
        # in chunks, although its own chunk size (4 MiB) would let it through whole.
        with TrajectorySender(ingest.address, deadline_s=10.0) as sender:
            result = sender.send([make_trajectory(1), from_proto(huge)])
        assert (result.received, result.rejected) == (2, 0)
        assert ingest.stats()["chunks"] >= 2
        got = ingest.drain()
        assert [t.trajectory_id for t in got] == ["traj-00001", "traj-00000"]
        assert got[1] == from_proto(huge)


def test_sender_retries_across_restart_and_ingests_exactly_once() -> None:
    batch = [make_trajectory(i) for i in range(200)]
    # capacity 50 with nobody taking: the stream waits for credits after 50, mid-batch, when we
    # stop the server
    with (
        TrajectoryIngest(port=0, capacity=50, credit_timeout_s=10.0) as ingest,
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


def test_channel_closed_mid_batch_then_resent_ingests_exactly_once() -> None:
    batch = [make_trajectory(i) for i in range(120)]
    with (
        TrajectoryIngest(port=0, capacity=40, credit_timeout_s=10.0) as ingest,
        ThreadPoolExecutor(max_workers=1) as pool,
    ):
        first = TrajectorySender(ingest.address, deadline_s=10.0)
        pending = pool.submit(first.send, batch)
        wait_until(lambda: ingest.stats()["queue_depth"] == 40)
        first.close()  # kills the stream from the client side while it waits for credits
        with pytest.raises(grpc.RpcError) as err:
            pending.result(timeout=10.0)
        assert err.value.code() == grpc.StatusCode.CANCELLED
        wait_until(lambda: ingest.stats()["reserved"] == 0)

        # A new sender (a restarted generator) resends the whole batch with the same ids.
        with TrajectorySender(ingest.address, deadline_s=10.0) as second:
            resend = pool.submit(second.send, batch)
            got = []
            deadline = time.monotonic() + 15.0
            while len(got) < 120 and time.monotonic() < deadline:
                got += ingest.take(40, timeout=0.2)
            result = resend.result(timeout=15.0)
        assert [t.trajectory_id for t in got] == [t.trajectory_id for t in batch]
        assert (result.received, result.duplicates) == (80, 40)
        assert ingest.stats()["received"] == 120 and ingest.stats()["duplicates"] == 40


def test_an_ingest_that_acks_out_of_order_fails_the_batch_instead_of_hanging() -> None:
    """A peer that breaks the protocol (here: it acks an id that was never sent) is not
    horizonrl's ingest, so it is a small server of its own; the sender must fail the batch
    with the reason, and keep serving later batches on a new stream."""
    from concurrent import futures

    def push(requests, context):
        for data in requests:
            request = trajectory_pb2.PushRequest.FromString(data)
            if request.WhichOneof("kind") == "credit_request":
                yield trajectory_pb2.PushResponse(
                    grant=trajectory_pb2.CreditGrant(credits=request.credit_request.want))
            else:
                yield trajectory_pb2.PushResponse(acks=[trajectory_pb2.Ack(
                    trajectory_id="never-sent", status=trajectory_pb2.ACK_STORED)])

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        SERVICE_NAME, {"Push": grpc.stream_stream_rpc_method_handler(
            push, request_deserializer=None,
            response_serializer=trajectory_pb2.PushResponse.SerializeToString)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with TrajectorySender(f"127.0.0.1:{port}", deadline_s=10.0) as sender:
            for _ in range(2):
                with pytest.raises(RuntimeError, match="out of order"):
                    sender.send_async([make_trajectory(1)]).result(timeout=10)
    finally:
        server.stop(0)


def test_health_check_reports_serving(ingest: TrajectoryIngest) -> None:
    with grpc.insecure_channel(ingest.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", SERVICE_NAME):
            reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as err:
            health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=5)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.RpcError) as err:
            next(health.Watch(health_pb2.HealthCheckRequest(), timeout=5))
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert ingest.serving
    ingest.stop()
    assert not ingest.serving


def test_request_bytes_are_what_serializing_the_message_gives():
    """The sender builds batch requests from each trajectory's bytes on the wire format; the
    bytes must equal the serialized PushRequest (long payloads: multi-byte lengths), and the
    ingest splits them back into exactly those trajectories."""
    from horizonrl.protos.batch_wire import batch_request, split_batch
    from horizonrl.protos.codec import encode

    for ts in ([make_trajectory(0)], [make_trajectory(i, prompt_len=300 * i) for i in range(5)]):
        data = whole(*ts).SerializeToString()
        assert batch_request(encode(t) for t in ts) == data
        assert split_batch(data) == [encode(t) for t in ts]
    # Anything else is left to the full parse: other kinds, cut or padded bytes, other fields.
    data = whole(make_trajectory(1)).SerializeToString()
    for other in (credits(3).SerializeToString(), data[:-1], data + b"\x00", b"", b"\x12\xff",
                  trajectory_pb2.PushRequest(batch=trajectory_pb2.TrajectoryBatch()).
                  SerializeToString() + credits(1).SerializeToString()):
        assert split_batch(other) is None


def test_pipelined_batches_merge_onto_streams_and_each_gets_its_own_counts(
        ingest: TrajectoryIngest):
    """Batches queued while a stream is busy ride together on the next one; each future
    reports its own batch (stored vs duplicate), and nothing is stored twice."""
    with TrajectorySender(ingest.address, deadline_s=10.0, max_inflight=1) as sender:
        futures = [sender.send_async([make_trajectory(10 * b + k) for k in range(5)])
                   for b in range(12)]
        again = sender.send_async([make_trajectory(0), make_trajectory(999)])
        results = [f.result(timeout=30) for f in futures]
        assert all(r.received == 5 and r.duplicates == 0 for r in results)
        assert again.result(timeout=30).received == 1 and again.result().duplicates == 1
    stats = ingest.stats()
    assert stats["received"] == 61 and stats["duplicates"] == 1
    assert len(ingest.drain()) == 61
