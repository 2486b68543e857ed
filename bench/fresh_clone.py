"""The README's first command, timed from a fresh clone: `make train` on the embedded default.

    python3 bench/fresh_clone.py --out docs/default-run.json --plot docs/default-run.png

Clones the committed HEAD of this checkout into a temporary directory, runs `make train` there
(creating its own .venv and installing everything, then training `configs/babyai-local.yaml`),
and records the wall time of the whole command and of the install alone, the run's success
curve, the precision `auto` chose, the ledger line and the commit. With `--plot`, draws the
run's metrics.jsonl as the dashboard's panels (bench/plot_run.py). Packages come from pip's
cache where it has them, as they would on any machine that installed them once.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from horizonrl.cluster.ops.provenance import command_line

ROOT = Path(__file__).resolve().parents[1]
LIMIT_S = 3600  # the whole `make train`


def make_train(clone: Path, log: Path) -> tuple[float, float | None, Path]:
    """Run `make train` in `clone`; (wall seconds, seconds until training began, run dir)."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    t0, began, run_dir = time.perf_counter(), None, None
    with log.open("w") as f:
        # `timeout` bounds a hung install or run even when it prints nothing.
        proc = subprocess.Popen(["timeout", str(LIMIT_S), "make", "train"], cwd=clone, env=env,
                                text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for line in proc.stdout:  # progress as it comes
            f.write(line)
            print(line, end="", flush=True)
            if began is None and "horizonrl train" in line:
                began = time.perf_counter() - t0
            if m := re.search(r"\[horizonrl\] run dir (\S+)", line):
                run_dir = clone / m.group(1)
        if proc.wait() != 0 or run_dir is None:
            raise RuntimeError(f"make train failed (exit {proc.returncode}); log in {log}")
    return time.perf_counter() - t0, began, run_dir


def summarise(run_dir: Path, log: Path) -> dict:
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    success = [round(m["success_rate"], 4) for m in metrics]
    fifth = max(1, len(success) // 5)
    lines = log.read_text().splitlines()
    ledger = [x for x in lines if "ledger:" in x]
    middle = f"step {len(metrics) // 2:>3}/{len(metrics)} |"  # the README quotes this line
    progress = [x for x in lines if x.startswith(middle)]
    return {"iterations": len(metrics), "success": success,
            "success_first_fifth": round(statistics.fmean(success[:fifth]), 4),
            "success_last_fifth": round(statistics.fmean(success[-fifth:]), 4),
            "seconds_iteration_mean": round(statistics.fmean(
                m["seconds/iteration"] for m in metrics), 3),
            "precision": json.loads((run_dir / "precision.json").read_text()),
            "ledger": ledger[-1].split("ledger:", 1)[1].strip() if ledger else None,
            "progress_line": progress[0] if progress else None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--plot", help="also draw the run's panels to this PNG")
    args = p.parse_args()
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, text=True, check=True,
                            capture_output=True).stdout.strip()
    tmp = Path(tempfile.mkdtemp(prefix="horizonrl-fresh-"))
    try:
        clone = tmp / "horizonrl"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        wall, began, run_dir = make_train(clone, tmp / "make-train.log")
        result = {"command": command_line(python="python3"),
                  "commit": commit, "cpus": os.cpu_count(), "wall_seconds": round(wall, 1),
                  "install_seconds": round(began, 1) if began is not None else None,
                  **summarise(run_dir, tmp / "make-train.log")}
        if args.plot:
            subprocess.run([str(clone / ".venv/bin/python"), str(ROOT / "bench/plot_run.py"),
                            str(run_dir), str(Path(args.plot).resolve())], check=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print({k: v for k, v in result.items() if k != "success"})


if __name__ == "__main__":
    main()
