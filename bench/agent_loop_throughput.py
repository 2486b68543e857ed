"""The generator's agent loop against bare vLLM on the same prompts, and without prefix caching.

    .venv/bin/python bench/agent_loop_throughput.py --config configs/textcraft-bc-rl.yaml \
        --rollouts 4 --horizon 10 --out docs/context/generator.json

The real GeneratorActor as a plain class (vLLM, env actors on a local Ray, the gRPC sender into
a real ingest) runs `--rollouts` rollouts of the config's tasks after one warm-up rollout; its
engine is wrapped to record every batch of prompts it was given and the seconds each generate
call took. Then the same engine's `vllm.LLM.generate` replays exactly those batches with the same
sampling settings (prefix cache reset first, so the replay starts as cold as the loop did).

Reported: tokens/s of the loop's engine calls (the model-bound part) and of the whole rollout,
the bare replay's tokens/s, their ratios; the loop with `generator.prefix_caching=false` (a fresh
process) against the cached loop; and milliseconds per episode-turn: the engine call, parsing
replies into actions, env calls, transport, and the rest (prompt building, bookkeeping, pushing
trajectories, releasing replicas).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from horizonrl.cluster.ops.provenance import command_line

ROOT = Path(__file__).resolve().parents[1]


class RecordingEngine:
    """The Engine protocol around a VLLMEngine, keeping each call's prompts and seconds."""

    def __init__(self, inner) -> None:
        self.inner, self.calls = inner, []

    def generate(self, prompts, *, max_tokens, temperature):
        t0 = time.perf_counter()
        out = self.inner.generate(prompts, max_tokens=max_tokens, temperature=temperature)
        self.calls.append({"prompts": [list(p) for p in prompts], "max_tokens": max_tokens,
                           "temperature": temperature, "seconds": time.perf_counter() - t0,
                           "tokens": sum(len(c.token_ids) for c in out)})
        return out

    def __getattr__(self, name):  # weight loading and scoring go to the real engine
        return getattr(self.inner, name)


def replay(engine, calls: list[dict]) -> tuple[int, float]:
    """Bare `LLM.generate` on the recorded batches; (generated tokens, seconds)."""
    from vllm import SamplingParams

    engine.llm.reset_prefix_cache()
    tokens, seconds = 0, 0.0
    for c in calls:
        params = SamplingParams(temperature=c["temperature"], max_tokens=c["max_tokens"],
                                logprobs=0, stop_token_ids=engine.stop_token_ids,
                                detokenize=False)
        t0 = time.perf_counter()
        outs = engine.llm.generate([{"prompt_token_ids": p} for p in c["prompts"]], params,
                                   use_tqdm=False)
        seconds += time.perf_counter() - t0
        tokens += sum(len(o.outputs[0].token_ids) for o in outs)
    return tokens, seconds


# Each variant is a fresh process: the config with these overrides. "cache" also replays its
# engine calls on bare vLLM; fp32 and bf16 pin the engine dtype whatever the config says.
VARIANTS = {"cache": ["generator.prefix_caching=true"],
            "nocache": ["generator.prefix_caching=false"],
            "fp32": ["generator.prefix_caching=true", "generator.dtype=float32"],
            "bf16": ["generator.prefix_caching=true", "generator.dtype=bfloat16"]}


