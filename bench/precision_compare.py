"""The embedded default trained in each precision: does it still learn, and how fast is it?

    .venv/bin/python bench/precision_compare.py --out docs/precision/default-run.json

Runs `horizonrl train --config configs/babyai-local.yaml` (the embedded default) once per
setting and seed, in turn: learner fp32 + vLLM float32, learner bf16 + vLLM float32, learner
bf16 + vLLM bfloat16. Records each run's success curve, wall time and seconds per phase from
its metrics.jsonl, and per setting the mean and spread over seeds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from horizonrl.cluster.ops.provenance import command_line

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {
    "fp32": ["learner.dtype=float32", "generator.dtype=float32"],
    "bf16 learner": ["learner.dtype=bfloat16", "generator.dtype=float32"],
    "bf16 learner + vLLM": ["learner.dtype=bfloat16", "generator.dtype=bfloat16"],
}


def run(name: str, overrides: list[str], *, config: str, root: Path, extra: list[str]) -> dict:
    t0 = time.perf_counter()
    slug = name.replace(" ", "_").replace("+", "")
    with (root / f"{slug}.log").open("w") as f:
        subprocess.run([sys.executable, "-m", "horizonrl.cluster.cli", "train", "--config", config,
                        f"run_root={root / 'runs' / slug}", "metrics.port=0",
                        *overrides, *extra], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                       check=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    wall = time.perf_counter() - t0
    (run_dir,) = (root / "runs" / slug).iterdir()
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    success = [round(m["success_rate"], 4) for m in metrics]
    fifth = max(1, len(success) // 5)
    return {"wall_seconds": round(wall, 1), "success": success,
            "success_first_fifth": round(statistics.fmean(success[:fifth]), 4),
            "success_last_fifth": round(statistics.fmean(success[-fifth:]), 4),
            "seconds_learn_mean": round(statistics.fmean(m["seconds/learn"] for m in metrics), 3),
            "seconds_generate_mean": round(statistics.fmean(m["seconds/generate"]
                                                            for m in metrics), 3),
            "seconds_iteration_mean": round(statistics.fmean(m["seconds/iteration"]
                                                             for m in metrics), 3)}


def summary(per_seed: dict[int, dict]) -> dict:
    """Mean and spread (population std) over seeds of each scalar a run reports."""
    keys = [k for k, v in next(iter(per_seed.values())).items() if isinstance(v, float)]
    out = {}
    for k in keys:
        vals = [r[k] for r in per_seed.values()]
        out[k] = {"mean": round(statistics.fmean(vals), 4),
                  "std": round(statistics.pstdev(vals), 4)}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--config", default="configs/babyai-local.yaml")
    p.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--out", required=True)
    p.add_argument("overrides", nargs="*", help="dotted overrides for every run")
    args = p.parse_args()
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:  # seeds outermost: a late load spike hits every setting alike
            for name in args.settings:
                r = run(f"{name} seed{seed}", SETTINGS[name], config=args.config, root=Path(tmp),
                        extra=[f"seed={seed}", *args.overrides])
                rows.setdefault(name, {"overrides": SETTINGS[name], "seeds": {}})["seeds"][seed] = r
                print(name, seed, {k: v for k, v in r.items() if k != "success"}, flush=True)
    for row in rows.values():
        row["summary"] = summary(row["seeds"])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({
        "command": command_line(),
        "config": args.config, "runs": rows}, indent=1))


if __name__ == "__main__":
    main()
