"""What the OpenAI endpoint costs: an outside agent against horizonrl's own loop, same prompts.

    .venv/bin/python bench/agent_endpoint.py --episodes 32 --horizon 10 --rounds 3 \
        --out docs/agents/endpoint.json

One vLLM engine (the config's tiny TextCraft model, float32, CPU) plays the same TextCraft tasks
two ways, alternating, `--rounds` times: (a) `generator.loop=independent`'s loop
(actors/episodes.py, in-process env replicas); (b) the example agent without tools
(envpool/agents/textcraft_tools.py:play_plain, `openai` SDK over HTTP on 127.0.0.1, one thread
per episode) through the endpoint (actors/agent_episodes.py). Without tools both send the model
token for token the same prompts (checked on each episode's first prompt), so the difference
is the endpoint's: HTTP and JSON, rendering the new messages, the agents' threads.

Reported per round and as medians: episodes, model turns and generated tokens per second of
each, the endpoint's ratio to the loop, and the wall time it adds per model turn.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from horizonrl.cluster.ops.provenance import command_line

ROOT = Path(__file__).resolve().parents[1]
AGENT = "horizonrl.envpool.agents.textcraft_tools:play_plain"
MAX_TOKENS = 48  # the example agent's request; the loop gets the same budget


class FirstPrompts:
    """The engine, keeping each request's prompt (to compare the two ways' first prompts)."""

    def __init__(self, engine) -> None:
        self.engine, self.prompts = engine, {}

    def submit(self, rid, prompt, **kw):
        self.prompts[rid] = list(prompt)
        self.engine.submit(rid, prompt, **kw)

    def __getattr__(self, name):
        return getattr(self.engine, name)


def first_prompts(prompts: dict[str, list[int]], prefix: str, n: int) -> dict[int, list[int]]:
    """Each episode's first prompt: request ids are `<prefix><episode>-r<count>`."""
    out = {}
    for i in range(n):
        mine = [r for r in prompts if r.startswith(f"{prefix}{i}-")]
        if mine:
            out[i] = prompts[min(mine, key=lambda r: int(r.rsplit("-r", 1)[1]))]
    return out


def loop_round(engine, chat, seeds, horizon):
    from horizonrl.actors.episodes import Episode, IndependentEpisodes
    from horizonrl.actors.rollout import AgentLoop
    from horizonrl.envpool.config import EnvConfig
    from horizonrl.envpool.pool import EnvPool
    from horizonrl.envpool.registry import env_spec

    spec = env_spec("textcraft")
    pool = EnvPool(EnvConfig(name="textcraft", kwargs={"depths": [1, 2]}, in_process=True,
                             replicas_per_actor=len(seeds)))
    eps = [Episode(i, "textcraft", s, AgentLoop(
        chat=chat, system_prompt=spec.system_prompt, parse_action=spec.parse_action,
        horizon=horizon, max_context_tokens=4096, max_tokens_per_turn=MAX_TOKENS))
        for i, s in enumerate(seeds)]
    rec = FirstPrompts(engine)
    t0 = time.perf_counter()
    tally = IndependentEpisodes(rec, {"textcraft": pool}, max_tokens=MAX_TOKENS,
                                temperature=1.0, max_in_flight=len(seeds),
                                on_done=lambda done: None).run(eps)
    seconds = time.perf_counter() - t0
    pool.close()
    firsts = first_prompts(rec.prompts, "ep", len(seeds))
    turns = sum(ep.loop.num_turns for ep in eps)
    return seconds, turns, tally, firsts


def agent_round(engine, tokenizer, chat, seeds, horizon, in_process):
    from horizonrl.actors.agent_episodes import AgentEpisode, AgentEpisodes
    from horizonrl.actors.agent_sessions import AgentSession, AgentSessions
    from horizonrl.actors.openai_server import AgentEndpoint, RequestQueue
    from horizonrl.actors.tool_calls import parse_hermes
    from horizonrl.envpool.config import EnvConfig
    from horizonrl.envpool.pool import EnvPool
    from horizonrl.protos.messages import Renderer

    pool = EnvPool(EnvConfig(name="textcraft", kwargs={"depths": [1, 2]},
                             in_process=in_process, replicas_per_actor=len(seeds)), agent=AGENT)
    pool.wait_ready()
    sessions, requests = AgentSessions(), RequestQueue()
    endpoint = AgentEndpoint(sessions, requests, host="127.0.0.1", port=0, model="horizonrl",
                             max_request_bytes=4 << 20, request_timeout_s=300)
    renderer = Renderer(tokenizer)
    eps = [AgentEpisode(i, "textcraft", s, f"textcraft-{s}", AgentSession(
        renderer=renderer, parser=parse_hermes, horizon=horizon, max_context_tokens=4096,
        max_tokens=MAX_TOKENS, version=0, end_id=chat.im_end_id))
        for i, s in enumerate(seeds)]
    rec = FirstPrompts(engine)
    t0 = time.perf_counter()
    try:
        tally = AgentEpisodes(rec, {"textcraft": pool}, sessions, requests,
                              base_url=endpoint.base_url(), model="horizonrl", temperature=1.0,
                              timeout_s=600, on_done=lambda done: None).run(eps)
    finally:
        endpoint.close()
        pool.close()
    seconds = time.perf_counter() - t0
    failed = [ep.error for ep in eps if ep.error]
    if failed:
        raise RuntimeError(f"agent episodes failed: {failed[:3]}")
    firsts = first_prompts(rec.prompts, "agent", len(seeds))
    turns = sum(len(ep.session.turns) for ep in eps)
    return seconds, turns, tally, firsts


