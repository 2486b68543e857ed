"""What the RL phase of training runs did, from their metrics.jsonl: how many GRPO groups per
step carried a learning signal, and how success and invalid actions moved.

    .venv/bin/python bench/run_summary.py runs/long-horizon-tc/seed*/* \
        --out docs/long-horizon/textcraft/training.json

Per run: steps; groups kept per step (those whose rewards differ; the others have advantage 0
and are dropped), mean and the number of steps with none; rows (episodes, or turns in window
mode; rejection sampling: distinct successes) trained per step; success and invalid-action rate over
the first and last `--window` steps; per env label, success over the same windows; with
demonstration replay, the replayed demonstrations' loss over the same windows.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from horizonrl.cluster.ops.provenance import command_line


def summarise(run: Path, window: int) -> dict:
    ms = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    if not ms:
        raise SystemExit(f"{run}: no metrics yet")

    def mean(key: str, rows: list[dict]) -> float:
        vals = [m[key] for m in rows if key in m]
        return round(statistics.fmean(vals), 4) if vals else float("nan")

    first, last = ms[:window], ms[-window:]
    # Groups with signal: those GRPO-style learners kept; rejection sampling keeps successes,
    # so there the count is dynamic sampling's (absent without it).
    key = "learner/groups_kept" if any("learner/groups_kept" in m for m in ms) else \
        "sampling/groups_with_signal"
    kept = [m[key] for m in ms if key in m]
    # Behaviour-cloning replay (init.replay_batch): the replayed demonstrations' loss.
    replay = sorted({k for m in ms for k in m if "replay_" in k and k.endswith("loss")})
    envs = sorted({k.split("/")[1] for m in ms for k in m if k.startswith("env/")
                   and k.endswith("/success_rate")})
    return {
        "run": str(run), "steps": len(ms),
        "groups_kept_mean": round(statistics.fmean(kept), 3) if kept else None,
        "steps_without_signal": sum(k == 0 for k in kept) if kept else None,
        "episodes_trained_mean": mean("learner/rows_trained", ms),
        "success": [mean("success_rate", first), mean("success_rate", last)],
        "invalid_action_rate": [mean("invalid_action_rate", first),
                                mean("invalid_action_rate", last)],
        **({"replay_loss": [mean(replay[0], first), mean(replay[0], last)]} if replay else {}),
        "env_success": {e: [mean(f"env/{e}/success_rate", first),
                            mean(f"env/{e}/success_rate", last)] for e in envs},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("runs", nargs="+", help="run directories")
    p.add_argument("--window", type=int, default=5, help="first and last steps compared")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    write([Path(r) for r in args.runs], Path(args.out), args.window, command_line())


def write(runs: list[Path], out: Path, window: int, command: str) -> None:
    """Summarise `runs` into `out`, recording `command` (bench/long_horizon.py calls this for
    the runs it trains, so its own command accounts for the file)."""
    rows = [summarise(r, window) for r in runs]
    for r in rows:
        print(json.dumps({k: v for k, v in r.items() if k != "env_success"}), flush=True)
    out.write_text(json.dumps({"command": command, "window": window, "runs": rows}, indent=1))


if __name__ == "__main__":
    main()
