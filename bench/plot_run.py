"""Draw a run's metrics.jsonl as the Grafana dashboard's main panels, to a PNG.

    .venv/bin/python bench/plot_run.py runs/<run>/ docs/default-run.png

For machines without Grafana: the same series the dashboard queries, read from the run dir.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from horizonrl.cluster.ops.png import save_png

PANELS = [
    ("Success rate", ["success_rate"]),
    ("Turns per episode and horizon", ["turns_mean", "horizon", "truncated_at_horizon_rate"]),
    ("Invalid and repeated actions", ["invalid_action_rate", "repeated_action_rate"]),
    ("Throughput", ["tokens_per_s", "env_steps_per_s"]),
    ("Learner health", ["learner/loss", "learner/kl", "learner/entropy", "learner/grad_norm",
                        "learner/clip_frac"]),
    ("Seconds per phase", ["seconds/generate", "seconds/env", "seconds/transport",
                           "seconds/learn", "seconds/weight_sync"]),
]


def main(run_dir: str, out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    fig, axes = plt.subplots(3, 2, figsize=(12, 10))
    for ax, (title, keys) in zip(axes.flat, PANELS):
        for k in keys:
            pts = [(r["step"], r[k]) for r in rows if isinstance(r.get(k), (int, float))]
            if pts:
                ax.plot(*zip(*pts), label=k.split("/")[-1])
        ax.set(title=title, xlabel="training step")
        ax.legend(fontsize=8)
    fig.suptitle(f"{Path(run_dir).name}: the dashboard's series from metrics.jsonl")
    fig.tight_layout()
    save_png(fig, out, dpi=100)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
