"""Every GPU path in one script: PASS/FAIL per check, SKIP (by name) for the GPU parts on a
machine without CUDA, a JSON summary last; exit 1 on any FAIL.

    python bench/gpu_check.py [--tol 1e-4] [--bucket-mb 1] [--only NAME ...] [--json PATH]

Paths: `learner-bf16-zero2` and `learner-bf16-zero3` (2 learner ranks in bf16 against the same
ranks in fp32 on the same batch: losses within bf16 rounding; on CPU when there is no GPU),
`weight-sync` (GPU: a real LearnerGroup and a real vLLM GeneratorActor on CUDA; after each
learner update a push, then the generator's logprobs must equal the learner's), and
`training-run` (GPU: 5 iterations of `horizonrl train --config configs/babyai-gpu.yaml`).

Layout: with two or more GPUs the learner and the generator get GPUs of their own and the weight
group must use NCCL. With one GPU everything shares it; NCCL refuses two members of one
communicator on the same GPU (and DeepSpeed's own group as well, so the learner has one rank):
the sync then uses gloo through host memory, which the check reports, still covering vLLM's
CUDA reload. `weight_sync_flow` is the flow tests/integration/test_weight_broadcast.py runs on
CPU.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from horizonrl.actors.config import GeneratorConfig
from horizonrl.cluster.ops.provenance import command_line
from horizonrl.learner.config import LearnerConfig

if not __package__:  # run as `python bench/NAME.py`: the checkout on the path, not bench/
    sys.path[0] = str(Path(__file__).resolve().parents[1])

ROOT = Path(__file__).resolve().parents[1]

GENERATOR_NAME = "weight-sync-check-gen0"


@dataclass(frozen=True, slots=True)
class PushCheck:
    """One push of the flow and what the generator scored after it."""

    label: str
    strategy: str
    backend: str | None  # the broadcast group's backend; None for the object store
    max_diff: float  # max |generator - learner| logprob on the fixed sequences after the push
    moved: float  # max |generator before the push - learner after the update|: the update's size
    state_bytes: int  # the learner's full state dict, summed over its tensors
    metrics: dict[str, float]


def _sequences(vocab: int, *, n: int, seed: int) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randint(10, 24))] for _ in range(n)]


def _max_abs(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))


def weight_sync_flow(model_path: str | Path, *, learner_cfg: LearnerConfig,
                     generator_cfg: GeneratorConfig, seed: int = 0,
                     timeout_s: float = 300.0) -> list[PushCheck]:
    """Inside a Ray session: a LearnerGroup and one GeneratorActor; four (SFT update, push)
    rounds: broadcast forming its group, broadcast reusing it, broadcast after the generator's
    handle changed (as after a restart: the group is re-formed), then the object store.
    `timeout_s` bounds each push (a member that never joins fails it instead of hanging)."""
    import ray

    from horizonrl.actors.generator import GeneratorActor
    from horizonrl.envpool.config import EnvConfig
    from horizonrl.envpool.pool import EnvPool
    from horizonrl.learner.auxiliary import SFTExample
    from horizonrl.learner.group import LearnerGroup
    from horizonrl.learner.weights import make_weight_sync
    from horizonrl.protos.chat import load_tokenizer

    tok = load_tokenizer(model_path)
    learner = LearnerGroup(learner_cfg, model_path=str(model_path), pad_id=tok.pad_token_id,
                           seed=seed)
    remote = ray.remote(num_cpus=generator_cfg.num_cpus,
                        num_gpus=generator_cfg.num_gpus)(GeneratorActor)
    gen = remote.options(name=GENERATOR_NAME).remote(
        name="gen0", cfg=generator_cfg, model_path=str(model_path), seed=seed,
        env_pools=[EnvPool(EnvConfig(replicas_per_actor=1, num_cpus_per_actor=0.1),
                           name="gen0-env")],
        ingest_address="127.0.0.1:9")  # never dialled: this flow rolls nothing out
    gens: list[Any] = [gen]  # both syncs hold this list, as the driver's
    broadcast, object_store = (
        make_weight_sync(learner_cfg.model_copy(update={"weight_sync": kind,
                                                        "weight_sync_timeout_s": timeout_s}),
                         learner, gens) for kind in ("broadcast", "object_store"))
    vocab = min(len(tok), 2000)
    seqs = _sequences(vocab, n=4, seed=seed)
    examples = [SFTExample(tuple(s), (0,) + (1,) * (len(s) - 1))
                for s in _sequences(vocab, n=2 * learner_cfg.world_size, seed=seed + 1)]
    rounds = [("broadcast forms its group", broadcast, False),
              ("broadcast reuses the group", broadcast, False),
              ("broadcast re-forms it for a new handle", broadcast, True),
              ("object store", object_store, False)]
    checks = []
    try:
        ray.get(gen.ready.remote())
        state_bytes = sum(v.nbytes for v in ray.get(learner.state_dict_ref()).values())
        for version, (label, sync, new_handle) in enumerate(rounds, start=1):
            if new_handle:
                gens[0] = ray.get_actor(GENERATOR_NAME)  # same actor, new handle object
            before = ray.get(gens[0].score.remote(seqs))
            learner.train_sft(examples)
            want = learner.score(seqs)
            metrics = sync.push(version).metrics()
            got = ray.get(gens[0].score.remote(seqs))
            checks.append(PushCheck(
                label=label, strategy="broadcast" if sync is broadcast else "object_store",
                backend=getattr(sync, "backend", None), max_diff=_max_abs(got, want),
                moved=_max_abs(before, want), state_bytes=state_bytes, metrics=metrics))
        broadcast.close()
    finally:
        learner.shutdown()
        ray.kill(gen)
    return checks


def _line(ok: bool, text: str) -> bool:
    print(f"{'PASS' if ok else 'FAIL'} {text}", flush=True)
    return ok


def report(checks: list[PushCheck], *, tol: float, expect_backend: str) -> bool:
    """PASS/FAIL lines for `checks`; True when all pass."""
    ok = True
    for c in checks:
        m = c.metrics
        ok &= _line(c.max_diff < tol, f"{c.label}: max |vLLM - learner| logprob {c.max_diff:.2e} "
                    f"(tolerance {tol:.0e}); {m['weight_sync_seconds']:.3f} s")
        ok &= _line(c.moved > 100 * tol, f"{c.label}: the update moved logprobs by {c.moved:.2e}")
        if c.strategy == "broadcast":
            ok &= _line(m["weight_sync_bytes"] == c.state_bytes,
                        f"{c.label}: {m['weight_sync_bytes']:.0f} bytes sent in "
                        f"{m['weight_sync_buckets']:.0f} buckets, state dict "
                        f"{c.state_bytes} bytes")
            ok &= _line(c.backend == expect_backend,
                        f"{c.label}: backend {c.backend} (expected {expect_backend})")
    return ok


# bf16 logits move each token's logprob by ~1e-2 on this near-uniform model, so the ratios,
# and a GRPO loss that averages ratio x advantage (|A| ~ 1), move by as much (measured on
# CPU: 6.6e-3 on losses of 0.02-0.06; tests/integration/test_learner_group.py's toy batch of a
# pre-trained model: 3e-4).
BF16_LOSS_TOL = 2e-2


def learner_precision(model: Path, *, stage: int, cuda: bool) -> list[tuple[bool, str]]:
    """2 ranks in bf16 vs fp32 on one synthetic batch, 3 updates each: the losses agree within
    bf16 rounding and bf16 really ran (they are not identical)."""
    from bench.learner_throughput import synthetic_trajectories, with_behaviour_logprobs
    from horizonrl.learner.group import LearnerGroup
    from horizonrl.protos.chat import load_tokenizer
    from horizonrl.protos.precision import OLD_DTYPE_NAMES

    pad = load_tokenizer(model).pad_token_id
    trajs = with_behaviour_logprobs(synthetic_trajectories(n=16, tokens=200, group_size=4,
                                                           vocab=300, seed=0), model, pad_id=pad)
    losses = {}
    for dtype in ("fp32", "bf16"):
        cfg = LearnerConfig(world_size=2, zero_stage=stage, dtype=OLD_DTYPE_NAMES[dtype],
                            kl_coef=0.01, minibatches=1,
                            num_gpus_per_worker=1.0 if cuda else 0.0)
        group = LearnerGroup(cfg, model_path=str(model), pad_id=pad, seed=0)
        try:
            losses[dtype] = [group.train(trajs)["loss"] for _ in range(3)]
        finally:
            group.shutdown()
    diff = max(abs(a - b) for a, b in zip(losses["fp32"], losses["bf16"]))
    scale = max(abs(x) for x in losses["fp32"])
    where = "CUDA" if cuda else "CPU"
    return [(diff < BF16_LOSS_TOL, f"ZeRO-{stage} bf16 vs fp32 on {where}: max |loss diff| "
             f"{diff:.2e} (tolerance {BF16_LOSS_TOL:.0e}; fp32 losses up to {scale:.3f})"),
            (diff > 0, f"ZeRO-{stage} bf16 ran in bf16 (losses differ from fp32: {diff:.2e})")]


def training_run(tmp: Path) -> list[tuple[bool, str]]:
    import subprocess

    cmd = [sys.executable, "-m", "horizonrl.cluster.cli",
           "train", "--config", "configs/babyai-gpu.yaml",
           "iterations=5", f"run_root={tmp / 'runs'}", "metrics.port=0"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or [""]
    return [(proc.returncode == 0, f"5 iterations of configs/babyai-gpu.yaml: exit "
             f"{proc.returncode} ({tail[0][:160]})")]


def weight_sync(model: Path, args: argparse.Namespace, gpus: int) -> list[tuple[bool, str]]:
    from horizonrl.cluster.config import RayConfig
    from horizonrl.cluster.ops.runtime import ray_session

    if gpus >= 2:  # learner ranks and the generator each on a GPU of their own: NCCL
        world, learner_gpus, gen_gpus, expect = min(2, gpus - 1), 1.0, 1.0, "nccl"
    else:  # one shared GPU: one learner rank, and the weight group falls back to gloo
        world, learner_gpus, gen_gpus, expect = 1, 0.5, 0.5, "gloo"
    print(f"layout: {world} learner rank(s) x {learner_gpus} GPU, generator {gen_gpus} GPU; "
          f"expected weight group backend: {expect}", flush=True)
    learner_cfg = LearnerConfig(world_size=world, zero_stage=3, num_gpus_per_worker=learner_gpus,
                                num_cpus_per_worker=1, kl_coef=0.0, lr=1e-2, warmup_steps=0,
                                minibatches=1, weight_sync="broadcast",
                                weight_bucket_mb=args.bucket_mb)
    generator_cfg = GeneratorConfig(num_gpus=gen_gpus, num_cpus=1, max_context_tokens=256)
    with ray_session(RayConfig(num_cpus=8)):
        checks = weight_sync_flow(model, learner_cfg=learner_cfg, generator_cfg=generator_cfg,
                                  timeout_s=120.0)
    return [(report(checks, tol=args.tol, expect_backend=expect), "every push above")]


def main() -> int:
    import json

    import torch

    from horizonrl.cluster.config import RayConfig
    from horizonrl.cluster.model.tiny_model import build_tiny_model
    from horizonrl.cluster.ops.runtime import ray_session

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tol", type=float, default=1e-4, help="logprob tolerance")
    ap.add_argument("--bucket-mb", type=float, default=1.0, help="learner.weight_bucket_mb")
    ap.add_argument("--only", nargs="+", help="run only these checks")
    ap.add_argument("--json", help="also write the summary here")
    args = ap.parse_args()
    gpus = torch.cuda.device_count()
    print(f"CUDA devices: {gpus}", flush=True)
    summary: dict[str, str] = {}
    detail: dict[str, list[str]] = {}  # each check's PASS/FAIL lines, measured figures in them
    with tempfile.TemporaryDirectory(prefix="horizonrl-gpu-check-") as tmp:
        model = build_tiny_model(Path(tmp) / "tiny", transcripts=300, pretrain_steps=4,
                                 batch_size=8, seed=0)

        def learner_check(stage: int) -> list[tuple[bool, str]]:
            with ray_session(RayConfig(num_cpus=8)):  # a local Ray sees this machine's GPUs
                return learner_precision(model, stage=stage, cuda=gpus >= 2)

        checks = [
            ("learner-bf16-zero2", False, lambda: learner_check(2)),
            ("learner-bf16-zero3", False, lambda: learner_check(3)),
            ("weight-sync", True, lambda: weight_sync(model, args, gpus)),
            ("training-run", True, lambda: training_run(Path(tmp))),
        ]
        for name, needs_gpu, run in checks:
            if args.only and name not in args.only:
                continue
            if needs_gpu and not gpus:
                print(f"SKIP {name}: no CUDA device", flush=True)
                summary[name] = "skip"
                continue
            try:
                lines = run()
            except Exception as e:  # a FAIL line, not a traceback alone, for whoever reads it
                lines = [(False, f"raised {type(e).__name__}: {e}")]
            ok = all([_line(good, f"{name}: {text}") for good, text in lines])
            summary[name] = "pass" if ok else "fail"
            detail[name] = [f"{'PASS' if good else 'FAIL'} {text}" for good, text in lines]
    print(json.dumps({"cuda_devices": gpus, "checks": summary}), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"command": command_line(), "cuda_devices": gpus,
                                               "checks": summary, "lines": detail}, indent=1))
    return 1 if "fail" in summary.values() else 0


if __name__ == "__main__":
    sys.exit(main())
