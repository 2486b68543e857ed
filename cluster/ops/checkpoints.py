"""Checkpoint layout and resume: where a run left off, found and read back.

runs/<name>__<seed>__<time>/checkpoints/step_NNNNNN/ holds an HF `save_pretrained` model with
its tokenizer and `trainer_state.json` (step, policy_version, curriculum state, base model). A
folder is renamed into place only when complete, so a `.tmp` folder is never resumed from.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from horizonrl.learner.config import LearnerConfig

STATE_FILE = "trainer_state.json"
LEARNER_DIR = "learner"  # DeepSpeed model/optimizer/scheduler partitions + per-rank RNG
PROBE_FILE = "logprob_probe.json"
BUFFER_FILE = "phase_buffer.jsonl"  # async: trajectories collected, not yet trained
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
    # The rollout phase's state (async: counter, rollouts in flight) and its untrained buffer.
    phase: tuple[dict[str, Any], list[Any]] | None = None


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
    from horizonrl.protos.codec import from_json_line

    state = json.loads((checkpoint / STATE_FILE).read_text())
    phase = None
    if state.get("phase") is not None:
        lines = (checkpoint / BUFFER_FILE).read_text().splitlines()
        phase = (state["phase"], [from_json_line(x) for x in lines if x.strip()])
    return ResumeState(run_dir=checkpoint.parent.parent, checkpoint=checkpoint,
                       step=int(state["step"]), policy_version=int(state["policy_version"]),
                       curriculum=state["curriculum"], base_model_path=state["base_model_path"],
                       learner=state.get("learner"), phase=phase)


def write_state(folder: Path, state: dict[str, Any]) -> None:
    (folder / STATE_FILE).write_text(json.dumps(state, indent=2))


def truncate_metrics(run_dir: Path, step: int) -> None:
    """Drop metric lines of steps at or after `step`: they are about to be run again."""
    path = run_dir / "metrics.jsonl"
    if path.exists():
        keep = [line for line in path.read_text().splitlines()
                if line.strip() and json.loads(line)["step"] < step]
        path.write_text("".join(f"{line}\n" for line in keep))


def write_probe(folder: Path, ids: list[int], logprobs: list[float],
                dtype: str = "float32") -> None:
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


def learner_identity(cfg: LearnerConfig) -> dict[str, Any]:
    """What a learner's saved optimizer state is only valid for."""
    return {"world_size": cfg.world_size, "zero_stage": cfg.zero_stage,
            "algorithm": cfg.algorithm}


def write_checkpoint(run_dir: Path, learner: Any, *, base_model_path: str,
                     state: dict[str, Any], keep: int,
                     buffer: list[Any] | None = None) -> Path:
    """HF model + tokenizer, the learner's optimizer/scheduler/RNG state, `state` (the driver
    and curriculum state) and a logprob probe, under checkpoints/step_N for N = state["step"]
    (renamed into place only when complete); then only the newest `keep` are kept. N counts the
    updates the weights hold: a resume goes on with step N. `buffer`: the async phase's
    untrained trajectories, one JSON line each."""
    import shutil

    from horizonrl.protos.codec import to_json_line

    path = run_dir / "checkpoints" / f"step_{state['step']:06d}"
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    learner.save_hf(tmp)
    learner.save_checkpoint(tmp / LEARNER_DIR)
    for f in Path(base_model_path).glob("tokenizer*"):
        shutil.copy(f, tmp / f.name)
    write_probe(tmp, PROBE_IDS, learner.score([PROBE_IDS])[0], learner.dtype)
    if buffer is not None:
        (tmp / BUFFER_FILE).write_text("".join(to_json_line(t) + "\n" for t in buffer))
    write_state(tmp, state)
    if path.exists():  # the same step saved again (a resumed run that had finished)
        shutil.rmtree(path)
    tmp.rename(path)  # a checkpoint folder without .tmp is complete
    prune_checkpoints(run_dir, keep=keep)
    return path


def restore_learner(learner: Any, resume: ResumeState, want: dict[str, Any]) -> None:
    """Optimizer, scheduler and RNG from the checkpoint; a checkpoint from another world
    size, ZeRO stage or algorithm (`want`, the learner's identity), or one without learner
    state, resumes weights only."""
    state_dir = resume.checkpoint / LEARNER_DIR
    if resume.learner != want or not state_dir.is_dir():
        print(f"[horizonrl] WARNING: {resume.checkpoint} has learner state {resume.learner}, "
              f"this run is {want}: resuming the weights with a fresh optimizer", flush=True)
        return
    learner.load_checkpoint(state_dir)
