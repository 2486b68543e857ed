"""Placement by role: the plan carries each role's custom resources, and the per-node dry run
puts each actor on a node that offers them, or says which fit on no one node."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from horizonrl.cluster.config import load_config
from horizonrl.cluster.ops.plan import place_on_nodes, placement_plan, print_per_node
from horizonrl.envpool.config import EnvConfig

ROOT = Path(__file__).resolve().parents[2]
A = {"CPU": 2.0, "learner_node": 1.0}
B = {"CPU": 2.0, "rollout_node": 1.0}


def _plan():
    return placement_plan(load_config(ROOT / "configs/multinode-local.yaml"))


def test_the_plan_carries_each_roles_custom_resources():
    by_role = {role.split(" ")[0]: res for role, _, res in _plan()}
    assert by_role["generator"] == {"CPU": 1.0, "rollout_node": 0.1}
    assert by_role["env"] == {"CPU": 0.5, "rollout_node": 0.1}
    assert by_role["learner"] == {"CPU": 0.5, "learner_node": 0.1}


def test_each_role_goes_to_the_node_that_offers_its_resource(capsys):
    placed, unplaced = place_on_nodes(_plan(), {"a": A, "b": B})
    assert not unplaced
    assert {r.split(" ")[0]: n for r, n in placed["a"].items() if n} == {"learner": 2}
    assert {r.split(" ")[0]: n for r, n in placed["b"].items() if n} == {"generator": 1,
                                                                         "env": 1}
    assert print_per_node(_plan(), {"a": A, "b": B})
    assert "a: 2 x learner rank" in capsys.readouterr().out


def test_roles_without_their_node_fit_nowhere(capsys):
    _, unplaced = place_on_nodes(_plan(), {"a": {"CPU": 8.0, "learner_node": 1.0}})
    assert sorted(r.split(" ")[0] for r in unplaced) == ["env", "generator"]
    assert not print_per_node(_plan(), {"a": {"CPU": 8.0, "learner_node": 1.0}})
    assert "does not fit on any one node: 1 x generator" in capsys.readouterr().out


def test_totals_that_suffice_can_still_leave_an_actor_out():
    plan = [("generator", 1, {"CPU": 1.5})]
    _, unplaced = place_on_nodes(plan, {"a": {"CPU": 1.0}, "b": {"CPU": 1.0}})
    assert unplaced == ["generator"]  # 2 CPUs in all, but no node has 1.5


@pytest.mark.parametrize("bad", [{"CPU": 1}, {"GPU": 1}, {"env_node": 0}])
def test_builtin_or_empty_custom_resources_are_refused(bad):
    with pytest.raises(ValidationError, match=r"num_cpus|above 0"):
        EnvConfig(resources=bad)


def _fake_cluster(monkeypatch, nodes: dict[str, dict[str, float]]) -> None:
    """`ray.nodes()` and `ray.available_resources()` of a cluster of `nodes` (IP: resources),
    all free: what the start-of-run check reads, without a Ray session."""
    import ray

    table = [{"NodeID": f"{i:02d}" * 28, "NodeManagerAddress": ip, "Alive": True,
              "Resources": {**res, f"node:{ip}": 1.0}} for i, (ip, res) in enumerate(nodes.items())]
    free: dict[str, float] = {}
    for res in nodes.values():
        for k, v in res.items():
            free[k] = free.get(k, 0.0) + v
    monkeypatch.setattr(ray, "nodes", lambda: table)
    monkeypatch.setattr(ray, "available_resources", lambda: dict(free))


def test_the_start_refuses_a_generator_that_fits_the_totals_but_no_node(monkeypatch):
    """4 CPUs in all, 2 per node: a 3-CPU generator fits the totals and no node. Ray would keep
    it pending for ever, so the check before any actor names it and what no node has."""
    from horizonrl.cluster.ops.plan import DoesNotFit, wait_until_fits

    cfg = load_config(ROOT / "configs/babyai-local.yaml", ["generator.num_cpus=3",
                                                           "learner.world_size=1"])
    _fake_cluster(monkeypatch, {"10.0.0.1": {"CPU": 2.0}, "10.0.0.2": {"CPU": 2.0}})
    with pytest.raises(DoesNotFit) as err:
        wait_until_fits(cfg)
    msg = str(err.value)
    assert "generator (vLLM + agent loops) needs CPU 3" in msg
    assert "the most any node has is 2" in msg
    assert "env actor" not in msg and "learner rank" not in msg  # those fit


def test_the_start_passes_when_every_actor_fits_some_node(monkeypatch):
    from horizonrl.cluster.ops.plan import wait_until_fits

    cfg = load_config(ROOT / "configs/babyai-local.yaml", ["generator.num_cpus=2",
                                                           "learner.world_size=1"])
    _fake_cluster(monkeypatch, {"10.0.0.1": {"CPU": 2.0}, "10.0.0.2": {"CPU": 2.0}})
    wait_until_fits(cfg)


def test_a_request_that_no_node_holds_whole_says_so_per_node(monkeypatch):
    """Each resource exists somewhere, never together: the message says what each node lacks."""
    from horizonrl.cluster.ops.plan import DoesNotFit, wait_until_fits

    cfg = load_config(ROOT / "configs/babyai-local.yaml", ["generator.num_gpus=1",
                                                           "learner.world_size=1"])
    _fake_cluster(monkeypatch, {"cpu-node": {"CPU": 8.0}, "gpu-node": {"CPU": 0.5, "GPU": 1.0}})
    with pytest.raises(DoesNotFit, match=r"generator .*needs CPU 1, GPU 1 on one node; no node "
                                         r"has all of it \(cpu-node: GPU: needs 1, has 0; "
                                         r"gpu-node: CPU: needs 1, has 0.5\)"):
        wait_until_fits(cfg)


def test_strictly_packed_learner_ranks_must_fit_one_node_together(monkeypatch):
    from horizonrl.cluster.ops.plan import DoesNotFit, wait_until_fits

    cfg = load_config(ROOT / "configs/babyai-local.yaml", [
        "learner.world_size=2", "learner.num_cpus_per_worker=1.5",  # 4.5 CPUs in all
        "learner.placement_strategy=STRICT_PACK"])
    _fake_cluster(monkeypatch, {"a": {"CPU": 2.5}, "b": {"CPU": 2.5}})
    with pytest.raises(DoesNotFit, match=r"learner rank .* x 2, STRICT_PACK\) needs CPU 3"):
        wait_until_fits(cfg)


def test_nodes_that_share_an_ip_are_told_apart(monkeypatch):
    """Two raylets on one machine (ray.cluster_utils, or two pods on a host network) are two
    nodes, not one."""
    from horizonrl.cluster.ops.plan import live_nodes

    _fake_cluster(monkeypatch, {"127.0.0.1": {"CPU": 2.0}})
    import ray

    table = ray.nodes() * 2
    table[1] = {**table[1], "NodeID": "ff" * 28}
    monkeypatch.setattr(ray, "nodes", lambda: table)
    assert sorted(live_nodes()) == ["127.0.0.1 (node 0000000000)", "127.0.0.1 (node ffffffffff)"]
