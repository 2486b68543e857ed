"""Learner step time: the DeepSpeed ZeRO-2 `LearnerGroup` against a plain torch loop doing the
same math on the same batch, for two model sizes, as ratios in one run.

    .venv/bin/python bench/learner_throughput.py [--sizes tiny 256x4] [--warmup 2] [--steps 5]
    .venv/bin/python bench/learner_throughput.py layouts --out F
        (row layouts: bench/learner_layouts.py)

Each learner gets the same synthetic batch: `--trajectories` multi-turn episodes of about
`--tokens` tokens (a masked prompt, then model spans and masked env spans in turn), in GRPO groups
of `--group-size` with mixed rewards so no group is skipped, behaviour logprobs taken from the
starting weights (so the first minibatch is on-policy). One "update" is `LearnerGroup.train` as the
driver calls it: advantages, padding, `minibatches` AdamW steps per rank. Rows:

- torch: one process, the baseline with 1 intra-op thread (`--torch-threads 1 2` adds a row). It
  mirrors a 2-rank update exactly: per minibatch it runs each rank's rows in turn, backpropagates
  loss / 2 (ZeRO's gradient average), clips and steps AdamW on the worker's warm-up schedule. Same
  tokens, FLOPs and optimizer steps, so its losses track the ZeRO-2 2-rank row's to ~1e-4.
- ZeRO-2, 2 ranks: two Ray actors with 1 thread each, meeting over gloo on 127.0.0.1.
- ZeRO-2, 1 rank: one actor with 1 thread: DeepSpeed's engine and Ray's round trip without data
  parallelism (it pools 8 rows per token-mean instead of 2 x 4, so its losses differ).

How to read "vs torch" (mean update time / the 1-thread torch mean): the 1-thread rows do the
whole update on one core, so the 1-rank ratio minus 1 is DeepSpeed's engine (grad bucketing, the
partitioned optimizer step) plus Ray's round trip. The 2 ranks each do half the rows on their own
core: 0.5 would be a perfect split, and what lies above it is the gloo allreduce (on CPU about
the gradient bytes copied through loopback TCP, per optimizer step), the wait for the slower
rank, and the fact that the 2 cores are shared with Ray, the driver and, here, other people's
processes (the sd column shows how much). Small models make it worst: compute per step is tiny
next to the fixed costs, which is why the two sizes differ. A second intra-op thread (the
`1 x 2` torch row, `--torch-threads 1 2`) is off by default: its barriers stall whenever other
processes hold a core (measured here: 7-8x slower than 1 thread on the tiny model, and on the
3.4M model 0.6x in a quiet spell but 10x under load), which would swamp the comparison. On GPUs
each rank has its own device and NCCL overlaps the allreduce with backward, so the 2-rank ratio
tends towards 1/world_size plus a communication term; ZeRO-2's real point there is memory
(optimizer state and gradients split across ranks), which this bench does not measure.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from horizonrl.cluster.ops.provenance import command_line
from horizonrl.learner import algorithms as alg
from horizonrl.learner.batch import group_index, pad_batch, split_rows, trim, valid_mask
from horizonrl.learner.config import LearnerConfig
from horizonrl.protos.precision import OLD_DTYPE_NAMES, bf16_native
from horizonrl.protos.trajectory import Trajectory

if not __package__:  # run as `python bench/NAME.py`: the checkout on the path, not bench/
    sys.path[0] = str(Path(__file__).resolve().parents[1])

ROOT = Path(__file__).resolve().parents[1]

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def default_model_path() -> Path:
    """The tiny model of the embedded default config (built once by `horizonrl train`)."""
    from horizonrl.cluster.config import load_config
    from horizonrl.cluster.model.load import tiny_model_dir

    cfg = load_config(ROOT / "configs/babyai-local.yaml", [])
    return ROOT / tiny_model_dir(cfg.model, cfg.env)


def random_model(base: Path, out: Path, *, hidden: int, layers: int, seed: int) -> Path:
    """A random-init Qwen2 with `base`'s vocabulary and tokenizer, `hidden` wide, `layers` deep."""
    from transformers import AutoConfig, Qwen2Config, Qwen2ForCausalLM

    ref = AutoConfig.from_pretrained(base)
    heads = max(4, hidden // 64)  # 64-wide heads, as in real Qwen2 models
    config = Qwen2Config(
        vocab_size=ref.vocab_size, hidden_size=hidden, intermediate_size=3 * hidden,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads // 2,
        max_position_embeddings=4096, tie_word_embeddings=True, eos_token_id=ref.eos_token_id,
        pad_token_id=ref.pad_token_id, bos_token_id=None, torch_dtype="float32")
    torch.manual_seed(seed)
    Qwen2ForCausalLM(config).save_pretrained(out)
    for name in TOKENIZER_FILES:
        if (base / name).exists():
            shutil.copy(base / name, out / name)
    return out


def synthetic_trajectories(*, n: int, tokens: int, group_size: int, vocab: int,
                           seed: int) -> list[Trajectory]:
    """`n` episodes of ~`tokens` random ids: prompt, then model/env spans; mixed group rewards.

    Span lengths follow what an agent sees: a long first prompt (system prompt + observation),
    short model turns ("Thought: ... Action: ..."), longer observations. Logprobs are 0 here;
    `with_behaviour_logprobs` fills them in.
    """
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        total = int(tokens * rng.uniform(0.8, 1.2))
        prompt = int(rng.integers(60, 100))
        mask: list[int] = []
        while prompt + len(mask) < total:
            mask += [1] * int(rng.integers(8, 25))
            if prompt + len(mask) < total:
                mask += [0] * int(rng.integers(20, 60))
        if mask[-1] == 0:
            mask += [1] * int(rng.integers(8, 25))  # an episode ends on the model's turn
        turns = sum(1 for a, b in zip([0, *mask], mask) if b and not a)
        g, k = divmod(i, group_size)
        # One success at a rotating place, the last member fails, the rest succeed 30% of the
        # time: every group has reward variance, so GRPO skips none.
        reward = float(k == g % (group_size - 1) or (k < group_size - 1 and rng.random() < 0.3))
        prompt_ids, response_ids = (rng.integers(0, vocab, m).tolist() for m in (prompt, len(mask)))
        out.append(Trajectory(
            trajectory_id=f"t{i}", group_id=f"g{g}", task_id=str(g), env_name="synthetic",
            policy_version=0, horizon=turns, prompt_ids=tuple(prompt_ids),
            response_ids=tuple(response_ids), response_mask=tuple(mask),
            response_logprobs=(0.0,) * len(mask), rewards=(0.0,) * (turns - 1) + (reward,),
            reward=reward, num_turns=turns, terminated=True, truncated=False))
    return out


@torch.no_grad()
def with_behaviour_logprobs(trajs: list[Trajectory], model_path: Path, *,
                            pad_id: int) -> list[Trajectory]:
    """The same episodes with `response_logprobs` under the starting weights (as vLLM reports)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    batch = pad_batch(trajs, [0.0] * len(trajs), pad_id=pad_id)
    ids = torch.from_numpy(batch["input_ids"])
    logp = alg.token_logprobs(model(input_ids=ids).logits, ids).numpy()
    out = []
    for row, t in enumerate(trajs):
        p, n = len(t.prompt_ids), len(t.response_ids)
        lp = tuple(float(x) if m else 0.0 for x, m in zip(logp[row, p:p + n], t.response_mask))
        out.append(dataclasses.replace(t, response_logprobs=lp))
    return out


class TorchLearner:
    """The plain single-process loop: LearnerWorker's math on `world_size` ranks' rows in turn."""

    def __init__(self, cfg: LearnerConfig, *, model_path: Path, pad_id: int,
                 world_size: int) -> None:
        from transformers import AutoModelForCausalLM

        self.cfg, self.pad_id, self.world_size = cfg, pad_id, world_size
        load = AutoModelForCausalLM.from_pretrained
        self.model = load(model_path, dtype=torch.float32).train()
        self.ref = load(model_path, dtype=torch.float32).eval() if cfg.kl_coef > 0 else None
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        warmup = cfg.warmup_steps  # the worker's schedule: update k uses lr * (k+1)/warmup
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lambda k: min(1.0, (k + 1) / warmup) if warmup else 1.0)

    def train(self, trajs: list[Trajectory]) -> dict[str, float]:
        t0 = time.perf_counter()
        rewards = torch.tensor([t.reward for t in trajs], dtype=torch.float32)
        adv = alg.grpo_advantages(rewards, torch.from_numpy(group_index(trajs)),
                                  torch.from_numpy(valid_mask(trajs)),
                                  norm_by_std=self.cfg.norm_adv_by_std).numpy()
        batch = pad_batch(trajs, adv, pad_id=self.pad_id)
        ranks = [split_rows(s, self.cfg.minibatches) for s in split_rows(batch, self.world_size)]
        losses = []
        for _ in range(self.cfg.epochs):
            for k in range(self.cfg.minibatches):
                self.opt.zero_grad(set_to_none=True)
                for shard in ranks:
                    loss = self._loss(trim(shard[k]))
                    (loss / self.world_size).backward()  # ZeRO averages gradients over ranks
                    losses.append(loss.item())
                torch.nn.utils.clip_grad_norm_(self.params, self.cfg.grad_clip)
                self.opt.step()
                self.sched.step()
        return {"loss": float(np.mean(losses)), "learn_seconds": time.perf_counter() - t0}

    def _loss(self, mb: dict[str, np.ndarray]) -> torch.Tensor:
        t = {k: torch.from_numpy(v) for k, v in mb.items()}
        logp = alg.token_logprobs(self.model(input_ids=t["input_ids"]).logits, t["input_ids"])
        loss, _, _ = alg.clipped_policy_loss(logp, t["old_logprobs"], t["advantages"],
                                             t["loss_mask"], clip=self.cfg.clip_ratio)
        if self.ref is not None:
            with torch.no_grad():
                ref = alg.token_logprobs(self.ref(input_ids=t["input_ids"]).logits,
                                         t["input_ids"])
            kl = alg.kl_penalty(logp, ref, self.cfg.kl_estimator)
            loss = loss + self.cfg.kl_coef * alg.masked_mean(kl, t["loss_mask"])
        return loss


@dataclasses.dataclass(frozen=True, slots=True)
class Timing:
    """One learner's timed updates (warm-up excluded) and its losses, first and last update."""

    model: str
    params: int
    learner: str
    layout: str  # processes x threads each
    seconds: tuple[float, ...]
    rank_seconds: tuple[float, ...]  # the ranks' own `learn_seconds` (no Ray round trip)
    loss_first: float
    loss_last: float

    @property
    def mean(self) -> float:
        return statistics.fmean(self.seconds)


def measure(update: Callable[[], dict[str, float]], *, warmup: int, steps: int,
            max_s: float, **labels: object) -> Timing:
    """`warmup` untimed updates, then up to `steps` timed ones (stopping once `max_s` is spent)."""
    metrics = [update() for _ in range(warmup)]
    seconds, start = [], time.perf_counter()
    for _ in range(steps):
        t0 = time.perf_counter()
        metrics.append(update())
        seconds.append(time.perf_counter() - t0)
        if time.perf_counter() - start > max_s:
            break
    timed = metrics[warmup:]
    print(f"[bench] {labels['model']} {labels['learner']} ({labels['layout']}): "
          f"{statistics.fmean(seconds):.3f} s/update over {len(seconds)} updates", flush=True)
    return Timing(seconds=tuple(seconds), rank_seconds=tuple(m["learn_seconds"] for m in timed),
                  loss_first=metrics[0]["loss"], loss_last=metrics[-1]["loss"], **labels)


def zero2(cfg: LearnerConfig, trajs: list[Trajectory], *, model_path: Path, pad_id: int,
          **kw: object) -> Timing:
    """Time `LearnerGroup.train`; fail loudly if the batch would not train every row."""
    from horizonrl.learner.group import LearnerGroup

    group = LearnerGroup(cfg, model_path=str(model_path), pad_id=pad_id, seed=0)
    try:
        if group.dtype not in ("float32", "bfloat16"):  # a name the engine would read as fp32
            raise RuntimeError(f"learner.dtype {cfg.dtype!r} is not a precision the learner has")

        def update() -> dict[str, float]:
            m = group.train(trajs)
            if m["skipped_update"] or m["rows_trained"] != len(trajs):
                raise RuntimeError(f"the synthetic batch was not trained in full: {m}")
            return m

        return measure(update, **kw)
    finally:
        group.shutdown()


def bench_size(name: str, model_path: Path, args: argparse.Namespace) -> list[Timing]:
    from transformers import AutoConfig

    from horizonrl.protos.chat import load_tokenizer

    pad_id = load_tokenizer(model_path).pad_token_id
    vocab = AutoConfig.from_pretrained(model_path).vocab_size
    trajs = synthetic_trajectories(n=args.trajectories, tokens=args.tokens,
                                   group_size=args.group_size, vocab=vocab, seed=args.seed)
    trajs = with_behaviour_logprobs(trajs, model_path, pad_id=pad_id)
    base = LearnerConfig(world_size=2, zero_stage=2, kl_coef=args.kl_coef, torch_threads=1)
    kw = {"warmup": args.warmup, "steps": args.steps, "max_s": args.max_seconds, "model": name}
    rows, threads = [], torch.get_num_threads()
    for n in args.torch_threads:
        torch.set_num_threads(n)
        try:
            plain = TorchLearner(base, model_path=model_path, pad_id=pad_id, world_size=2)
            kw["params"] = sum(p.numel() for p in plain.params)
            rows.append(measure(lambda plain=plain: plain.train(trajs), learner="torch",
                                layout=f"1 x {n}", **kw))
        finally:
            torch.set_num_threads(threads)
    rows.append(zero2(base, trajs, model_path=model_path, pad_id=pad_id, learner="ZeRO-2",
                      layout="2 x 1", **kw))
    for dtype in args.dtypes:  # the same 2-rank learner in another precision (learner.dtype)
        if dtype != "fp32":
            # The config's own name (model_copy does not validate, so "bf16" would pass
            # through unread and the row would run fp32).
            name = OLD_DTYPE_NAMES.get(dtype, dtype)
            rows.append(zero2(base.model_copy(update={"dtype": name}), trajs,
                              model_path=model_path, pad_id=pad_id, learner=f"ZeRO-2 {dtype}",
                              layout="2 x 1", **kw))
    if args.one_rank:
        one = base.model_copy(update={"world_size": 1})
        rows.append(zero2(one, trajs, model_path=model_path, pad_id=pad_id, learner="ZeRO-2",
                          layout="1 x 1", **kw))
    return rows


def table(rows: list[Timing]) -> str:
    """Markdown; "vs torch" divides by the same model's first torch row (1 thread by default)."""
    lines = ["| model | params | learner | procs x threads | s/update: mean ± sd (n) | median | "
             "rank-side s | vs torch | loss, 1st -> last update |", "|---" * 9 + "|"]
    for r in rows:
        base = next(b for b in rows if b.model == r.model and b.learner == "torch")
        sd = statistics.stdev(r.seconds) if len(r.seconds) > 1 else math.nan
        lines.append(
            f"| {r.model} | {r.params / 1e6:.2f}M | {r.learner} | {r.layout} | {r.mean:.3f} ± "
            f"{sd:.3f} ({len(r.seconds)}) | {statistics.median(r.seconds):.3f} | "
            f"{statistics.fmean(r.rank_seconds):.3f} | {r.mean / base.mean:.2f}x | "
            f"{r.loss_first:.4f} -> {r.loss_last:.4f} |")
    return "\n".join(lines)


def cpu_description() -> dict:
    """What decides bf16's speed on this CPU: torch's kernel level and whether the CPU computes
    bf16 natively (protos/precision.py's rule for `auto`)."""
    import torch

    return {"torch_capability": torch.backends.cpu.get_cpu_capability(),
            "native_bf16": bf16_native("cpu")}


def main() -> None:
    if sys.argv[1:2] == ["layouts"]:  # learner.layout throughput: bench/learner_layouts.py
        from bench.learner_layouts import main as layouts

        return layouts(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", nargs="+", default=["tiny", "256x4"],
                    help="'tiny' (the cached tiny model) or HIDDENxLAYERS (random-init Qwen2)")
    ap.add_argument("--model", type=Path, default=None, help="tiny model folder (default: cache)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed updates per learner")
    ap.add_argument("--steps", type=int, default=5, help="timed updates per learner (at most)")
    ap.add_argument("--max-seconds", type=float, default=30.0, help="cap on timed s per learner")
    ap.add_argument("--trajectories", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=300, help="mean tokens per trajectory")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--kl-coef", type=float, default=0.0, help="> 0 adds the reference forward")
    ap.add_argument("--torch-threads", type=int, nargs="+", default=[1],
                    help="one torch row per value; the first is the baseline")
    ap.add_argument("--dtypes", nargs="+", default=["fp32"], choices=["fp32", "bf16"],
                    help="learner.dtype rows of the 2-rank learner (fp32 is always there)")
    ap.add_argument("--no-one-rank", dest="one_rank", action="store_false",
                    help="skip the ZeRO-2 1-rank row")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="also write the rows as JSON here")
    args = ap.parse_args()

    from horizonrl.cluster.config import RayConfig
    from horizonrl.cluster.ops.runtime import ray_session

    tiny = args.model or default_model_path()
    if not (tiny / "config.json").exists():
        raise SystemExit(f"no model at {tiny}: run `horizonrl make-tiny-model` or pass --model")
    rows: list[Timing] = []
    load_before = os.getloadavg()[0]  # the 2 cores are shared: say how busy they were
    with tempfile.TemporaryDirectory() as tmp, ray_session(RayConfig(num_cpus=2)):
        for size in args.sizes:
            path = tiny
            if size != "tiny":
                hidden, layers = (int(x) for x in size.split("x"))
                path = random_model(tiny, Path(tmp) / size, hidden=hidden, layers=layers,
                                    seed=args.seed)
            rows += bench_size(size, path, args)
    print(f"\n{args.trajectories} trajectories x ~{args.tokens} tokens, groups of "
          f"{args.group_size}; {args.warmup} warm-up updates excluded; 2 AdamW steps per "
          f"update; kl_coef {args.kl_coef}; 1-min load average {load_before:.1f} at start, "
          f"{os.getloadavg()[0]:.1f} at end on {os.cpu_count()} CPUs\n")
    print(table(rows))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "command": command_line(),
            "load_average": [load_before, os.getloadavg()[0]],
            "cpu": cpu_description(),
            "rows": [dataclasses.asdict(r) for r in rows], "table": table(rows)}, indent=1))


if __name__ == "__main__":
    main()
