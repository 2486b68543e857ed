"""GroupBuffer: groups complete when group_size episodes are in, the learner takes the oldest
complete ones whole, and incomplete groups wait (or are dropped) without blocking the rest."""

from __future__ import annotations

import pytest

from horizonrl.cluster.train.group_buffer import GroupBuffer
from horizonrl.protos.trajectory import Trajectory


def _t(group: str, k: int, version: int = 0) -> Trajectory:
    return Trajectory(trajectory_id=f"{group}-{k}", group_id=group, task_id=group,
                      env_name="babyai", policy_version=version, horizon=4, prompt_ids=(1,),
                      response_ids=(2,), response_mask=(1,), response_logprobs=(0.0,),
                      rewards=(0.0,), reward=0.0, num_turns=1, terminated=True,
                      truncated=False)


def test_takes_complete_groups_in_the_order_they_completed_past_a_straggler():
    buf = GroupBuffer(group_size=2)
    # Group a starts first but its second episode is the straggler.
    buf.add([_t("a", 0), _t("b", 0), _t("b", 1), _t("c", 0)])
    assert buf.complete() == 1
    buf.add([_t("c", 1)])
    assert buf.complete() == 2
    taken = buf.take(2)
    assert [t.trajectory_id for t in taken] == ["b-0", "b-1", "c-0", "c-1"]
    assert buf.complete() == 0 and len(buf) == 1 and buf.members("a") == 1
    buf.add([_t("a", 1)])
    assert [t.trajectory_id for t in buf.take(5)] == ["a-0", "a-1"]  # fewer than asked
    assert len(buf) == 0


def test_takes_the_oldest_policys_groups_first_whatever_their_completion():
    buf = GroupBuffer(group_size=2)
    # n (version 3) completes first, o (version 1, a late straggler) last: o goes first,
    # before it can fall further behind; equal versions keep their completion order.
    buf.add([_t("n", 0, 3), _t("n", 1, 3), _t("m", 0, 2), _t("m", 1, 3), _t("p", 0, 2),
             _t("p", 1, 2), _t("o", 0, 1), _t("o", 1, 4)])
    assert [t.group_id for t in buf.take(1)] == ["o", "o"]
    assert [t.group_id for t in buf.take(2)] == ["m", "m", "p", "p"]
    assert [t.group_id for t in buf.take(2)] == ["n", "n"] and buf.complete() == 0


def test_drop_removes_complete_and_incomplete_groups_and_keeps_the_rest():
    buf = GroupBuffer(group_size=2)
    buf.add([_t("a", 0), _t("b", 0), _t("b", 1), _t("c", 0), _t("c", 1)])
    dropped = buf.drop(["a", "b", "missing"])
    assert sorted(t.trajectory_id for t in dropped) == ["a-0", "b-0", "b-1"]
    assert buf.complete() == 1
    assert [t.trajectory_id for t in buf.trajectories()] == ["c-0", "c-1"]


def test_rejects_an_empty_group_size():
    with pytest.raises(ValueError, match="group_size"):
        GroupBuffer(group_size=0)
