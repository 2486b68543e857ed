"""The `horizonrl eval` report: results.json, results.md (tables) and PNG plots.

Input is `cluster.eval.metrics.summarise` output: results[model][env][str(max_turns)] = metrics.
Every table and plot puts all models side by side, so a `--compare A B` run reads as a comparison.
Plots are drawn with matplotlib's Agg canvas directly (no pyplot): no display, no global backend
state changed in the calling process.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from horizonrl.cluster.ops.png import save_png

PLOTS = ("accuracy_per_env.png", "accuracy_vs_max_turns.png", "pass_at_k.png", "interaction.png")
"""Plot files write_report makes, in order, after results.json and results.md."""

Cell = dict[str, Any]
LINESTYLES = ("-", "--", ":", "-.")
"""One line style per model in line plots (colour is the env), so a comparison pairs up."""
MARKERS = ("o", "s", "^", "D")


def write_report(results: dict[str, Any], out_dir: Path) -> list[Path]:
    """Write results.json, results.md and the PNG plots into out_dir; return their paths.

    The JSON and markdown are written first, so a machine without matplotlib (a dev extra) still
    keeps the numbers before the error that asks for it.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / "results.json", out_dir / "results.md"
    json_path.write_text(json.dumps(results, indent=2) + "\n")
    md_path.write_text(markdown(results))
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise RuntimeError("eval plots need matplotlib: `pip install matplotlib`") from None
    plots = [out_dir / name for name in PLOTS]
    for path, draw in zip(plots, (_plot_accuracy_per_env, _plot_accuracy_vs_turns,
                                  _plot_pass_at_k, _plot_interaction)):
        _save(draw, results, path)
    return [json_path, md_path, *plots]


# ---- reading the nested results ----------------------------------------------------------------


def _models(results: dict[str, Any]) -> list[str]:
    return list(results)


def _envs(results: dict[str, Any]) -> list[str]:
    return sorted({env for per_env in results.values() for env in per_env})


def _turns(results: dict[str, Any], env: str) -> list[int]:
    """Every max_turns any model was evaluated with on env, ascending."""
    return sorted({int(t) for per_env in results.values() for t in per_env.get(env, {})})


def _cell(results: dict[str, Any], model: str, env: str, turns: int) -> Cell | None:
    return results.get(model, {}).get(env, {}).get(str(turns))


def _largest(results: dict[str, Any], env: str) -> int:
    """The headline budget for env: its largest max_turns (models lacking it show as missing)."""
    return _turns(results, env)[-1]


def _ks(results: dict[str, Any]) -> list[int]:
    return sorted({int(k) for per_env in results.values() for cells in per_env.values()
                   for cell in cells.values() for k in cell["pass_at_k"]})


def _pass_at(cell: Cell | None, k: int) -> float | None:
    entry = cell["pass_at_k"].get(str(k)) if cell else None
    return entry["value"] if entry else None


def _get(cell: Cell | None, key: str) -> float | None:
    return cell.get(key) if cell else None


# ---- markdown ----------------------------------------------------------------------------------


def _fmt(x: float | None, digits: int = 3) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _accuracy_per_env_table(results: dict[str, Any]) -> str:
    models = _models(results)
    compare = len(models) == 2
    header = ["env", "horizon", *models]
    if compare:
        header.append(f"Δ ({models[1]} - {models[0]})")
    rows = []
    for env in _envs(results):
        t = _largest(results, env)
        accs = [_get(_cell(results, m, env, t), "accuracy") for m in models]
        row = [env, str(t), *map(_fmt, accs)]
        if compare:
            a, b = accs
            row.append("—" if a is None or b is None else f"{b - a:+.3f}")
        rows.append(row)
    return _table(header, rows)


def _accuracy_vs_turns_table(results: dict[str, Any]) -> str:
    models = _models(results)
    rows = [[env, str(t), *(_fmt(_get(_cell(results, m, env, t), "accuracy")) for m in models)]
            for env in _envs(results) for t in _turns(results, env)]
    return _table(["env", "horizon", *models], rows)


