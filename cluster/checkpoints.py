"""Checkpoint layout and resume: where a run left off, found and read back.

runs/<name>__<seed>__<time>/checkpoints/step_NNNNNN/ holds an HF `save_pretrained` model with
its tokenizer and `trainer_state.json` (step, policy_version, curriculum state, base model). A
folder is renamed into place only when complete, so a `.tmp` folder is never resumed from.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STATE_FILE = "trainer_state.json"
LEARNER_DIR = "learner"  # DeepSpeed model/optimizer/scheduler partitions + per-rank RNG
PROBE_FILE = "logprob_probe.json"
# A fixed token sequence whose logprobs the learner records at every checkpoint, so an exported
# model can be checked against the learner that wrote it (any ids below the tiny vocab work).
PROBE_IDS = [3, 17, 42, 101, 7, 256, 12, 99, 5, 64, 300, 8, 150, 21, 77, 9]


@dataclass(frozen=True, slots=True)
class ResumeState:
    """Everything the driver needs to continue a run exactly where a checkpoint left it."""

    run_dir: Path
    checkpoint: Path
    step: int
    policy_version: int
    curriculum: dict[str, Any]
    base_model_path: str
    learner: dict[str, Any] | None = None  # world_size, zero_stage, algorithm of the saver


def latest_checkpoint(run_dir: Path) -> Path | None:
    ckpts = sorted(p for p in (run_dir / "checkpoints").glob("step_*")
                   if p.is_dir() and not p.name.endswith(".tmp") and (p / STATE_FILE).exists())
    return ckpts[-1] if ckpts else None


def find_checkpoint(spec: str, *, run_root: str, name: str, seed: int) -> Path | None:
    """`auto`: the newest complete checkpoint of the newest run of this name and seed (None
    if there is none: the run starts fresh). Otherwise a checkpoint folder or a run folder."""
    if spec == "auto":
        runs = sorted(Path(run_root).glob(f"{name}__{seed}__*"), reverse=True)
        for run in runs:
            found = latest_checkpoint(run)
            if found is not None:
                return found
        return None
    path = Path(spec)
    if (path / STATE_FILE).exists():
        return path
    found = latest_checkpoint(path) if path.is_dir() else None
    if found is None:
        raise FileNotFoundError(f"--resume {spec}: no complete checkpoint there (looked for "
                                f"{STATE_FILE} in it or in its checkpoints/step_*)")
    return found


def load_resume(checkpoint: Path) -> ResumeState:
    state = json.loads((checkpoint / STATE_FILE).read_text())
    return ResumeState(run_dir=checkpoint.parent.parent, checkpoint=checkpoint,
                       step=int(state["step"]), policy_version=int(state["policy_version"]),
                       curriculum=state["curriculum"], base_model_path=state["base_model_path"],
                       learner=state.get("learner"))


def write_state(folder: Path, state: dict[str, Any]) -> None:
    (folder / STATE_FILE).write_text(json.dumps(state, indent=2))


def truncate_metrics(run_dir: Path, step: int) -> None:
    """Drop metric lines of steps at or after `step`: they are about to be run again."""
    path = run_dir / "metrics.jsonl"
    if path.exists():
        keep = [line for line in path.read_text().splitlines()
                if line.strip() and json.loads(line)["step"] < step]
        path.write_text("".join(f"{line}\n" for line in keep))


def write_probe(folder: Path, ids: list[int], logprobs: list[float], dtype: str = "fp32") -> None:
    """The probe's logprobs and the precision the learner computed them in (`learner.dtype`
    resolved), so a check recomputes them in the same one."""
    (folder / PROBE_FILE).write_text(json.dumps({"input_ids": ids, "logprobs": logprobs,
                                                 "dtype": dtype}))


def prune_checkpoints(run_dir: Path, *, keep: int) -> list[Path]:
    """Delete all but the newest `keep` complete checkpoints; returns what was deleted."""
    import shutil

    ckpts = sorted(p for p in (run_dir / "checkpoints").glob("step_*")
                   if p.is_dir() and not p.name.endswith(".tmp") and (p / STATE_FILE).exists())
    gone = ckpts[:-keep] if keep > 0 else []
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return gone
