"""Fuzz the gRPC ingest with raw bytes: random, truncated, bit-flipped and oversized
PushRequests, wrong tokens. Every stream ends with a proper status (never UNKNOWN or INTERNAL,
never a crash), nothing malformed is stored, and the server keeps serving real senders."""

from __future__ import annotations

import random
from collections import Counter

import grpc
import pytest

from horizonrl.actors.transport import TrajectorySender
from horizonrl.learner.ingest import TrajectoryIngest
from horizonrl.protos import trajectory_pb2
from horizonrl.protos.codec import to_proto
from horizonrl.protos.trajectory import Trajectory

pytestmark = pytest.mark.fuzz
CASES = 1200
METHOD = "/horizonrl.v1.TrajectoryService/Push"
ALLOWED = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT,
           grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.FAILED_PRECONDITION,
           grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.DEADLINE_EXCEEDED}


def _traj(i: int) -> Trajectory:
    return Trajectory(trajectory_id=f"ok-{i}", group_id="g", task_id="t", env_name="babyai",
                      policy_version=0, horizon=3, prompt_ids=(1, 2, 3), response_ids=(4, 5, 6),
                      response_mask=(1, 0, 1), response_logprobs=(-0.1, 0.0, -0.2),
                      rewards=(1.0,), reward=1.0, num_turns=1, terminated=True, truncated=False)


def _valid_request(i: int) -> bytes:
    req = trajectory_pb2.PushRequest()
    req.batch.trajectories.append(to_proto(_traj(i)))
    return req.SerializeToString()


def _case(rng: random.Random, i: int) -> list[bytes]:
    """One stream's raw request messages."""
    kind = rng.randrange(5)
    if kind == 0:  # random bytes
        return [rng.randbytes(rng.randint(0, 200))]
    valid = _valid_request(i)
    if kind == 1:  # truncated
        return [valid[: rng.randrange(1, len(valid))]]
    if kind == 2:  # bit flips
        b = bytearray(valid)
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        return [bytes(b)]
    if kind == 3:  # a batch without credits, or a credit request then garbage
        ask = trajectory_pb2.PushRequest()
        ask.credit_request.want = 1
        return [ask.SerializeToString(), rng.randbytes(rng.randint(1, 64))]
    return [valid]  # a well-formed batch sent without asking for credits first


def test_malformed_streams_get_proper_statuses_and_the_server_keeps_serving(free_port):
    rng = random.Random(0)
    port = free_port()
    statuses: Counter[str] = Counter()
    with TrajectoryIngest(host="127.0.0.1", port=port, capacity=64,
                          max_message_bytes=1 << 20) as ingest:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            push = channel.stream_stream(METHOD, request_serializer=lambda b: b,
                                         response_deserializer=lambda b: b)
            for i in range(CASES):
                msgs = _case(rng, i)
                try:
                    for _ in push(iter(msgs), timeout=5):
                        pass
                    code = grpc.StatusCode.OK
                except grpc.RpcError as exc:
                    code = exc.code()
                statuses[code.name] += 1
                assert code in ALLOWED, (i, code, msgs[0][:40])
            # Oversized: past the message limit on the server.
            try:
                list(push(iter([b"\x12" + rng.randbytes(2 << 20)]), timeout=10))
                big = grpc.StatusCode.OK
            except grpc.RpcError as exc:
                big = exc.code()
            assert big == grpc.StatusCode.RESOURCE_EXHAUSTED
        stored_before = ingest.stats()["received"]
        malformed_stored = [t for t in ingest.drain() if not t.trajectory_id.startswith("ok-")]
        assert not malformed_stored
        # Still serving: a real sender's trajectories arrive, exactly once.
        with TrajectorySender(f"127.0.0.1:{port}", deadline_s=10) as sender:
            result = sender.send([_traj(10_000 + k) for k in range(20)])
        assert result.received == 20, result
        got = {t.trajectory_id for t in ingest.take(20, timeout=10)}
        assert got == {f"ok-{10_000 + k}" for k in range(20)}
    print(f"\ningest fuzz: {CASES} streams -> {dict(statuses)}; oversized -> {big.name}; "
          f"stored before the real sender {stored_before}")


def test_wrong_tokens_are_refused_and_do_not_disturb_the_server(free_port):
    port = free_port()
    rng = random.Random(1)
    with TrajectoryIngest(host="127.0.0.1", port=port, capacity=16,
                          auth_token="the-token") as ingest:
        refused = 0
        for _ in range(200):
            token = rng.choice(["", "the-toke", "the-token ", "THE-TOKEN",
                                rng.randbytes(8).hex()])
            with TrajectorySender(f"127.0.0.1:{port}", deadline_s=5, retries=0,
                                  auth_token=token or None) as sender:
                try:
                    sender.send([_traj(0)])
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.UNAUTHENTICATED, exc
                    refused += 1
        assert refused == 200
        with TrajectorySender(f"127.0.0.1:{port}", deadline_s=10,
                              auth_token="the-token") as sender:
            assert sender.send([_traj(1)]).received == 1
        assert [t.trajectory_id for t in ingest.drain()] == ["ok-1"]