def child(config: str, variant: str, rollouts: int, horizon: int, overrides: list[str]) -> dict:
    from horizonrl.actors.engine import VLLMEngine
    from horizonrl.actors.generator import GeneratorActor
    from horizonrl.cluster.config import RayConfig, load_config
    from horizonrl.cluster.model.load import ensure_model
    from horizonrl.cluster.ops.runtime import ray_session
    from horizonrl.cluster.rollout.iteration import sample_tasks
    from horizonrl.envpool.pool import EnvPool
    from horizonrl.learner.ingest import TrajectoryIngest
    from horizonrl.protos.precision import bf16_native, engine_dtype

    # Lock-step: its batched generate calls are what the replay compares against bare vLLM
    # (bench/rollout_throughput.py compares the loops).
    cfg = load_config(config, [*overrides, "generator.loop=lockstep", *VARIANTS[variant]])
    g, caching = cfg.generator, cfg.generator.prefix_caching
    dtype = engine_dtype(g.dtype, native_bf16=bf16_native("cpu"))
    model = ensure_model(cfg.model, env=cfg.env)
    with ray_session(RayConfig(num_cpus=2)), TrajectoryIngest(port=0) as ingest:
        from horizonrl.protos.chat import ChatFormat, load_tokenizer

        chat = ChatFormat(load_tokenizer(model))
        engine = RecordingEngine(VLLMEngine(
            str(model), seed=0, max_model_len=g.max_context_tokens,
            stop_token_ids=[chat.im_end_id], kv_cache_gib=g.kv_cache_gib, dtype=dtype,
            prefix_caching=caching))
        gen = GeneratorActor(name="g", cfg=g, model_path=str(model),
                             env_pools=[EnvPool(e) for e in cfg.envs],
                             ingest_address=ingest.address, seed=0, engine=engine)
        gen.set_horizon(horizon, 0)
        gen.rollout(sample_tasks(cfg, 0), group_size=g.group_size, step=0)  # warm-up
        ingest.drain()
        engine.calls.clear()
        if caching:
            engine.inner.llm.reset_prefix_cache()
        totals = {"wall": 0.0, "generate": 0.0, "env": 0.0, "transport": 0.0,
                  "episode_turns": 0, "tokens": 0}
        for i in range(1, rollouts + 1):
            t0 = time.perf_counter()
            out = gen.rollout(sample_tasks(cfg, i), group_size=g.group_size, step=i)
            totals["wall"] += time.perf_counter() - t0
            for k in ("generate", "env", "transport"):
                totals[k] += getattr(out.seconds, k)
            totals["episode_turns"] += out.env_steps
            totals["tokens"] += out.generated_tokens
            ingest.drain()
        call_seconds = sum(c["seconds"] for c in engine.calls)
        bare_tokens, bare_seconds = (replay(engine.inner, engine.calls) if variant == "cache"
                                     else (0, 0.0))
    return {**totals, "engine_call_seconds": call_seconds, "bare_tokens": bare_tokens,
            "bare_seconds": bare_seconds, "turn_batches": len(engine.calls), "dtype": dtype}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="configs/textcraft-bc-rl.yaml")
    ap.add_argument("--rollouts", type=int, default=4)
    ap.add_argument("--horizon", type=int, default=10)
    ap.add_argument("--out", default="docs/context/generator.json")
    ap.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=["cache", "nocache"],
                    help="cache and nocache: the loop against bare vLLM and without prefix "
                    "caching; fp32 and bf16: the cached loop with vLLM in each dtype")
    ap.add_argument("--repeats", type=int, default=1,
                    help="run the variants this many times (alternating order); best of them")
    ap.add_argument("--child", choices=list(VARIANTS), help=argparse.SUPPRESS)
    ap.add_argument("overrides", nargs="*", help="config overrides, section.field=value")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.config, args.child, args.rollouts, args.horizon,
                               args.overrides)))
        return
    every: dict[str, list[dict]] = {v: [] for v in args.variants}
    for r in range(args.repeats):
        # ABBA order: a variant that runs right after another process's teardown (Ray's
        # workers still exiting) is not always the same one.
        for variant in args.variants[::-1] if r % 2 else args.variants:
            out = subprocess.run([sys.executable, __file__, "--child", variant, "--config",
                                  args.config, "--rollouts", str(args.rollouts), "--horizon",
                                  str(args.horizon), *args.overrides],
                                 stdout=subprocess.PIPE, text=True, check=True, timeout=3600)
            every[variant].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(variant, every[variant][-1], flush=True)
    runs = {v: max(rs, key=model_bound) for v, rs in every.items()}  # best of the repeats
    result = {**(loop_results(runs["cache"], runs["nocache"]) if "nocache" in runs else {}),
              **(dtype_results(runs["fp32"], runs["bf16"]) if "bf16" in runs else {})}
    print(json.dumps(result, indent=1))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"command": command_line(),
                               "rollouts": args.rollouts, "horizon": args.horizon,
                               "runs": runs, "repeats": every, "result": result},
                              indent=1) + "\n")


def model_bound(run: dict) -> float:
    """Generated tokens per second of the engine calls alone."""
    return run["tokens"] / run["engine_call_seconds"]


def dtype_results(fp32: dict, bf16: dict) -> dict:
    return {"fp32_tokens_per_s_model_bound": round(model_bound(fp32), 1),
            "bf16_tokens_per_s_model_bound": round(model_bound(bf16), 1),
            "bf16_vs_fp32_model_bound": round(model_bound(bf16) / model_bound(fp32), 3),
            "bf16_vs_fp32_whole_rollout": round(
                bf16["tokens"] / bf16["wall"] / (fp32["tokens"] / fp32["wall"]), 3)}


def loop_results(c: dict, n: dict) -> dict:
    turns = max(c["episode_turns"], 1)
    loop_model = model_bound(c)
    bare = c["bare_tokens"] / c["bare_seconds"]
    return {
        "loop_tokens_per_s_model_bound": round(loop_model, 1),
        "loop_tokens_per_s_whole_rollout": round(c["tokens"] / c["wall"], 1),
        "bare_vllm_tokens_per_s": round(bare, 1),
        "loop_vs_bare_model_bound": round(loop_model / bare, 3),
        "loop_vs_bare_whole_rollout": round(c["tokens"] / c["wall"] / bare, 3),
        "loop_without_prefix_cache_tokens_per_s_model_bound": round(model_bound(n), 1),
        "cache_vs_no_cache_model_bound": round(loop_model / model_bound(n), 3),
        "cache_vs_no_cache_whole_rollout": round(n["wall"] / c["wall"], 3),
        "ms_per_episode_turn": {
            "engine": round(1e3 * c["engine_call_seconds"] / turns, 3),
            # The generator's "generate" phase minus the engine call: decoding and parsing
            # the replies into actions, appending ids.
            "parse": round(1e3 * (c["generate"] - c["engine_call_seconds"]) / turns, 3),
            "env": round(1e3 * c["env"] / turns, 3),
            "transport": round(1e3 * c["transport"] / turns, 3),
            "other": round(1e3 * (c["wall"] - c["generate"] - c["env"] - c["transport"])
                           / turns, 3)},
    }


if __name__ == "__main__":
    main()