def _pass_at_k_table(results: dict[str, Any]) -> str:
    ks = _ks(results)
    rows = [[env, str(t), m, *(_fmt(_pass_at(_cell(results, m, env, t), k)) for k in ks)]
            for env in _envs(results) for t in _turns(results, env) for m in _models(results)]
    return _table(["env", "horizon", "model", *(f"pass@{k}" for k in ks)], rows)


def _interaction_table(results: dict[str, Any]) -> str:
    header = ["env", "horizon", "model", "episodes", "failed", "mean turns",
              "repeated-action rate", "invalid-action rate", "turns after goal",
              "share over-interacting"]
    rows = []
    for env in _envs(results):
        for t in _turns(results, env):
            for m in _models(results):
                c = _cell(results, m, env, t)
                if c is None:
                    rows.append([env, str(t), m, *["—"] * (len(header) - 3)])
                    continue
                rows.append([env, str(t), m, str(c["episodes"]), str(c["failed_episodes"]),
                             _fmt(c["mean_turns"], 2), _fmt(c["repeated_action_rate"]),
                             _fmt(c["invalid_action_rate"]), _fmt(c["over_interaction_turns"], 2),
                             _fmt(c["over_interaction_share"])])
    return _table(header, rows)


def markdown(results: dict[str, Any]) -> str:
    """The report's tables as one markdown document."""
    if not results:
        return "# Evaluation results\n\nNo episodes were evaluated.\n"
    return "\n\n".join([
        "# Evaluation results",
        f"Models: {', '.join(_models(results))}. Failed episodes (env errors, timeouts) are "
        "excluded from every statistic and counted in the interaction table. "
        "\"Largest horizon\" is the largest interaction budget (turns) evaluated on each env.",
        "## Accuracy per env (largest horizon)", _accuracy_per_env_table(results),
        "## Accuracy against the horizon", _accuracy_vs_turns_table(results),
        "## pass@K against K", _pass_at_k_table(results),
        "## Interaction statistics",
        "Turns after goal: mean turns taken after the goal was reached/reachable (envs that can "
        "tell); share over-interacting: the share of those episodes with any such turn.",
        _interaction_table(results),
    ]) + "\n"


# ---- plots -------------------------------------------------------------------------------------


def _save(draw: Callable[[Any, dict[str, Any]], None], results: dict[str, Any], path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 5), layout="constrained")
    FigureCanvasAgg(fig)
    draw(fig, results)
    save_png(fig, path, dpi=120)


def _nan(x: float | None) -> float:
    return math.nan if x is None else x


def _grouped_bars(ax: Any, results: dict[str, Any], key: str, *, labels: bool = True) -> None:
    """One group per env, one bar per model, at each env's largest max_turns."""
    envs, models = _envs(results), _models(results)
    width = 0.8 / len(models)
    for i, m in enumerate(models):
        xs = [j + (i - (len(models) - 1) / 2) * width for j in range(len(envs))]
        ys = [_nan(_get(_cell(results, m, env, _largest(results, env)), key)) for env in envs]
        bars = ax.bar(xs, ys, width, label=m, color=f"C{i}")
        if labels:
            ax.bar_label(bars, fmt="%.2f", padding=2, fontsize=8)
        for x, y in zip(xs, ys):
            if math.isnan(y):  # say "missing" rather than draw what reads as a zero
                ax.text(x, 0, "n/a", ha="center", va="bottom", fontsize=8, color="grey")
    # NaN bars do not count for autoscaling: fix the limits so every env keeps its slot.
    ax.set_xlim(-0.5, len(envs) - 0.5)
    ax.set_xticks(range(len(envs)), [f"{e}\n(T={_largest(results, e)})" for e in envs])


def _rate_axis(ax: Any, label: str) -> None:
    """Rates live in [0, 1]; a little headroom keeps the value labels inside the frame."""
    ax.set_ylim(0, 1.1)
    ax.set_yticks([0, 0.2, 0.4, 0.6, 0.8, 1.0])
    ax.set_ylabel(label)
    ax.grid(axis="y", alpha=0.3)


