"""Placement by role: the plan carries each role's custom resources, and the per-node dry run
puts each actor on a node that offers them, or says which fit on no one node."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from horizonrl.cluster.config import load_config
from horizonrl.cluster.plan import place_on_nodes, placement_plan, print_per_node
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
