"""The generator's agent loop against bare vLLM on the same prompts, and without prefix caching.

    .venv/bin/python bench/generator.py --config configs/textcraft-bc-rl.yaml --rollouts 4 \
        --horizon 10 --out docs/context/generator.json

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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


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


def child(config: str, caching: bool, rollouts: int, horizon: int, overrides: list[str]) -> dict:
    from actors.engine import VLLMEngine
    from actors.generator import GeneratorActor
    from cluster.config import RayConfig, load_config
    from cluster.iteration import sample_tasks
    from cluster.models import ensure_model
    from cluster.runtime import ray_session
    from envpool.pool import EnvPool
    from learner.ingest import TrajectoryIngest

    cfg = load_config(config, [f"generator.prefix_caching={str(caching).lower()}", *overrides])
    g = cfg.generator
    model = ensure_model(cfg.model, env=cfg.env)
    with ray_session(RayConfig(num_cpus=2)), TrajectoryIngest(port=0) as ingest:
        from protos.chat import ChatFormat, load_tokenizer

        chat = ChatFormat(load_tokenizer(model))
        engine = RecordingEngine(VLLMEngine(
            str(model), seed=0, max_model_len=g.max_context_tokens,
            stop_token_ids=[chat.im_end_id], kv_cache_gib=g.kv_cache_gib, dtype=g.dtype,
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
                totals[k] += out["seconds"][k]
            totals["episode_turns"] += out["env_steps"]
            totals["tokens"] += out["generated_tokens"]
            ingest.drain()
        call_seconds = sum(c["seconds"] for c in engine.calls)
        bare_tokens, bare_seconds = replay(engine.inner, engine.calls) if caching else (0, 0.0)
    return {**totals, "engine_call_seconds": call_seconds, "bare_tokens": bare_tokens,
            "bare_seconds": bare_seconds, "turn_batches": len(engine.calls)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="configs/textcraft-bc-rl.yaml")
    ap.add_argument("--rollouts", type=int, default=4)
    ap.add_argument("--horizon", type=int, default=10)
    ap.add_argument("--out", default="docs/context/generator.json")
    ap.add_argument("--child", choices=["cache", "nocache"], help=argparse.SUPPRESS)
    ap.add_argument("overrides", nargs="*", help="config overrides, section.field=value")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.config, args.child == "cache", args.rollouts, args.horizon,
                               args.overrides)))
        return
    runs = {}
    for variant in ("cache", "nocache"):
        out = subprocess.run([sys.executable, __file__, "--child", variant, "--config",
                              args.config, "--rollouts", str(args.rollouts), "--horizon",
                              str(args.horizon), *args.overrides],
                             stdout=subprocess.PIPE, text=True, check=True, timeout=3600)
        runs[variant] = json.loads(out.stdout.strip().splitlines()[-1])
        print(variant, runs[variant], flush=True)
    c, n = runs["cache"], runs["nocache"]
    turns = max(c["episode_turns"], 1)
    loop_model = c["tokens"] / c["engine_call_seconds"]
    bare = c["bare_tokens"] / c["bare_seconds"]
    result = {
        "loop_tokens_per_s_model_bound": round(loop_model, 1),
        "loop_tokens_per_s_whole_rollout": round(c["tokens"] / c["wall"], 1),
        "bare_vllm_tokens_per_s": round(bare, 1),
        "loop_vs_bare_model_bound": round(loop_model / bare, 3),
        "loop_vs_bare_whole_rollout": round(c["tokens"] / c["wall"] / bare, 3),
        "loop_without_prefix_cache_tokens_per_s_model_bound": round(
            n["tokens"] / n["engine_call_seconds"], 1),
        "cache_vs_no_cache_model_bound": round(
            loop_model / (n["tokens"] / n["engine_call_seconds"]), 3),
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
    print(json.dumps(result, indent=1))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"command": " ".join(["python bench/generator.py", *sys.argv[1:]]),
                               "rollouts": args.rollouts, "horizon": args.horizon,
                               "runs": runs, "result": result}, indent=1) + "\n")


if __name__ == "__main__":
    main()
