"""A run on a real two-node Ray cluster (two network namespaces, bench/twohosts.py) refuses,
before any actor starts, what only works on one machine: a loopback ingest, and a run root that
another node does not see. The same check passes once both are set for several nodes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import SUITE_MODEL

from bench.twohosts import TwoHosts, can_run

pytestmark = [pytest.mark.slow, pytest.mark.multinode,
              pytest.mark.skipif(can_run() is not None, reason=str(can_run()))]
ROOT = Path(__file__).resolve().parents[2]
CHECK = """
import json, sys
from pathlib import Path
import ray
from horizonrl.cluster.config import load_config
from horizonrl.cluster.ops.multinode import NotMultiNodeReady, check_multinode
cfg = load_config("configs/babyai-local.yaml", sys.argv[2:])
ray.init(address=sys.argv[1], log_to_driver=False)
try:
    check_multinode(cfg, model_dir=Path(cfg.model.cache_dir))
    print(json.dumps({"ok": True}))
except NotMultiNodeReady as exc:
    print(json.dumps({"ok": False, "error": str(exc)}))
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    work = tmp_path_factory.mktemp("twohosts")
    local_to_a = work / "runs-a-only"  # host B mounts an empty tmpfs over it
    local_to_a.mkdir()
    with TwoHosts(work, b_private=[local_to_a]) as hosts:
        yield hosts, work, local_to_a


def _check(hosts: TwoHosts, *overrides: str) -> dict:
    out = hosts.run_on_a([sys.executable, "-c", CHECK, hosts.address,
                          f"model.cache_dir={ROOT / '.cache/models'}", *overrides],
                         cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_loopback_ingest_is_refused_with_what_to_set(cluster):
    hosts, work, _ = cluster
    got = _check(hosts, f"run_root={work / 'shared-runs'}")
    assert not got["ok"]
    assert "learner.ingest.host=127.0.0.1" in got["error"]
    assert "learner.ingest.host=0.0.0.0" in got["error"] and "other 1 node" in got["error"]


def test_run_root_only_on_the_drivers_node_is_refused(cluster):
    hosts, _, local_to_a = cluster
    got = _check(hosts, "learner.ingest.host=0.0.0.0", f"run_root={local_to_a}")
    assert not got["ok"]
    assert f"run_root {local_to_a}" in got["error"] and hosts.ips[1] in got["error"]
    assert hosts.ips[0] not in got["error"]  # the driver's own node sees it
    assert not list(local_to_a.iterdir())  # the probe's marker was removed


def test_both_set_for_several_nodes_pass(cluster):
    hosts, work, _ = cluster
    got = _check(hosts, "learner.ingest.host=0.0.0.0", f"run_root={work / 'shared-runs'}")
    assert got == {"ok": True}


def test_the_cli_stops_with_exit_2_before_any_actor(cluster, tmp_path):
    hosts, _, _ = cluster
    out = hosts.run_on_a(
        [sys.executable, "-m", "horizonrl.cluster.cli", "train", "--config",
         "configs/babyai-local.yaml", *SUITE_MODEL, f"ray.address={hosts.address}",
         "metrics.port=0",
         f"model.cache_dir={ROOT / '.cache/models'}", f"run_root={tmp_path / 'runs'}"],
        cwd=ROOT, timeout=600)
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    assert "learner.ingest.host=127.0.0.1" in out.stderr
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())


def test_dry_run_prints_each_roles_node_on_the_live_cluster(cluster):
    hosts, _, _ = cluster
    out = hosts.run_on_a(
        [sys.executable, "-m", "horizonrl.cluster.cli", "train", "--config",
         "configs/multinode-local.yaml", f"ray.address={hosts.address}", "--dry-run"],
        cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    lines = out.stdout.splitlines()
    a = next(x for x in lines if x.strip().startswith(f"{hosts.ips[0]}:"))
    b = next(x for x in lines if x.strip().startswith(f"{hosts.ips[1]}:"))
    assert "learner rank" in a and "generator" not in a
    assert "generator" in b and "env actor" in b and "learner" not in b
