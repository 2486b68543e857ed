"""`ray_session` inside a Ray the process already joined (the suite's shared one): it uses that
Ray as it is, its own settings not applied, and leaves it running."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("shared_ray")]


def test_a_joined_ray_is_used_as_it_is_and_left_running():
    import ray

    from horizonrl.cluster.config import RayConfig
    from horizonrl.cluster.ops.runtime import ray_session

    assert ray.is_initialized()
    cpus = ray.cluster_resources()["CPU"]
    node = ray.get_runtime_context().get_node_id()
    with ray_session(RayConfig(num_cpus=1)):  # not applied: the Ray is already there
        assert ray.cluster_resources()["CPU"] == cpus
        assert ray.get_runtime_context().get_node_id() == node
    assert ray.is_initialized() and ray.get_runtime_context().get_node_id() == node
