"""MiniWoB++ task by task: the scripted expert's success and turns, a random agent's success
(each env's `random_action` on the last info), and the browser's reset and step latency, on
eval-split seeds in one env (one headless Chromium).

    .venv/bin/python bench/miniwob_experts.py [--episodes 20] [--max-turns 10] \
        [--out docs/miniwob/experts.json]

tests/integration/test_miniwob_pool.py checks the same through the env pool and through
`horizonrl env-server`; this writes the numbers docs/miniwob.md shows.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

from horizonrl.cluster.ops.provenance import command_line
from horizonrl.envpool.base import EVAL_SEED_OFFSET
from horizonrl.envpool.miniwob import MiniWoBEnv, random_action
from horizonrl.envpool.miniwob_tasks import TASKS


def episode(env: MiniWoBEnv, seed: int, agent: str, rng: random.Random, max_turns: int,
            clock: dict[str, list[float]]) -> tuple[bool, int]:
    """(success, turns) of one episode; reset and step wall times go into `clock`."""
    t0 = time.perf_counter()
    _, info = env.reset(seed=seed)
    clock["reset"].append(time.perf_counter() - t0)
    for turn in range(1, max_turns + 1):
        action = env.oracle_action() if agent == "expert" else random_action(info, rng)
        t0 = time.perf_counter()
        res = env.step(action)
        clock["step"].append(time.perf_counter() - t0)
        info = res.info
        if res.terminated or res.truncated:
            return bool(info["success"]), turn
    return False, max_turns


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--episodes", type=int, default=20, help="eval-split seeds per task")
    ap.add_argument("--max-turns", type=int, default=10)
    ap.add_argument("--out", default="docs/miniwob/experts.json")
    args = ap.parse_args()
    rng, rows = random.Random(0), []
    clock: dict[str, list[float]] = {"reset": [], "step": []}
    env = MiniWoBEnv()  # the default task set; seed i of the eval split plays TASKS[i % 15]
    try:
        for k, task in enumerate(TASKS):
            seeds = [EVAL_SEED_OFFSET + k + len(TASKS) * i for i in range(args.episodes)]
            row: dict = {"task": task}
            for agent in ("expert", "random"):
                runs = [episode(env, s, agent, rng, args.max_turns, clock) for s in seeds]
                row[f"{agent}_success"] = round(statistics.fmean(w for w, _ in runs), 3)
                row[f"{agent}_turns"] = round(statistics.fmean(t for _, t in runs), 2)
            print(f"[miniwob] {task}: {row}", flush=True)
            rows.append(row)
    finally:
        env.close()
    out = {"command": command_line(), "episodes": args.episodes, "max_turns": args.max_turns,
           "reset_ms_median": round(1000 * statistics.median(clock["reset"]), 1),
           "step_ms_median": round(1000 * statistics.median(clock["step"]), 1),
           "expert_success_mean": round(statistics.fmean(r["expert_success"] for r in rows), 3),
           "random_success_mean": round(statistics.fmean(r["random_success"] for r in rows), 3),
           "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(json.dumps({k: v for k, v in out.items() if k != "rows"}))


if __name__ == "__main__":
    main()
