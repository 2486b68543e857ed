"""GRPO against the turn-level estimators on one recipe: gains over behaviour cloning, seeds
that beat it, and the training curves, from `bench/long_horizon.py`'s results of each method.

    .venv/bin/python bench/credit_compare.py --name babyai-maze --split eval \
        --methods grpo=docs/credit/babyai-maze-grpo gigpo=docs/credit/babyai-maze-gigpo \
        --out docs/credit/babyai-maze

Every method's results come from the same clones (`bench/long_horizon.py --reuse-warm-start`)
and the same RL budget. Per method and env label (and "all", their mean, where a recipe has
several): BC and BC+RL accuracy per seed, the gain's mean, the seeds where RL beats BC;
per method and seed, the curves of the RL phase from the
run's metrics.jsonl (training success, task groups kept, anchor groups, share of turns with a
non-zero step-level advantage) and its wall time. Writes OUT/compare.json and OUT/curves.png.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from horizonrl.cluster.ops.png import save_png
from horizonrl.cluster.ops.provenance import command_line

TIE = 1e-9  # a gain below this is a tie (means of equal counts differ by float rounding)
CURVES = {"success": "success_rate", "groups_kept": "learner/groups_kept",
          "anchor_groups": "learner/anchor_groups",
          "step_adv_nonzero_share": "learner/step_adv_nonzero_share"}


def curves(run_dir: Path) -> dict[str, list[float | None]]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {name: [round(r[key], 4) if isinstance(r.get(key), (int, float)) else None
                   for r in rows] for name, key in CURVES.items()}


def per_env(record: dict, split: str, model: str) -> dict[str, float]:
    """One seed's accuracy per env label for one model, labels sorted, then "all" (their mean)
    where there are several: every label is scored on as many tasks."""
    got = dict(sorted(record["eval"][split][model].items()))
    if len(got) > 1:
        got["all"] = statistics.fmean(got.values())
    return got


def method_summary(results: dict, split: str) -> dict:
    per_seed = results["per_seed"]
    out: dict = {"envs": {}, "seeds": sorted(per_seed, key=int), "command": results["command"],
                 "wall_seconds": [r["wall_seconds"] for r in per_seed.values()]}
    bcs = [per_env(r, split, "bc") for r in per_seed.values()]
    rls = [per_env(r, split, "bc+rl") for r in per_seed.values()]
    for env in bcs[0]:
        bc, rl = [x[env] for x in bcs], [x[env] for x in rls]
        gains = [b - a for a, b in zip(bc, rl)]
        out["envs"][env] = {"bc": bc, "bc+rl": rl, "gain_mean": round(statistics.fmean(gains), 4),
                            "rl_mean": round(statistics.fmean(rl), 4),
                            "beats_bc_seeds": sum(g > TIE for g in gains)}
    out["curves"] = {seed: curves(Path(r["run_dir"])) for seed, r in per_seed.items()}
    return out


def merge_results(folders: str) -> dict:
    """One method's `bench/long_horizon.py` results from comma-separated --out folders (seeds
    run by separate invocations): their commands joined, their seeds in order."""
    parts = [json.loads((Path(f) / "results.json").read_text()) for f in folders.split(",")]
    return {"command": " ; ".join(r["command"] for r in parts),
            "per_seed": dict(sorted(((s, r) for p in parts for s, r in p["per_seed"].items()),
                                    key=lambda x: int(x[0])))}


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = list(CURVES)
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4))
    styles = ["-", "--", ":", "-.", (0, (1, 4))]
    for m, (method, s) in enumerate(summary.items()):
        for seed, c in s["curves"].items():
            for ax, name in zip(axes, panels):
                pts = [(i, v) for i, v in enumerate(c[name]) if v is not None]
                if pts:
                    ax.plot(*zip(*pts), linestyle=styles[m % len(styles)],
                            color=f"C{int(seed)}", label=f"{method} seed {seed}", linewidth=1)
    for ax, name in zip(axes, panels):
        ax.set(title=name, xlabel="RL step")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    save_png(fig, path, dpi=80)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--name", required=True, help="the recipe's name in the output")
    p.add_argument("--methods", nargs="+", required=True, metavar="NAME=DIR[,DIR]",
                   help="each method's bench/long_horizon.py --out folder(s); seeds run by "
                   "separate invocations of one method are merged")
    p.add_argument("--split", default="eval", choices=["eval", "train-new"])
    p.add_argument("--out", required=True)
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = {}
    for item in args.methods:
        name, folders = item.split("=", 1)
        summary[name] = method_summary(merge_results(folders), args.split)
    for name, s in summary.items():
        for env, e in s["envs"].items():
            print(f"[credit] {args.name} {name} {env}: BC {statistics.fmean(e['bc']):.3f} -> "
                  f"{e['rl_mean']:.3f} (gain {e['gain_mean']:+.3f}, beats BC on "
                  f"{e['beats_bc_seeds']}/{len(e['bc'])} seeds)")
    (out / "compare.json").write_text(json.dumps(
        {"command": command_line(), "name": args.name, "split": args.split,
         "methods": summary}, indent=1))
    plot(summary, out / "curves.png")


if __name__ == "__main__":
    main()
