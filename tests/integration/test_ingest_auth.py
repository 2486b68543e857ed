"""The ingest on a non-loopback-style bind demands a token (127.0.0.2 stands in for one: still
loopback, so no traffic leaves the machine; the token is required there because we give one)."""

from __future__ import annotations

import grpc
import pytest

from horizonrl.actors.transport import TrajectorySender
from horizonrl.learner.ingest import TrajectoryIngest, is_loopback
from horizonrl.protos.trajectory import Trajectory

pytestmark = pytest.mark.integration


def _traj(i: int) -> Trajectory:
    return Trajectory(
        trajectory_id=f"t{i}", group_id="g", task_id="task", env_name="babyai",
        policy_version=0, horizon=2, prompt_ids=(1, 2), response_ids=(3, 4),
        response_mask=(1, 0), response_logprobs=(-0.5, 0.0), rewards=(1.0,), reward=1.0,
        num_turns=1, terminated=True, truncated=False)


def test_non_loopback_bind_without_token_is_refused_before_binding():
    assert is_loopback("127.0.0.2") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3")
    with pytest.raises(ValueError, match="not loopback"):
        TrajectoryIngest(host="0.0.0.0", port=0)


def test_token_required_when_given():
    with TrajectoryIngest(host="127.0.0.2", port=0, auth_token="s3cret") as ingest:
        assert ingest.address.startswith("127.0.0.2:")
        for token in (None, "wrong"):
            sender = TrajectorySender(ingest.address, deadline_s=10, auth_token=token)
            with pytest.raises(grpc.RpcError) as err:
                sender.send([_traj(0)])
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            sender.close()
        assert ingest.stats()["received"] == 0
        good = TrajectorySender(ingest.address, deadline_s=10, auth_token="s3cret")
        assert good.send([_traj(1), _traj(2)]).received == 2
        good.close()
        assert [t.trajectory_id for t in ingest.take(2, timeout=5)] == ["t1", "t2"]


def test_health_check_needs_no_token():
    """Probes (kubelet, grpc_health_probe) cannot send a token; health reveals nothing."""
    from horizonrl.protos import health_pb2, health_pb2_grpc

    with TrajectoryIngest(host="127.0.0.2", port=0, auth_token="s3cret") as ingest:
        with grpc.insecure_channel(ingest.address) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
