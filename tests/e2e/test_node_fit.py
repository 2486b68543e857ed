"""`horizonrl train` on a real two-node Ray cluster (two raylets on this machine,
`ray.cluster_utils.Cluster`) whose totals hold the run but no single node holds its generator:
the run stops before any actor with exit 2, naming the generator and what no node has, instead
of waiting for ever on a generator Ray cannot place. And the wait for an actor's `ready()` is
bounded, for what the check before the start cannot see (nodes lost or taken meanwhile)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

# Two raylets and a CLI run (~1 min): in the slow set; tests/unit/test_placement.py has the fast
# checks of the per-node fit.
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.own_ray]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def two_nodes():
    """A head and a worker of 3 CPUs each (6 in all), both on 127.0.0.1."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 3, "node_ip_address": "127.0.0.1", "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=3, node_ip_address="127.0.0.1")
        cluster.wait_for_nodes()
        yield cluster.address
    finally:
        cluster.shutdown()


def test_a_generator_no_node_holds_stops_the_run_with_exit_2(two_nodes, tiny_model_path,
                                                               tmp_path):
    # 4 + 0.5 (env actor) + 2 x 0.5 (learner ranks) = 5.5 of 6 CPUs; no node has 4. The
    # ingest and run root are set for several nodes, so only the placement can stop the run.
    cmd = [sys.executable, "-m", "horizonrl.cluster.cli", "train",
           "--config", "configs/babyai-local.yaml", f"ray.address={two_nodes}",
           f"model.path={tiny_model_path}", f"run_root={tmp_path / 'runs'}", "metrics.port=0",
           "learner.ingest.host=0.0.0.0", "generator.num_cpus=4"]
    env = {**os.environ, "HORIZONRL_INGEST_TOKEN": "node-fit-test", "PYTHONUNBUFFERED": "1"}
    t0 = time.monotonic()
    try:
        out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=240)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the run was still waiting after {exc.timeout:.0f} s: "
                    f"{(exc.stdout or b'')[-1500:]!r}")
    print(f"exit {out.returncode} after {time.monotonic() - t0:.0f} s\n{out.stderr[-1500:]}")
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    assert "generator (vLLM + agent loops) needs CPU 4" in out.stderr
    assert "the most any node has is 3" in out.stderr
    assert not (tmp_path / "runs").exists()  # stopped before the run dir and any actor


def test_the_wait_for_an_actor_ray_cannot_place_is_bounded(two_nodes):
    import ray

    from horizonrl.cluster.ops.plan import DoesNotFit, wait_started

    class Generator:
        def ready(self) -> bool:
            return True

    ray.init(address=two_nodes, log_to_driver=False)
    try:
        placed = ray.remote(num_cpus=1)(Generator).remote()
        wait_started({"generator gen0": placed}, timeout_s=60, needs={"CPU": 1.0},
                     knob="generator.restart_timeout_s")
        never = ray.remote(num_cpus=4)(Generator).remote()  # no node has 4 CPUs
        t0 = time.monotonic()
        with pytest.raises(DoesNotFit, match=r"generator gen1 not running within 3s "
                                             r"\(generator.restart_timeout_s\): .* CPU 4"):
            wait_started({"generator gen1": never}, timeout_s=3, needs={"CPU": 4.0},
                         knob="generator.restart_timeout_s")
        assert time.monotonic() - t0 < 20
    finally:
        ray.shutdown()
