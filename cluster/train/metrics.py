"""Run-directory metrics: metrics.jsonl (one JSON line per step) and TensorBoard scalars."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


class MetricsLogger:
    """Appends one JSON line per step and mirrors numeric values to TensorBoard."""

    def __init__(self, run_dir: Path, *, wandb_config: dict[str, Any] | None = None) -> None:
        self.path = run_dir / "metrics.jsonl"
        self._file = self.path.open("a")
        self._wandb = None
        if wandb_config is not None:
            import os

            try:
                import wandb
            except ImportError:
                raise RuntimeError("metrics.wandb=true needs `pip install wandb`") from None
            os.environ.setdefault("WANDB_MODE", "offline")
            self._wandb = wandb.init(project="horizonrl", name=run_dir.name,
                                     dir=str(run_dir), config=wandb_config)
        from torch.utils.tensorboard import SummaryWriter

        self._tb = SummaryWriter(str(run_dir / "tensorboard"))

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        self._file.write(json.dumps({"step": step, **metrics}) + "\n")
        self._file.flush()
        numeric = {k: v for k, v in metrics.items()
                   if isinstance(v, (int, float)) and math.isfinite(v)}
        for k, v in numeric.items():
            self._tb.add_scalar(k, v, step)
        if self._wandb is not None:
            self._wandb.log(numeric, step=step)

    def close(self) -> None:
        self._file.close()
        self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def progress_line(m: dict[str, Any], iterations: int) -> str:
    """The one line printed per iteration."""
    s = m["seconds"]
    return (f"step {m['step'] + 1:>3}/{iterations} | H {m['horizon']} | v{m['policy_version']} | "
            f"reward {m['reward_mean']:.3f} | success {m['success_rate']:.3f} | "
            f"turns {m['turns_mean']:.2f} | invalid {m['invalid_action_rate']:.3f} | "
            f"{m['tokens_per_s']:.0f} tok/s | {m['env_steps_per_s']:.0f} env-steps/s | "
            f"gen {s['generate']:.2f}s env {s['env']:.2f}s transport {s['transport']:.2f}s "
            f"learn {s['learn']:.2f}s sync {s['weight_sync']:.2f}s | total {s['iteration']:.2f}s")


class ProgressReporter:
    """A rich progress bar carrying the latest figures on a terminal; plain one-line summaries
    otherwise (under `ray job submit`, CI, or a pipe)."""

    def __init__(self, *, total: int, done: int, interactive: bool | None = None) -> None:
        import sys

        self.interactive = sys.stdout.isatty() if interactive is None else interactive
        self.total = total
        self.bar = None
        if self.interactive:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
            )

            self.bar = Progress(TextColumn("[bold]training"), BarColumn(), MofNCompleteColumn(),
                                TimeRemainingColumn(), TextColumn("{task.fields[figures]}"))
            self.task = self.bar.add_task("training", total=total, completed=done, figures="")
            self.bar.start()

    def update(self, m: dict[str, Any]) -> None:
        line = progress_line(m, self.total)
        if self.bar is None:
            print(line, flush=True)
            return
        self.bar.console.print(line, highlight=False)
        self.bar.update(self.task, completed=m["step"] + 1,
                        figures=f"H {m['horizon']} success {m['success_rate']:.2f}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
