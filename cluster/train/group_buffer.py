"""The async driver's buffer of collected, untrained trajectories, kept by GRPO group.

A group is complete once `group_size` of its episodes are in; the learner takes whole groups
only, those made by the oldest policy first (then in the order they completed), so a group that
completes late is taken before it can go stale. Streaming (partial rollouts) adds trajectories
as they arrive, so the groups of a rollout complete one by one while its stragglers still run;
the learner trains on those that are complete and never waits for the rest. A plain class: the
phase (cluster/train/phases.py) decides what goes in and when to take.
"""

from __future__ import annotations

from collections.abc import Iterable

from horizonrl.protos.trajectory import Trajectory


class GroupBuffer:
    """Trajectories by group id, and the order in which groups completed."""

    def __init__(self, group_size: int) -> None:
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        self.group_size = group_size
        self._groups: dict[str, list[Trajectory]] = {}
        self._complete: list[str] = []  # group ids in the order they completed

    def add(self, trajs: Iterable[Trajectory]) -> None:
        for t in trajs:
            members = self._groups.setdefault(t.group_id, [])
            members.append(t)
            if len(members) == self.group_size:
                self._complete.append(t.group_id)

    def complete(self) -> int:
        """How many groups are complete (and not taken yet)."""
        return len(self._complete)

    def take(self, n: int) -> list[Trajectory]:
        """The trajectories of `n` complete groups (fewer if fewer are complete), removed from
        the buffer, group by group: the groups whose oldest episode is the oldest policy's
        first, ties in the order they completed."""
        order = sorted(self._complete, key=lambda gid: min(
            t.policy_version for t in self._groups[gid]))  # stable: completion breaks ties
        ids = order[:n]
        self._complete = [gid for gid in self._complete if gid not in set(ids)]
        return [t for gid in ids for t in self._groups.pop(gid)]

    def drop(self, group_ids: Iterable[str]) -> list[Trajectory]:
        """Remove these groups (complete or not); returns their trajectories."""
        out: list[Trajectory] = []
        for gid in group_ids:
            out += self._groups.pop(gid, [])
            if gid in self._complete:
                self._complete.remove(gid)
        return out

    def members(self, group_id: str) -> int:
        return len(self._groups.get(group_id, ()))

    def trajectories(self) -> list[Trajectory]:
        """Everything buffered, group by group (what a checkpoint keeps)."""
        return [t for members in self._groups.values() for t in members]

    def __len__(self) -> int:
        return sum(map(len, self._groups.values()))