def rates(seconds, episodes, turns, tally):
    """Throughput of one round; `engine_seconds` is the time in engine steps (small batches
    cost nearly as much per step as large ones on CPU)."""
    return {"seconds": seconds, "episodes": episodes, "turns": turns,
            "tokens": tally.generated_tokens, "engine_seconds": tally.generate,
            "episodes_per_s": episodes / seconds, "turns_per_s": turns / seconds,
            "tokens_per_s": tally.generated_tokens / seconds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/textcraft-agent.yaml")
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--horizon", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--agents", choices=["generator", "actor"], default="generator",
                    help="where the agents' threads run: in the generator's process "
                    "(env.in_process), or in an env actor process of a local Ray")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    from horizonrl.actors.engine import VLLMEngine
    from horizonrl.cluster.config import load_config
    from horizonrl.cluster.model.load import ensure_model
    from horizonrl.protos.chat import ChatFormat, load_tokenizer

    cfg = load_config(ROOT / args.config)
    if args.agents == "actor":
        import ray

        from horizonrl.cluster.ops.runtime import LOCAL_RAY_ENV

        os.environ.update(LOCAL_RAY_ENV)
        ray.init(num_cpus=4, include_dashboard=False)
    model = ensure_model(cfg.model, env=cfg.env)
    tokenizer = load_tokenizer(model)
    chat = ChatFormat(tokenizer)
    engine = VLLMEngine(str(model), seed=cfg.seed, max_model_len=4096,
                        stop_token_ids=[chat.im_end_id])
    seeds = list(range(args.episodes))
    loop_round(engine, chat, seeds[:2], 2)  # warm-up: the engine's first steps are slow
    rounds, same = [], True
    for r in range(args.rounds):
        s, t, k, loop_firsts = loop_round(engine, chat, seeds, args.horizon)
        native = rates(s, len(seeds), t, k)
        s, t, k, agent_firsts = agent_round(engine, tokenizer, chat, seeds, args.horizon,
                                            args.agents == "generator")
        agent = rates(s, len(seeds), t, k)
        same = same and all(agent_firsts[i] == loop_firsts.get(i) for i in agent_firsts)
        ratio = {m: agent[m] / native[m] for m in ("episodes_per_s", "turns_per_s",
                                                   "tokens_per_s")}
        # Wall time the endpoint adds per model turn, with all episodes in flight.
        added = 1e3 * (agent["seconds"] - native["seconds"]) / max(agent["turns"], 1)
        rounds.append({"loop": native, "endpoint": agent, "endpoint_over_loop": ratio,
                       "added_ms_per_turn": added})
        print(f"round {r + 1}/{args.rounds}: loop {native['turns_per_s']:.1f} turns/s "
              f"(engine {native['engine_seconds']:.2f}s of {native['seconds']:.2f}s), "
              f"endpoint {agent['turns_per_s']:.1f} turns/s (engine "
              f"{agent['engine_seconds']:.2f}s of {agent['seconds']:.2f}s): "
              f"{ratio['turns_per_s']:.2f}x", flush=True)
    median = {m: statistics.median(x["endpoint_over_loop"][m] for x in rounds)
              for m in rounds[0]["endpoint_over_loop"]}
    out = {"command": command_line(), "config": args.config, "agents": args.agents,
           "episodes": args.episodes,
           "horizon": args.horizon, "max_tokens": MAX_TOKENS, "agent": AGENT,
           "first_prompts_identical": same, "rounds": rounds,
           "median_endpoint_over_loop": median,
           "median_added_ms_per_turn": statistics.median(x["added_ms_per_turn"]
                                                         for x in rounds)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({"first_prompts_identical": same, "median": median}, indent=1))


if __name__ == "__main__":
    main()