def _plot_accuracy_per_env(fig: Any, results: dict[str, Any]) -> None:
    ax = fig.add_subplot()
    if results:
        _grouped_bars(ax, results, "accuracy")
        ax.legend(title="model")
    _rate_axis(ax, "accuracy (success rate)")
    ax.set_xlabel("env (largest horizon T)")
    ax.set_title("Accuracy per env")


def _line_label(results: dict[str, Any], model: str, env: str) -> str:
    return f"{env} · {model}" if len(results) > 1 else env


def _line_plot(fig: Any, results: dict[str, Any],
               points: Callable[[str, str], tuple[list[int], list[float]]]) -> Any:
    """A line per model x env: colour is the env, line style and marker the model."""
    ax = fig.add_subplot()
    for j, env in enumerate(_envs(results)):
        for i, m in enumerate(_models(results)):
            xs, ys = points(m, env)
            if xs:
                ax.plot(xs, ys, color=f"C{j}", linestyle=LINESTYLES[i % len(LINESTYLES)],
                        marker=MARKERS[i % len(MARKERS)], label=_line_label(results, m, env))
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    return ax


def _plot_accuracy_vs_turns(fig: Any, results: dict[str, Any]) -> None:
    def points(m: str, env: str) -> tuple[list[int], list[float]]:
        ts = [t for t in _turns(results, env) if _get(_cell(results, m, env, t), "accuracy")
              is not None]
        return ts, [_cell(results, m, env, t)["accuracy"] for t in ts]

    ax = _line_plot(fig, results, points)
    turns = sorted({t for env in _envs(results) for t in _turns(results, env)})
    ax.set_xticks(turns)
    ax.set_xlabel("horizon (interaction budget, turns)")
    ax.set_ylabel("accuracy (success rate)")
    ax.set_title("Accuracy against the horizon")


def _plot_pass_at_k(fig: Any, results: dict[str, Any]) -> None:
    def points(m: str, env: str) -> tuple[list[int], list[float]]:
        cell = _cell(results, m, env, _largest(results, env))
        ks = [k for k in _ks(results) if _pass_at(cell, k) is not None]
        return ks, [_pass_at(cell, k) for k in ks]

    ax = _line_plot(fig, results, points)
    ks = _ks(results)
    ax.set_xscale("log", base=2)
    if ks:
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.set_xlim(ks[0] / 1.3, ks[-1] * 1.3)
    ax.minorticks_off()
    ax.set_xlabel("K (samples per task, log2 scale)")
    ax.set_ylabel("pass@K")
    ax.set_title("pass@K against K (largest horizon per env)")


def _plot_interaction(fig: Any, results: dict[str, Any]) -> None:
    fig.set_size_inches(11, 7)
    panels = (("mean_turns", "mean turns per episode", False),
              ("over_interaction_turns", "mean turns after the goal", False),
              ("repeated_action_rate", "repeated-action rate", True),
              ("invalid_action_rate", "invalid-action rate", True))
    axes = fig.subplots(2, 2).flat
    for ax, (key, label, is_rate) in zip(axes, panels):
        ax.set_title(label)
        if results:
            _grouped_bars(ax, results, key)
        if is_rate:
            _rate_axis(ax, label)
        else:
            ax.set_ylabel("turns")
            ax.set_ylim(bottom=0, top=max(1.0, ax.get_ylim()[1]) * 1.1)
            ax.grid(axis="y", alpha=0.3)
        if not any(math.isfinite(b.get_height()) for b in ax.patches):
            ax.text(0.5, 0.5, "no data for these envs", ha="center", va="center",
                    transform=ax.transAxes, color="grey")
    if results:
        handles, labels = fig.axes[0].get_legend_handles_labels()
        fig.legend(handles, labels, title="model", loc="outside lower center",
                   ncols=len(labels))
    fig.suptitle("Interaction statistics (largest horizon T per env)")
