"""The warm start of a training run (`init:`): demonstrations -> behaviour cloning -> evaluation,
then RL starts from the cloned model. AgentGym's recipe (AgentTraj/AgentEvol, then AgentGym-RL)
in one `horizonrl train`.

Everything lands in <run>/init/: demos/ (when collected), model/ (the cloned save_pretrained
folder; `warm_start.json` beside it marks it complete), eval/ (base vs BC report). Each phase is
skipped when its output is complete, so `--resume auto` continues a run interrupted anywhere in
the warm start, and a resumed RL phase never redoes it.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import time
from pathlib import Path
from typing import Any

from horizonrl.cluster.config import RunConfig

INIT_DIR = "init"
DONE_FILE = "warm_start.json"


def warm_start_model(run_dir: Path) -> Path | None:
    """The cloned model of a finished warm start in `run_dir`, or None. Always the run's own
    init/model, not the absolute path recorded when it was written: a run folder that was
    copied (an RL variant from another run's clone) or moved must not reach back into its
    origin, which may be gone."""
    done = run_dir / INIT_DIR / DONE_FILE
    return (run_dir / INIT_DIR / "model").resolve() if done.exists() else None


def run_warm_start(cfg: RunConfig, *, run_dir: Path, base_model: str) -> Path:
    """Run (or finish) the warm start inside the caller's Ray session; returns the model path."""
    done = warm_start_model(run_dir)
    if done is not None:
        print(f"[warm-start] already done: {done}", flush=True)
        return done
    init, root = cfg.init, run_dir / INIT_DIR
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    demos = _demos(cfg, root, base_model)
    model_dir = root / "model"
    if (model_dir / "config.json").exists():  # renamed into place only when complete
        print(f"[warm-start] sft: reusing {model_dir}", flush=True)
    else:
        _clone(cfg, _examples(cfg, demos), base_model=base_model, out=model_dir)
    losses = [json.loads(x)["sft_loss"]
              for x in (root / "sft_metrics.jsonl").read_text().splitlines()]
    record: dict[str, Any] = {
        "model": str(model_dir.resolve()), "demos": str(demos), "sft_steps": len(losses),
        "sft_loss_first": losses[0], "sft_loss_last": losses[-1]}
    if init.eval_tasks:
        record["eval"] = _evaluate(cfg, root / "eval", base=base_model, cloned=str(model_dir))
    record["seconds"] = round(time.perf_counter() - t0, 1)
    (root / DONE_FILE).write_text(json.dumps(record, indent=2))
    print(f"[warm-start] done in {record['seconds']:.0f}s: {model_dir}", flush=True)
    return model_dir


class DemoReplay:
    """Behaviour-cloning replay during RL (`init.replay_batch`): after every RL update the
    learner takes one SFT step on a few demonstrations, so that updates driven by the tasks the
    policy already solves do not wash out what only the demonstrations taught (on TextCraft,
    RL alone lost the clone's memorised depth-4 recipes). Draws are seeded by run seed and step,
    so a resumed run replays what the uninterrupted one would have."""

    def __init__(self, examples: list[Any], batch: int, seed: int) -> None:
        if not examples:
            raise ValueError("init.replay_batch > 0 but there are no demonstrations to replay")
        self.examples, self.batch, self.seed = examples, min(batch, len(examples)), seed

    @classmethod
    def for_run(cls, cfg: RunConfig, run_dir: Path) -> DemoReplay:
        """The demonstrations of `init.demos`, else those this run's warm start collected."""
        demos = Path(cfg.init.demos) if cfg.init.demos else run_dir / INIT_DIR / "demos"
        return cls(_examples(cfg, demos, "replay"), cfg.init.replay_batch, cfg.seed)

    def draw(self, step: int) -> list[Any]:
        return random.Random(self.seed * 1_000_003 + step).sample(self.examples, self.batch)


def _demos(cfg: RunConfig, root: Path, base_model: str) -> Path:
    from horizonrl.cluster.warm_start.demos import SUMMARY_FILE, collect_demos

    if cfg.init.demos is not None:
        return Path(cfg.init.demos)
    out = root / "demos"
    if (out / SUMMARY_FILE).exists():
        print(f"[warm-start] demos: reusing {out}", flush=True)
    else:  # an interrupted collection starts over
        collect_demos(cfg, model_path=base_model, episodes=cfg.init.demo_episodes, out=out,
                      noise=cfg.init.demo_noise, thought=cfg.init.thought,
                      max_turns=cfg.init.demo_horizon)
    return out


def _examples(cfg: RunConfig, demos: Path, purpose: str = "clone") -> list[Any]:
    from horizonrl.cluster.warm_start.auxiliary import read_trajectories
    from horizonrl.learner.auxiliary import sft_examples_from_trajectories

    trajs = read_trajectories(demos)
    examples = sft_examples_from_trajectories(trajs, only_successful=cfg.init.only_successful)
    limit = cfg.generator.max_context_tokens
    examples = [e for e in examples if len(e.input_ids) <= limit]
    if len(examples) < max(cfg.learner.world_size, 1):
        raise ValueError(f"init: {len(examples)} usable demonstrations in {demos} (of "
                         f"{len(trajs)}; successful and within {limit} tokens)")
    print(f"[{'warm-start' if purpose == 'clone' else purpose}] {len(examples)} demonstrations "
          f"to {purpose} ({len(trajs)} read, "
          f"{sum(len(e.input_ids) for e in examples)} tokens)", flush=True)
    return examples


def _clone(cfg: RunConfig, examples: list[Any], *, base_model: str, out: Path) -> None:
    """SFT on the learner group: `sft_epochs` shuffled passes, warm-up then cosine."""
    from horizonrl.learner.group import LearnerGroup
    from horizonrl.protos.chat import load_tokenizer

    init = cfg.init
    per_epoch = math.ceil(len(examples) / init.sft_batch_size)
    steps = max(1, round(init.sft_epochs * per_epoch))
    learner_cfg = cfg.learner.model_copy(update={
        "lr": init.sft_lr, "warmup_steps": max(1, steps // 20), "lr_schedule": "cosine",
        "lr_decay_steps": steps, "min_lr_ratio": 0.1, "kl_coef": 0.0})
    order: list[int] = []
    rng = random.Random(cfg.seed)
    group = LearnerGroup(learner_cfg, model_path=base_model,
                         pad_id=load_tokenizer(base_model).pad_token_id, seed=cfg.seed)
    losses: list[float] = []
    t0 = time.perf_counter()
    try:
        with (out.parent / "sft_metrics.jsonl").open("w") as log:
            for step in range(steps):
                if len(order) < init.sft_batch_size:
                    more = list(range(len(examples)))
                    rng.shuffle(more)
                    order += more
                batch, order = order[:init.sft_batch_size], order[init.sft_batch_size:]
                stats = group.train_sft([examples[i] for i in batch])
                losses.append(stats["sft_loss"])
                log.write(json.dumps({"step": step, **stats}) + "\n")
                if (step + 1) % max(1, steps // 20) == 0 or step + 1 == steps:
                    print(f"[warm-start] sft step {step + 1}/{steps} (epoch "
                          f"{(step + 1) / per_epoch:.2f}) loss {stats['sft_loss']:.4f} "
                          f"({time.perf_counter() - t0:.0f}s)", flush=True)
        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        group.save_hf(tmp)
    finally:
        group.shutdown()
    for f in Path(base_model).glob("tokenizer*"):
        shutil.copy(f, tmp / f.name)
    tmp.rename(out)


def _evaluate(cfg: RunConfig, out: Path, *, base: str, cloned: str) -> dict[str, Any]:
    """Eval-split accuracy of the base and the cloned model at one turn budget."""
    h = cfg.init.eval_horizon or cfg.curriculum.horizons[-1]
    if (out / "results.json").exists():
        print(f"[warm-start] eval: reusing {out}", flush=True)
        results = json.loads((out / "results.json").read_text())
    else:
        results = _run_eval(cfg, out, h, base=base, cloned=cloned)
    summary = {label: {env: by_h[str(h)]["accuracy"] for env, by_h in per_env.items()}
               for label, per_env in results.items()}
    print(f"[warm-start] eval-split accuracy at {h} turns: {summary}", flush=True)
    return {"max_turns": h, "accuracy": summary}


def _run_eval(cfg: RunConfig, out: Path, h: int, *, base: str, cloned: str) -> dict[str, Any]:
    from horizonrl.cluster.eval.evaluate import evaluate_in_session

    return evaluate_in_session(cfg, {"base": base, "bc": cloned}, envs=cfg.envs,
                               tasks=cfg.init.eval_tasks, samples=1, max_turns=[h], out=out)
