"""A real local Ray start whose raylet never shows up in the GCS for Ray's whole 30-s wait (the
lookup is made to fail, as on a machine too loaded to register in time): `ray_session` starts
again, the cluster runs a task, and nothing the failed start spawned outlives the session."""

from __future__ import annotations

import time

import psutil
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.chaos, pytest.mark.slow]


def test_a_start_that_times_out_is_retried_on_a_clean_slate(monkeypatch):
    import ray
    import ray._private.services as services

    from horizonrl.cluster.config import RayConfig
    from horizonrl.cluster.ops.runtime import ray_session

    real, t0, failed = services.get_node, time.monotonic(), []

    def unregistered_for_31_s(*args, **kwargs):
        if time.monotonic() - t0 < 31:
            failed.append(1)
            raise RuntimeError("injected: node not registered yet")
        return real(*args, **kwargs)

    monkeypatch.setattr(services, "get_node", unregistered_for_31_s)
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    with ray_session(RayConfig(num_cpus=1)):
        assert failed, "the fault did not fire"
        assert ray.get(ray.remote(lambda: 42).remote()) == 42
    left = [p for p in me.children(recursive=True) if p.pid not in before]
    _, alive = psutil.wait_procs(left, timeout=20)
    assert not alive, [p.cmdline()[:2] for p in alive]
