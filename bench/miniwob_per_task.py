"""Per-task success of the MiniWoB++ models that `bench/long_horizon.py` scored, from the
episodes its evaluations kept (OUT/eval/seed*-eval/episodes.jsonl, or the archive docs/ keeps
them in, bench/doc_episodes.py): which tasks behaviour cloning learned and where RL moved them.

    .venv/bin/python bench/miniwob_per_task.py docs/long-horizon/miniwob \
        --out docs/long-horizon/miniwob/per_task.json

A seed's task is fixed by the env (`envpool/miniwob.py`, `task_for_seed`); the task list is
the env's default set unless `--tasks` names the one the config used.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

if not __package__:  # run as `python bench/NAME.py`: the checkout on the path, not bench/
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.doc_episodes import read_episodes
from horizonrl.cluster.ops.provenance import command_line
from horizonrl.envpool.miniwob import task_for_seed
from horizonrl.envpool.miniwob_tasks import TASKS


def per_task(folder: Path, tasks: tuple[str, ...]) -> dict:
    """{model: {task: [success rate per seed]}} over every seed's eval episodes."""
    # As cluster/eval/evaluate.py writes them, gzipped, or in the archive docs/ keeps them in.
    folders = sorted(p for p in folder.glob("eval/seed*-eval") if p.is_dir())
    if not folders:
        raise SystemExit(f"{folder}: no eval/seed*-eval folders")
    rates: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for f in folders:
        wins: dict[tuple[str, str], list[bool]] = defaultdict(list)
        for ep in read_episodes(f):
            if ep.get("failure"):
                continue
            wins[ep["model"], task_for_seed(ep["seed"], tasks)].append(bool(ep["success"]))
        for (model, task), won in wins.items():
            rates[model][task].append(sum(won) / len(won))
    return {m: dict(t) for m, t in rates.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folder", help="a bench/long_horizon.py --out folder")
    ap.add_argument("--tasks", nargs="+", default=list(TASKS))
    ap.add_argument("--out", help="write the table as JSON here")
    args = ap.parse_args()
    tasks = tuple(args.tasks)
    rates = per_task(Path(args.folder), tasks)
    models = [m for m in ("base", "bc", "bc+rl") if m in rates]
    print("| task | " + " | ".join(models) + " |\n|---|" + "---|" * len(models))
    table = []
    for task in tasks:
        means = {m: statistics.fmean(rates[m][task]) for m in models if rates[m].get(task)}
        print(f"| {task} | " + " | ".join(f"{means[m]:.2f}" if m in means else "-"
                                        for m in models) + " |")
        table.append({"task": task, **{m: round(v, 3) for m, v in means.items()},
                      "per_seed": {m: [round(v, 3) for v in rates[m].get(task, [])]
                                   for m in models}})
    if args.out:
        Path(args.out).write_text(json.dumps({"command": command_line(), "rows": table},
                                             indent=1))


if __name__ == "__main__":
    main()
