"""learner.recent_ids: the ingest's bounded memory of stored ids."""

from __future__ import annotations

import pytest

from horizonrl.learner.recent_ids import RecentIds


def test_keeps_the_latest_and_forgets_the_oldest_first():
    ids = RecentIds(3)
    for x in "abcd":
        ids.add(x)
    assert len(ids) == 3 and "a" not in ids and all(x in ids for x in "bcd")
    ids.add("b")  # already known: no reordering, nothing forgotten
    ids.add("e")
    assert "b" not in ids and all(x in ids for x in "cde")


def test_capacity_must_be_positive():
    with pytest.raises(ValueError, match="capacity"):
        RecentIds(0)
