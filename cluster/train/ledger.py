"""The run's trajectory ledger: every id generated ends in exactly one fate, trained or dropped
with a reason, and the counts reconcile.

Fates:
- trained: in a policy update (for GRPO etc. after group filtering; for rejection sampling the
  successful episodes).
- dropped, with a reason: `env_error` / `timeout` (infrastructure failure, masked out of group
  statistics, never scored 0), `generator_lost` (delivered by a generator that then died; its
  share was re-run under new ids), `zero_variance` (group without reward variance),
  `stale` (async: too many versions behind), `update_skipped` (too few episodes for an update),
  `not_selected` (dynamic sampling surplus, rejection sampling's failures), `in_flight` (async:
  buffered when the run ended), `overlong` (cut by the context limit or the horizon under
  `learner.overlong=mask`; under `penalty` such an episode is trained, with the lowered reward).
Episodes that died with their generator before they had an id are counted apart
(`generator_error`): they were re-issued, so they are not lost work but not ids either. So are
the episodes of async rollouts in flight at the checkpoint a run resumed from (`resampled`):
they never got ids in the ledger, and the resumed run generates them again, same tasks.

The ledger appends one JSON line per fate to <run>/ledger.jsonl and keeps a summary in
<run>/ledger.json; a run whose counts do not reconcile says so loudly at the end.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

REASONS = ("env_error", "timeout", "generator_lost", "zero_variance", "stale", "update_skipped",
           "not_selected", "in_flight", "overlong")


class Ledger:
    """Fates of trajectory ids; `summary()["reconciled"]` is the invariant."""

    def __init__(self, run_dir: Path | None = None) -> None:
        self.generated: set[str] = set()
        self.fate: dict[str, str] = {}  # id -> "trained" | "dropped:<reason>"
        self.conflicts: list[str] = []  # an id given two fates, or a fate without generation
        # Episodes lost with their generator before they were pushed (no id), per step: a
        # resume drops the counts of the steps it re-runs, as it drops their lines.
        self.generator_error_by_step: dict[int, int] = {}
        self.resampled_by_step: dict[int, int] = {}  # async resume: in-flight episodes re-run
        self._log = (run_dir / "ledger.jsonl").open("a") if run_dir is not None else None
        self._path = run_dir / "ledger.json" if run_dir is not None else None

    @classmethod
    def resume(cls, run_dir: Path, step: int) -> Ledger:
        """The run's ledger as it stood before `step` (later lines belong to steps about to be
        run again, as with metrics.jsonl), appending from there."""
        path = run_dir / "ledger.jsonl"
        lines = []
        if path.exists():
            for raw in path.read_text().splitlines():
                try:
                    x = json.loads(raw)
                except json.JSONDecodeError:  # a line cut by the kill: its step re-runs
                    continue
                if x["step"] < step:
                    lines.append(x)
            path.write_text("".join(json.dumps(x) + "\n" for x in lines))
        led = cls(run_dir)
        for x in lines:
            led.generated.add(x["id"])
            led.fate[x["id"]] = x["fate"]
        summary = run_dir / "ledger.json"
        if summary.exists():
            saved = json.loads(summary.read_text())
            for key in ("generator_error_by_step", "resampled_by_step"):
                setattr(led, key, {int(k): n for k, n in saved.get(key, {}).items()
                                   if int(k) < step})
        return led

    def add_generated(self, ids: Iterable[str]) -> None:
        for i in ids:
            if i in self.generated:
                self.conflicts.append(f"{i}: generated twice")
            self.generated.add(i)

    def add_trained(self, ids: Iterable[str], step: int) -> None:
        self._settle(ids, "trained", step)

    def add_dropped(self, ids: Iterable[str], reason: str, step: int) -> None:
        if reason not in REASONS:
            raise ValueError(f"unknown drop reason {reason!r}; known: {', '.join(REASONS)}")
        self._settle(ids, f"dropped:{reason}", step)

    def add_generator_error(self, episodes: int, step: int) -> None:
        """Episodes that died with their generator before they were pushed (no id)."""
        self.generator_error_by_step[step] = self.generator_error_by_step.get(step, 0) + episodes

    def add_resampled(self, episodes: int, step: int) -> None:
        """Episodes of rollouts in flight at the checkpoint, issued again by the resumed run."""
        if episodes:
            self.resampled_by_step[step] = self.resampled_by_step.get(step, 0) + episodes

    @property
    def generator_error(self) -> int:
        return sum(self.generator_error_by_step.values())

    def _settle(self, ids: Iterable[str], fate: str, step: int) -> None:
        for i in ids:
            if i not in self.generated:
                self.conflicts.append(f"{i}: {fate} but never generated")
            if i in self.fate:
                self.conflicts.append(f"{i}: {fate} after {self.fate[i]}")
                continue
            self.fate[i] = fate
            if self._log is not None:
                self._log.write(json.dumps({"step": step, "id": i, "fate": fate}) + "\n")

    def summary(self) -> dict[str, Any]:
        fates = Counter(self.fate.values())
        dropped = {r: fates.get(f"dropped:{r}", 0) for r in REASONS}
        unaccounted = self.generated - self.fate.keys()
        return {"generated": len(self.generated), "trained": fates.get("trained", 0),
                "dropped": {r: n for r, n in dropped.items() if n},
                "dropped_total": sum(dropped.values()), "unaccounted": len(unaccounted),
                "generator_error_episodes": self.generator_error,
                "resampled_episodes": sum(self.resampled_by_step.values()),
                "conflicts": len(self.conflicts),
                "reconciled": not unaccounted and not self.conflicts}

    def flush(self) -> dict[str, Any]:
        """Write the summary (and the log so far); returns the summary."""
        s = self.summary()
        if self._log is not None and not self._log.closed:
            self._log.flush()
            self._path.write_text(json.dumps(
                {**s, "generator_error_by_step": self.generator_error_by_step,
                 "resampled_by_step": self.resampled_by_step,
                 "conflict_examples": self.conflicts[:20]}, indent=2))
        return s

    def close(self) -> dict[str, Any]:
        """Flush and close (again: a no-op that returns the summary)."""
        s = self.flush()
        if self._log is not None and not self._log.closed:
            self._log.close()
        if not s["reconciled"]:
            print(f"[horizonrl] LEDGER DOES NOT RECONCILE: {s['unaccounted']} trajectories "
                  f"unaccounted, {s['conflicts']} conflicts (see ledger.json)", flush=True)
        return s
