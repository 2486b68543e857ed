"""Model size against credit assignment on one long-task recipe: base, BC and BC + RL per preset
and RL method, from `bench/long_horizon.py`'s results, with the deltas each change made.

    .venv/bin/python bench/capacity.py --name babyai-maze --split eval \
        --cell xs/grpo=docs/credit/babyai-maze-grpo,docs/credit/babyai-maze-grpo-s12 \
        --cell xs/gigpo=docs/credit/babyai-maze-gigpo,docs/credit/babyai-maze-gigpo-s12 \
        --cell s/grpo=docs/capacity/babyai-maze-s --out docs/capacity/babyai-maze

Each `--cell PRESET/METHOD=DIR[,DIR]` names one preset's runs of one RL method (the folders of
separate invocations merged, as bench/credit_compare.py does). A preset's base and BC rows come
from its runs: every method of a preset trains from the same clones (`--reuse-warm-start`), so
a seed's BC is the same in each; where two cells disagree the first listed is kept and the
disagreement is recorded. Per env label (and "all", the labels' mean, where a recipe has
several): each row's mean, std and per-seed values, the seeds where RL beats BC, the recipe's
wall time per seed; then the deltas, on the seeds both sides have: size (`xs` -> the other
presets) for BC and for each method's BC + RL, and credit (the first method -> each other) at
each preset. Writes OUT/compare.json and OUT/compare.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

if not __package__:  # run as `python bench/NAME.py`: the checkout on the path, not bench/
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.credit_compare import TIE, merge_results, per_env
from horizonrl.cluster.ops.provenance import command_line


def stats(by_seed: dict[str, float]) -> dict:
    xs = list(by_seed.values())
    return {"mean": round(statistics.fmean(xs), 4), "std": round(statistics.pstdev(xs), 4),
            "per_seed": {s: round(v, 4) for s, v in by_seed.items()}}


def preset_rows(cells: dict[str, dict], split: str) -> dict:
    """One preset: base and BC per env and seed (from its cells), and per method BC + RL, the
    seeds where it beats BC, wall times and the training success over the first/last 10 steps."""
    base: dict[str, dict[str, float]] = {}
    bc: dict[str, dict[str, float]] = {}
    disagree = []
    methods = {}
    for method, results in cells.items():
        rl: dict[str, dict[str, float]] = {}
        for seed, r in results["per_seed"].items():
            for rows, model in ((base, "base"), (bc, "bc"), (rl, "bc+rl")):
                for env, v in per_env(r, split, model).items():
                    seen = rows.setdefault(env, {})
                    if model != "bc+rl" and seed in seen and abs(seen[seed] - v) > TIE:
                        disagree.append({"method": method, "seed": seed, "env": env,
                                         "model": model, "kept": seen[seed], "this": v})
                    seen.setdefault(seed, v)
        wins = {env: sum(v > bc[env][s] + TIE for s, v in by.items()) for env, by in rl.items()}
        success = {s: r.get("train_success", []) for s, r in results["per_seed"].items()}
        methods[method] = {
            "command": results["command"],
            "bc+rl": {env: stats(by) for env, by in rl.items()},
            "rl_beats_bc_seeds": wins,
            **{key: {s: r.get(key) for s, r in results["per_seed"].items()}
               for key in ("wall_seconds", "resumed", "warm_start_from", "warm_start_seconds")},
            "train_success_first_last_10": {
                s: [round(statistics.fmean(x[:10]), 4), round(statistics.fmean(x[-10:]), 4)]
                for s, x in success.items() if x}}
    return {"base": {env: stats(by) for env, by in base.items()},
            "bc": {env: stats(by) for env, by in bc.items()},
            "methods": methods, "bc_disagreements": disagree}


def delta(a: dict, b: dict) -> dict | None:
    """Mean of b - a over the seeds both have (None if none)."""
    seeds = sorted(set(a["per_seed"]) & set(b["per_seed"]), key=int)
    if not seeds:
        return None
    return {"seeds": seeds, "mean": round(statistics.fmean(
        b["per_seed"][s] - a["per_seed"][s] for s in seeds), 4)}


def deltas(presets: dict[str, dict], ref: str = "xs") -> dict:
    size, credit = {}, {}
    for name, p in presets.items():
        ms = list(p["methods"])
        credit[name] = {f"{ms[0]}->{m}": {env: delta(p["methods"][ms[0]]["bc+rl"][env], cell)
                                         for env, cell in p["methods"][m]["bc+rl"].items()}
                        for m in ms[1:]}
        if name == ref or ref not in presets:
            continue
        r = presets[ref]
        size[f"{ref}->{name}"] = {
            "bc": {env: delta(r["bc"][env], cell) for env, cell in p["bc"].items()},
            **{m: {env: delta(r["methods"][m]["bc+rl"][env], cell)
                   for env, cell in c["bc+rl"].items()}
               for m, c in p["methods"].items() if m in r["methods"]}}
    return {"size": size, "credit": credit}


def mark(method: dict, seed: str) -> str:
    """What a seed's wall time covers: † RL alone (a reused clone), * a resumed run's rest."""
    if method["warm_start_from"][seed]:
        return "†"
    return "*" if method["resumed"][seed] else ""


def markdown(name: str, split: str, presets: dict, moved: dict) -> str:
    methods = list(dict.fromkeys(m for p in presets.values() for m in p["methods"]))
    cell = lambda c: f"{c['mean']:.3f} ± {c['std']:.3f} ({len(c['per_seed'])})"  # noqa: E731
    lines = [f"# {name}, split {split}: mean ± std (seeds)\n",
             "| env | preset | base | BC | " + " | ".join(f"BC + {m}" for m in methods)
             + " | RL > BC seeds | wall s per seed |", "|---" * (6 + len(methods)) + "|"]
    for env in next(iter(presets.values()))["bc"]:
        for pname, p in presets.items():
            rl = [cell(p["methods"][m]["bc+rl"][env]) if m in p["methods"] else "-"
                  for m in methods]
            wins = "; ".join(f"{m} {p['methods'][m]['rl_beats_bc_seeds'][env]}/"
                             f"{len(p['methods'][m]['bc+rl'][env]['per_seed'])}"
                             for m in p["methods"])
            walls = "; ".join(f"{m} " + ", ".join(
                f"{w:.0f}{mark(p['methods'][m], s)}"
                for s, w in p["methods"][m]["wall_seconds"].items()) for m in p["methods"])
            lines.append(f"| {env} | {pname} | {cell(p['base'][env])} | {cell(p['bc'][env])} | "
                         + " | ".join(rl) + f" | {wins} | {walls} |")
    lines.append("\nWall time: the training subprocess of each seed (demonstrations, cloning, "
                 "the in-run evaluation, RL), the bench's own evaluations not counted; "
                 "† RL alone, from an earlier invocation's clone; * the rest of a stopped run "
                 "only.\n")
    for kind, table in moved.items():
        for what, by_row in table.items():
            for row, envs in by_row.items():
                got = ", ".join(f"{env} {d['mean']:+.3f} (seeds {' '.join(d['seeds'])})"
                                for env, d in envs.items() if d)
                lines.append(f"- {kind} {what} {row}: {got or 'no common seeds'}")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--name", required=True, help="the recipe's name in the output")
    p.add_argument("--cell", action="append", required=True, metavar="PRESET/METHOD=DIR[,DIR]",
                   help="one preset's bench/long_horizon.py --out folder(s) for one RL method")
    p.add_argument("--split", default="eval", choices=["eval", "train-new"])
    p.add_argument("--out", required=True)
    args = p.parse_args()
    grouped: dict[str, dict[str, dict]] = {}
    for item in args.cell:
        key, folders = item.split("=", 1)
        preset, method = key.split("/", 1)
        grouped.setdefault(preset, {})[method] = merge_results(folders)
    presets = {name: preset_rows(cells, args.split) for name, cells in grouped.items()}
    moved = deltas(presets)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.json").write_text(json.dumps(
        {"command": command_line(), "name": args.name, "split": args.split,
         "presets": presets, "deltas": moved}, indent=1))
    text = markdown(args.name, args.split, presets, moved)
    (out / "compare.md").write_text(f"`{command_line()}`\n\n{text}")
    print(text)


if __name__ == "__main__":
    main()
