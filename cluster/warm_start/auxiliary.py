"""`horizonrl sft | rs | dpo`: auxiliary training on the DeepSpeed learner group.

- sft: every model token of the valid episodes in a trajectory log, or a JSONL of chat
  conversations (`{"messages": [...]}`), masked to the assistant's tokens;
- rs (rejection-sampling fine-tuning): SFT on the successful episodes only, one per distinct
  response per group;
- dpo: chosen/rejected pairs within each group (successful vs failed, else higher vs lower
  reward) against the frozen starting model.

The data a run produces: `horizonrl train save_trajectories=true` writes
<run>/trajectories/step_N.jsonl. Results go to OUT: metrics.jsonl, config.yaml and the trained
model (save_pretrained, with tokenizer) under OUT/model.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from horizonrl.cluster.config import RunConfig, dump_config
from horizonrl.cluster.model.load import ensure_model
from horizonrl.protos.codec import from_json_line
from horizonrl.protos.trajectory import Trajectory


def read_trajectories(source: str | Path) -> list[Trajectory]:
    """Every trajectory in a `.jsonl` file or in the `*.jsonl` files of a folder (a run folder's
    `trajectories/` is found too); malformed lines name the file and line."""
    path = Path(source)
    if path.is_dir() and (path / "trajectories").is_dir():
        path = path / "trajectories"
    files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
    if not files or not all(f.is_file() for f in files):
        raise FileNotFoundError(f"no trajectory .jsonl files at {source}")
    out = []
    for f in files:
        for n, line in enumerate(f.read_text().splitlines(), 1):
            if line.strip():
                try:
                    out.append(from_json_line(line))
                except ValueError as exc:
                    raise ValueError(f"{f}:{n}: {exc}") from None
    return out


def build_data(kind: str, source: str, cfg: RunConfig,
               model_path: Callable[[], str]) -> list[Any]:
    """Examples (sft, rs) or pairs (dpo) from `source`. `model_path` is called only for chat
    conversations, which need the model's tokenizer; trajectories carry their token ids."""
    from horizonrl.learner import auxiliary as aux

    if kind == "sft" and Path(source).is_file() and _is_conversations(Path(source)):
        from horizonrl.envpool.registry import env_spec
        from horizonrl.protos.chat import ChatFormat, load_tokenizer

        chat = ChatFormat(load_tokenizer(model_path()))
        data = aux.sft_examples_from_jsonl(
            source, chat, max_tokens=cfg.generator.max_context_tokens,
            default_system=env_spec(cfg.env.name).system_prompt)
        print(f"[horizonrl] {len(data.examples)} conversations ({data.truncated} truncated, "
              f"{data.skipped} skipped for length)", flush=True)
        return data.examples
    trajs = read_trajectories(source)
    if kind == "sft":
        return aux.sft_examples_from_trajectories(trajs, only_successful=False)
    if kind == "rs":
        return aux.rejection_sampling_examples(
            trajs, mask_invalid_turns=cfg.learner.mask_invalid_turns)
    if kind == "dpo":
        return aux.dpo_pairs_from_groups(trajs)
    raise ValueError(f"unknown auxiliary training {kind!r}; use sft, rs or dpo")


def _is_conversations(path: Path) -> bool:
    with path.open() as f:
        first = next((line for line in f if line.strip()), "{}")
    try:
        return "messages" in json.loads(first)
    except json.JSONDecodeError:
        return False


def run_auxiliary(kind: str, cfg: RunConfig, *, data: str, out: str | Path, steps: int,
                  batch_size: int, model: str | None = None,
                  max_examples: int | None = None) -> list[float]:
    """Train `steps` steps of `kind` on minibatches drawn (seeded) from `data` (its first
    `max_examples` items, if set); save the model. Returns the loss of every step."""
    from horizonrl.cluster.ops.runtime import ray_session
    from horizonrl.learner.group import LearnerGroup

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(dump_config(cfg))

    def resolve() -> str:  # after the data is read: bad data is an error before any model build
        return model or str(ensure_model(cfg.model, env=cfg.env))

    items = build_data(kind, data, cfg, resolve)[:max_examples]
    model_path = resolve()
    need = max(batch_size, cfg.learner.world_size)
    if len(items) < need:
        raise ValueError(f"{kind}: {len(items)} examples in {data}, need at least {need}")
    print(f"[horizonrl] {kind}: {len(items)} {'pairs' if kind == 'dpo' else 'examples'}, "
          f"{steps} steps of {batch_size}", flush=True)
    rng = random.Random(cfg.seed)
    learner_cfg = cfg.learner
    if kind == "dpo" and learner_cfg.kl_coef == 0:  # DPO needs the frozen reference loaded
        learner_cfg = learner_cfg.model_copy(update={"kl_coef": 1e-3})
    losses = []
    with ray_session(cfg.ray), (out / "metrics.jsonl").open("w") as log:
        group = LearnerGroup(learner_cfg, model_path=model_path, ref_model_path=model_path,
                             pad_id=_pad_id(model_path), seed=cfg.seed)
        try:
            t0 = time.perf_counter()
            for step in range(steps):
                batch = rng.sample(items, batch_size)
                stats = group.train_dpo(batch) if kind == "dpo" else group.train_sft(batch)
                loss = stats["dpo_loss" if kind == "dpo" else "sft_loss"]
                losses.append(loss)
                log.write(json.dumps({"step": step, "loss": loss, **stats}) + "\n")
                print(f"[horizonrl] {kind} step {step + 1}/{steps} loss {loss:.4f} "
                      f"({time.perf_counter() - t0:.0f}s)", flush=True)
            group.save_hf(out / "model")
        finally:
            group.shutdown()
    for f in Path(model_path).glob("tokenizer*"):
        shutil.copy(f, out / "model" / f.name)
    return losses


def _pad_id(model_path: str) -> int:
    from horizonrl.protos.chat import load_tokenizer

    return load_tokenizer(model_path).pad_token_id
