"""The scripted experts as `horizonrl demos` runs them: success rate and mean turns per
environment and difficulty (BabyAI levels, TextCraft depth, Deep Search hops, SciWorld tasks).

    .venv/bin/python bench/experts.py [--episodes 200] [--out docs/long-horizon/experts.json]

Every cell is one `collect_demos` call (the env pool, the agent loop's token path, no noise)
on train-split seeds; the tokenizer is the embedded default's (any tokenizer gives the same
success and turns).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from horizonrl.cluster.ops.provenance import command_line

ROOT = Path(__file__).resolve().parents[1]

SCIWORLD = ["find-animal", "use-thermometer", "power-component", "lifespan-longest-lived"]
CELLS: list[tuple[str, str, dict, int]] = [  # (env, label, kwargs, turn cap)
    ("babyai", "GoToRedBall", {"level": "BabyAI-GoToRedBall-v0", "expert": "macro"}, 30),
    ("babyai", "GoToObjMaze", {"level": "BabyAI-GoToObjMaze-v0", "expert": "macro"}, 30),
    ("babyai", "GoTo", {"level": "BabyAI-GoTo-v0", "expert": "macro"}, 30),
    ("babyai", "GoToSeq", {"level": "BabyAI-GoToSeq-v0", "expert": "macro"}, 40),
    ("babyai", "UnlockPickup", {"level": "BabyAI-UnlockPickup-v0", "expert": "macro"}, 30),
    ("babyai", "UnlockLocal", {"level": "BabyAI-UnlockLocal-v0", "expert": "macro"}, 30),
    ("babyai", "KeyCorridorS3R3", {"level": "BabyAI-KeyCorridorS3R3-v0", "expert": "macro"}, 30),
    *[("textcraft", f"depth {d}", {"depths": [d]}, 40) for d in (1, 2, 3, 4)],
    *[("deepsearch", f"{h} hops", {"hops": [h]}, 12) for h in (1, 2, 3, 4)],
    *[("sciworld", task, {"tasks": [task], "simplification": "easy", "valid_actions": True},
       60) for task in SCIWORLD],
]


def main() -> None:
    from horizonrl.cluster.config import load_config
    from horizonrl.cluster.model.load import ensure_model
    from horizonrl.cluster.ops.runtime import ray_session
    from horizonrl.cluster.warm_start.demos import collect_demos

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--episodes", type=int, default=200)
    p.add_argument("--sciworld-episodes", type=int, default=8, help="per task: its JVMs are "
                   "slow to start and large (4 replicas)")
    p.add_argument("--envs", nargs="+", default=["babyai", "textcraft", "deepsearch",
                                                 "sciworld"])
    p.add_argument("--out", default="docs/long-horizon/experts.json")
    args = p.parse_args()
    default = load_config(ROOT / "configs/babyai-local.yaml")
    model = str(ensure_model(default.model, env=default.env))
    rows = []
    with ray_session(load_config(None).ray), tempfile.TemporaryDirectory() as tmp:
        for env, label, kwargs, cap in CELLS:
            if env not in args.envs:
                continue
            n = args.sciworld_episodes if env == "sciworld" else args.episodes
            replicas = 4 if env == "sciworld" else min(n, 64)
            cfg = load_config(None, [f"env.name={env}", f"env.kwargs={json.dumps(kwargs)}",
                                     f"env.replicas_per_actor={replicas}",
                                     # the tokenizer's folder: no model reads these tokens,
                                     # so a context beyond the tiny model's 4,096 is allowed
                                     f"model.path={model}",
                                     "generator.max_context_tokens=32768"])
            t0 = time.perf_counter()
            s = collect_demos(cfg, model_path=model, episodes=n, out=Path(tmp) / label,
                              max_turns=cap)
            rows.append({"env": env, "task": label, "kwargs": kwargs, "episodes": n,
                         "turn_cap": cap, "success_rate": round(s.success_rate, 3),
                         "mean_turns": round(s.mean_turns, 2),
                         "mean_tokens": round(s.mean_tokens),
                         "seconds": round(time.perf_counter() - t0, 1)})
            print(f"[experts] {env} {label}: success {s.success_rate:.3f}, "
                  f"mean turns {s.mean_turns:.2f}", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"command": command_line(),
                               "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
