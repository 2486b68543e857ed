"""What an episode costs against its horizon: the full context vs a window of the last K turns,
with and without vLLM's prefix caching.

    .venv/bin/python bench/context.py --config configs/textcraft-bc-rl.yaml --env-kwargs \
        '{"depths": [4]}' --horizons 10 20 40 --episodes 8 --keep-turns 4 --out docs/context

The config's model (the tiny model it builds, or model.path) runs `--episodes` episodes in
lock-step through the agent loop (`actors.rollout.AgentLoop`, the generator's own bookkeeping)
at each horizon, `--repeats` times (token counts averaged, times the median), for four
settings: full and window context, each with prefix caching off and on (one vLLM engine per
setting, built in turn). Depth-4 TextCraft goals are never solved by the
untrained model, so every episode runs its whole horizon unless the context ends it.

Per episode: context tokens (the prompt tokens the engine was given, summed over turns: the
attention work grows with these), prefilled tokens (those minus the tokens the prefix cache
served: what the engine recomputed), generated tokens, seconds (wall and generate-only), turns,
and whether the context limit cut it. The growth exponent b of cost ~ a * H^b is the
least-squares slope on log-log axes. Writes OUT/results.json and OUT/context.png.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from pathlib import Path

from horizonrl.cluster.ops.png import save_png
from horizonrl.cluster.ops.provenance import command_line

ROOT = Path(__file__).resolve().parents[1]

SETTINGS = {"full": (None, False), "full+cache": (None, True),
            "window": ("K", False), "window+cache": ("K", True)}


def run_episodes(engine, chat, cfg, *, horizon: int, episodes: int, keep_turns: int | None,
                 env_kwargs: dict) -> dict[str, float]:
    """`episodes` episodes in lock-step at `horizon`; means per episode."""
    from horizonrl.actors.rollout import AgentLoop
    from horizonrl.envpool.registry import env_spec, make_env

    spec = env_spec(cfg.env.name)
    envs = [make_env(cfg.env.name, **env_kwargs) for _ in range(episodes)]
    loops = [AgentLoop(chat=chat, system_prompt=spec.system_prompt,
                       parse_action=spec.parse_action, horizon=horizon,
                       max_context_tokens=cfg.generator.max_context_tokens,
                       max_tokens_per_turn=cfg.generator.max_tokens_per_turn,
                       keep_turns=keep_turns) for _ in range(episodes)]
    for k, (loop, env) in enumerate(zip(loops, envs)):
        loop.start(env.reset(seed=1000 + k)[0])
    context = cached = generated = 0
    gen_s = 0.0
    t0 = time.perf_counter()
    for _ in range(horizon):
        live = [i for i, loop in enumerate(loops) if not loop.done]
        if not live:
            break
        prompts = [loops[i].context_ids for i in live]
        t1 = time.perf_counter()
        outs = engine.generate(prompts, max_tokens=cfg.generator.max_tokens_per_turn,
                               temperature=1.0)
        gen_s += time.perf_counter() - t1
        context += sum(map(len, prompts))
        cached += sum(c.cached_tokens for c in outs)
        generated += sum(len(c.token_ids) for c in outs)
        for i, c in zip(live, outs):
            loops[i].add_env_result(envs[i].step(loops[i].add_model_turn(c)))
    wall = time.perf_counter() - t0
    for env in envs:
        env.close()
    n = float(episodes)
    return {"context_tokens": context / n, "prefilled_tokens": (context - cached) / n,
            "generated_tokens": generated / n, "seconds": wall / n, "generate_seconds": gen_s / n,
            "turns": sum(loop.num_turns for loop in loops) / n,
            "cut_by_context": sum(loop.cut == "context" for loop in loops) / n}


def exponent(horizons: list[int], values: list[float]) -> float:
    """Slope of log(value) on log(horizon): 1 linear, 2 quadratic."""
    import numpy as np

    return float(np.polyfit(np.log(horizons), np.log(values), 1)[0])


def plot(results: dict, horizons: list[int], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, key, label in zip(axes, ("context_tokens", "prefilled_tokens", "seconds"),
                              ("prompt tokens per episode", "prefilled (recomputed) tokens",
                               "seconds per episode")):
        for name, res in results.items():
            ys = [res["by_horizon"][str(h)][key] for h in horizons]
            ax.plot(horizons, ys, marker="o",
                    label=f"{name} (b={res['exponents'][key]:.2f})")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(horizons, [str(h) for h in horizons])
        ax.set_xlabel("horizon (turns)")
        ax.set_title(label)
        ax.legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, out, dpi=110)


def main() -> None:
    from horizonrl.actors.engine import VLLMEngine
    from horizonrl.cluster.config import load_config
    from horizonrl.cluster.model.load import ensure_model
    from horizonrl.protos.chat import ChatFormat, load_tokenizer
    from horizonrl.protos.precision import bf16_native, engine_dtype

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/textcraft-bc-rl.yaml")
    p.add_argument("--env-kwargs", default="{}", help="JSON kwargs for the env (e.g. depths)")
    p.add_argument("--horizons", type=int, nargs="+", default=[10, 20, 40])
    p.add_argument("--episodes", type=int, default=8)
    p.add_argument("--keep-turns", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3, help="runs per horizon and setting")
    p.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    p.add_argument("--out", default="docs/context")
    p.add_argument("overrides", nargs="*", help="config overrides, section.field=value")
    args = p.parse_args()
    cfg = load_config(args.config, args.overrides)
    path = ensure_model(cfg.model, env=cfg.env)
    env_kwargs = {**cfg.env.kwargs, **json.loads(args.env_kwargs)}
    chat = ChatFormat(load_tokenizer(path))
    results = {}
    for name in args.settings:
        window, caching = SETTINGS[name]
        engine = VLLMEngine(str(path), seed=0, max_model_len=cfg.generator.max_context_tokens,
                            stop_token_ids=[chat.im_end_id],
                            dtype=engine_dtype(cfg.generator.dtype, native_bf16=bf16_native("cpu")),
                            prefix_caching=caching)
        keep = args.keep_turns if window else None
        run_episodes(engine, chat, cfg, horizon=2, episodes=2, keep_turns=keep,
                     env_kwargs=env_kwargs)  # warm-up: first-call allocations are not cost
        by_h = {}
        for h in args.horizons:
            runs = [run_episodes(engine, chat, cfg, horizon=h, episodes=args.episodes,
                                 keep_turns=keep, env_kwargs=env_kwargs)
                    for _ in range(args.repeats)]
            # Token counts are averaged; times are the median run (the machine is shared).
            by_h[str(h)] = {k: (statistics.median if "seconds" in k else statistics.fmean)(
                [r[k] for r in runs]) for k in runs[0]}
            print(name, h, {k: round(v, 3) for k, v in by_h[str(h)].items()}, flush=True)
        keys = ("context_tokens", "prefilled_tokens", "seconds", "generate_seconds")
        results[name] = {"by_horizon": by_h, "exponents": {
            k: round(exponent(args.horizons, [by_h[str(h)][k] for h in args.horizons]), 3)
            for k in keys}}
        print(name, "exponents", results[name]["exponents"], flush=True)
        del engine
        gc.collect()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({
        "command": command_line(),
        "model": str(path.name), "env": cfg.env.name, "env_kwargs": env_kwargs,
        "episodes": args.episodes, "repeats": args.repeats, "keep_turns": args.keep_turns,
        "max_context_tokens": cfg.generator.max_context_tokens,
        "max_tokens_per_turn": cfg.generator.max_tokens_per_turn,
        "results": results}, indent=1) + "\n")
    plot(results, args.horizons, out / "context.png")
    print(f"wrote {out / 'results.json'} and {out / 'context.png'}", flush=True)


if __name__ == "__main__":
    main()
