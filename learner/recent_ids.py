"""The ingest's memory of stored trajectory ids, bounded.

Exactly-once only needs the ids a sender may still resend: those of its batch in flight (a
retry resends what got no ack) and of a restarted generator's last batch. Remembering every id
of a long run would grow the learner's memory by ~100 MB per million trajectories; remembering
the most recent `capacity` ids (oldest forgotten first) keeps it bounded. A resend older than
that window would be stored again, and the run's ledger would then report the id as a conflict.
"""

from __future__ import annotations

from collections import OrderedDict


class RecentIds:
    """A set of at most `capacity` strings that forgets the oldest first."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._ids: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, trajectory_id: object) -> bool:
        return trajectory_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def add(self, trajectory_id: str) -> None:
        if trajectory_id in self._ids:
            return
        self._ids[trajectory_id] = None
        if len(self._ids) > self.capacity:
            self._ids.popitem(last=False)
