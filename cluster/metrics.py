"""Run-directory metrics: metrics.jsonl (one JSON line per step) and TensorBoard scalars."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


class MetricsLogger:
    """Appends one JSON line per step and mirrors numeric values to TensorBoard."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / "metrics.jsonl"
        self._file = self.path.open("a")
        try:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(run_dir / "tensorboard"))
        except ImportError:  # tensorboard is a dependency; this only guards odd installs
            self._tb = None

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        self._file.write(json.dumps({"step": step, **metrics}) + "\n")
        self._file.flush()
        if self._tb is not None:
            for k, v in metrics.items():
                if isinstance(v, (int, float)) and math.isfinite(v):
                    self._tb.add_scalar(k, v, step)

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()


def progress_line(m: dict[str, Any], iterations: int) -> str:
    """The one line printed per iteration."""
    s = m["seconds"]
    return (f"step {m['step'] + 1:>3}/{iterations} | H {m['horizon']} | v{m['policy_version']} | "
            f"reward {m['reward_mean']:.3f} | success {m['success_rate']:.3f} | "
            f"turns {m['turns_mean']:.2f} | invalid {m['invalid_action_rate']:.3f} | "
            f"{m['tokens_per_s']:.0f} tok/s | {m['env_steps_per_s']:.0f} env-steps/s | "
            f"gen {s['generate']:.2f}s env {s['env']:.2f}s transport {s['transport']:.2f}s "
            f"learn {s['learn']:.2f}s sync {s['weight_sync']:.2f}s | total {s['iteration']:.2f}s")
