"""Outside agents through the OpenAI endpoint, on the real vLLM engine and real TextCraft.

The example agent (envpool/agents/textcraft_tools.py) is plain `openai`-SDK code sending its
whole history every turn. Every token a trajectory trains on must be one the engine sampled,
from exactly the prompt the engine was given; an agent that trims its history is flagged and
its turns keep their own prompts. Bad requests get clear errors; an agent that goes away
mid-request fails its episode and nothing else.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from conftest import ONE_RANK, async_steps

from horizonrl.actors.agent_episodes import AgentEpisode, AgentEpisodes, episode_info
from horizonrl.actors.agent_sessions import AgentSession, AgentSessions
from horizonrl.actors.openai_server import AgentEndpoint, RequestQueue
from horizonrl.actors.tool_calls import parse_hermes
from horizonrl.envpool.config import EnvConfig
from horizonrl.envpool.pool import EnvPool
from horizonrl.protos.chat import ChatFormat
from horizonrl.protos.messages import Renderer
from horizonrl.protos.trajectory import Failure

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = "horizonrl.envpool.agents.textcraft_tools"
TOL = 1e-4  # fp32 on both sides; kernels differ in summation order only
MISBEHAVED: dict[str, dict] = {}  # what `misbehave` saw, by episode key


class Recording:
    """The engine, keeping every prompt it was given and every reply it sampled."""

    def __init__(self, engine) -> None:
        self.engine, self.prompts, self.replies = engine, {}, {}

    def submit(self, rid, prompt, **kw):
        self.prompts[rid] = list(prompt)
        self.engine.submit(rid, prompt, **kw)

    def step(self):
        out = self.engine.step()
        for rid, completion in out:
            self.replies[rid] = completion
        return out

    def busy(self):
        return self.engine.busy()

    def abort(self, rids):
        self.engine.abort(rids)


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    from horizonrl.actors.engine import VLLMEngine
    from horizonrl.protos.chat import load_tokenizer

    end = ChatFormat(load_tokenizer(tiny_model_path)).im_end_id
    return VLLMEngine(str(tiny_model_path), seed=0, max_model_len=4096, stop_token_ids=[end])


def run_agents(engine, tokenizer, agent: str, episodes: int, horizon: int = 4,
               keep_open: bool = False):
    """`episodes` TextCraft episodes of `agent` through a fresh endpoint; the trajectories (in
    episode order), the recording engine, the episodes and the endpoint (closed unless
    `keep_open`)."""
    chat, renderer = ChatFormat(tokenizer), Renderer(tokenizer)
    pool = EnvPool(EnvConfig(name="textcraft", kwargs={"depths": [1]}, in_process=True,
                             replicas_per_actor=episodes), agent=agent)
    sessions, requests = AgentSessions(), RequestQueue()
    endpoint = AgentEndpoint(sessions, requests, host="127.0.0.1", port=0, model="horizonrl",
                             max_request_bytes=1 << 20, request_timeout_s=60)
    eps = [AgentEpisode(i, "textcraft", 3 + i % 2, f"textcraft-{3 + i % 2}", AgentSession(
        renderer=renderer, parser=parse_hermes, horizon=horizon, max_context_tokens=4096,
        max_tokens=48, version=0, end_id=chat.im_end_id)) for i in range(episodes)]
    rec, done = Recording(engine), []
    try:
        AgentEpisodes(rec, {"textcraft": pool}, sessions, requests,
                      base_url=endpoint.base_url(), model="horizonrl", temperature=1.0,
                      timeout_s=120, on_done=done.extend).run(eps)
    finally:
        if not keep_open:
            endpoint.close()
        pool.close()
    assert sorted(ep.index for ep in done) == list(range(episodes))  # every episode ended
    trajs = [ep.session.trajectory(ep.outcome, ep.failure, trajectory_id=f"t{ep.index}",
                                   group_id="g", task_id=ep.task_id, env_name="textcraft",
                                   info=episode_info(ep)) for ep in eps]
    return trajs, rec, eps, endpoint


def turns(traj):
    """(prompt the turn was sampled from, its sampled ids, their logprobs) per turn."""
    resp, prompt = list(traj.response_ids), list(traj.prompt_ids)
    if traj.turn_spans:
        spans = traj.turn_spans
    else:  # one row: each turn's sampled ids are a run of mask 1 after everything before it
        spans, start = [], None
        for i, m in enumerate([*traj.response_mask, 0]):
            if m and start is None:
                start = i
            elif not m and start is not None:
                spans.append((0, start, i))
                start = None
    return [(prompt + resp[ws:ts], resp[ts:te][:sum(traj.response_mask[ts:te])],
             list(traj.response_logprobs[ts:te][:sum(traj.response_mask[ts:te])]))
            for ws, ts, te in spans]


@pytest.mark.parametrize("agent, edits", [("play", False), ("play_trimmed", True)])
def test_every_token_trained_is_the_engines_own(engine, tokenizer, agent, edits):
    trajs, rec, _, _ = run_agents(engine, tokenizer, f"{EXAMPLE}:{agent}", episodes=4)
    for i, traj in enumerate(trajs):
        assert traj.failure is Failure.NONE and traj.num_turns == 4
        rids = sorted((r for r in rec.prompts if r.startswith(f"agent{i}-")),
                      key=lambda r: int(r.rsplit("-r", 1)[1]))
        assert len(rids) == traj.num_turns == len(turns(traj))
        for rid, (prompt, sampled, lps) in zip(rids, turns(traj)):
            assert prompt == rec.prompts[rid]  # the prompt the engine was given
            assert sampled == list(rec.replies[rid].token_ids)  # what it sampled
            assert lps == list(rec.replies[rid].logprobs)
        # The trimmed history is an edit on turn 4 (it drops turn 1), flagged, one row a turn.
        assert traj.info["edited_history"] == (1 if edits else 0)
        assert bool(traj.turn_spans) == edits


def misbehave(task):
    """Bad requests first, then one good one; what came back is kept for the test."""
    import httpx

    url, auth = f"{task.base_url}/chat/completions", {"Authorization": f"Bearer {task.api_key}"}
    observation, _ = task.env.reset()
    good = {"messages": [{"role": "user", "content": observation}], "max_tokens": 8}
    sent = {
        "malformed": dict(content=b"{not json", headers={**auth,
                                                         "content-type": "application/json"}),
        "unknown_key": dict(json=good, headers={"Authorization": "Bearer nope"}),
        "oversized": dict(json={"messages": [{"role": "user", "content": "x" * (2 << 20)}]},
                          headers=auth),
        "stream": dict(json={**good, "stream": True}, headers=auth),
        "bad_role": dict(json={"messages": [{"role": "robot", "content": "x"}]}, headers=auth),
        "ok": dict(json=good, headers=auth),
    }
    seen = {name: httpx.post(url, timeout=60, **kw) for name, kw in sent.items()}
    seen["models"] = httpx.get(f"{task.base_url}/models", headers=auth, timeout=60)
    MISBEHAVED[task.api_key] = {k: (r.status_code, r.json()) for k, r in seen.items()}
    return 1.0


def go_away(task):
    """Send a whole request, then close the connection before the reply (a client that
    crashed); the agent fails, as a real one would."""
    observation, _ = task.env.reset()
    body = json.dumps({"messages": [{"role": "user", "content": observation}]}).encode()
    host, port = task.base_url.split("//")[1].split("/")[0].split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                  b"application/json\r\nAuthorization: Bearer " + task.api_key.encode()
                  + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    raise ConnectionError("the agent's connection went away mid-request")


def either(task):
    return go_away(task) if task.seed == 4 else misbehave(task)


def test_bad_requests_get_clear_errors_and_a_vanished_agent_fails_only_its_episode(
        engine, tokenizer):
    import httpx

    trajs, _, eps, endpoint = run_agents(engine, tokenizer, "test_agent_endpoint:either",
                                         episodes=4, keep_open=True)
    try:
        # A finished episode's key is refused: keys are valid while their episode runs.
        late = httpx.post(f"{endpoint.base_url()}/chat/completions", timeout=30,
                          json={"messages": [{"role": "user", "content": "x"}]},
                          headers={"Authorization": f"Bearer {eps[0].session.key}"})
        health = httpx.get(endpoint.base_url().removesuffix("/v1") + "/", timeout=30)
    finally:
        endpoint.close()
    assert late.status_code == 401 and "finished" in late.json()["error"]["message"]
    assert health.json() == {"status": "ok", "episodes": 0}
    for ep, traj in zip(eps, trajs):
        if ep.seed == 4:  # went away: failed, kept, with the reason
            assert traj.failure is Failure.ENV_ERROR
            assert "went away" in traj.info["agent_error"]
            continue
        seen = MISBEHAVED[ep.session.key]
        assert traj.failure is Failure.NONE and traj.num_turns == 1 and traj.reward == 1.0
        want = {"malformed": 400, "unknown_key": 401, "oversized": 413, "stream": 400,
                "bad_role": 400, "ok": 200, "models": 200}
        assert {k: status for k, (status, _) in seen.items()} == want
        for name, (status, body) in seen.items():
            if status != 200:
                assert body["error"]["message"] and body["error"]["code"], name
        assert "messages[0].role" in seen["bad_role"][1]["error"]["message"]
        assert seen["ok"][1]["choices"][0]["message"]["role"] == "assistant"
        assert seen["models"][1]["data"][0]["id"] == "horizonrl"


@pytest.mark.usefixtures("shared_ray")
def test_the_example_agent_trains_through_the_endpoint(tmp_path, tiny_model_path):
    """The whole stack (Ray, the generator's endpoint, gRPC push, DeepSpeed learner) with the
    example agent trimming its history: before any update the learner scores every sampled
    token as the engine recorded it, per turn row; two iterations then train on them."""
    import ray

    from horizonrl.actors.generator import Task
    from horizonrl.cluster.config import load_config
    from horizonrl.cluster.ops.runtime import ray_session
    from horizonrl.cluster.rollout.iteration import make_run_dir
    from horizonrl.cluster.train.driver import Trainer

    cfg = load_config(ROOT / "configs/textcraft-local.yaml", [
        ONE_RANK, "name=agents", "iterations=2", "metrics.port=0", f"run_root={tmp_path}",
        "checkpoint_every=0", f"model.path={tiny_model_path}",
        f"agent.callable={EXAMPLE}:play_concise", "env.in_process=true",
        "env.kwargs={depths: [1]}", "env.replicas_per_actor=8", "generator.tasks_per_step=2",
        "generator.group_size=4", "generator.max_tokens_per_turn=48",
        "curriculum.schedule=fixed", "curriculum.horizons=[4]", "learner.minibatches=1",
        "learner.warmup_steps=0", "eval.every=0",
        "learner.dtype=float32", "generator.dtype=float32"])
    with ray_session(cfg.ray), Trainer(cfg, run_dir=make_run_dir(cfg)) as trainer:
        tasks = [Task(task_id=f"textcraft-{s}", seed=s) for s in (3, 5)]
        report = ray.get(trainer.generators[0].rollout.remote(tasks, group_size=4, step=0))
        trajs = trainer.ingest.drain()
        assert sorted(t.trajectory_id for t in trajs) == sorted(report.trajectory_ids)
        assert len(trajs) == 8 and all(t.info["edited_history"] == 1 for t in trajs)
        rows = [(t, p, s, lps) for t in trajs for p, s, lps in turns(t)]
        scored = trainer.learner.score([p + s for _, p, s, _ in rows])
        worst = max(abs(a - b) for (_, p, s, lps), sc in zip(rows, scored)
                    for a, b in zip(lps, sc[len(p):]))
        print(f"\nmax |engine - learner| = {worst:.2e} over {len(rows)} turn rows")
        assert worst < TOL
        metrics = [trainer.step() for _ in range(2)]
    assert all(m["trajectories_generated"] == 8 for m in metrics)
    led = metrics[-1]["ledger"]
    assert led["reconciled"] and led["generated"] == 16 == led["trained"] + led["dropped_total"]
    updated = [m for m in metrics if m["learner"]["skipped_update"] == 0.0]
    assert updated, "no update: the concise reward gave no group any variance"
    for m in updated:  # the sampler-vs-learner gap on the trained turn rows
        assert m["learner"]["mismatch_log_ratio_abs_max"] < TOL


def slow_concise(task):
    """The example agent (trimmed history, concise reward) with 1 s env steps, so that a
    rollout outlasts an update."""
    import time

    from horizonrl.envpool.agents.textcraft_tools import concise, play

    step = task.env.step
    task.env.step = lambda action: (time.sleep(1.0), step(action))[1]
    return play(task, keep_turns=2, reward=concise)


@pytest.mark.slow  # 45 s: four async steps with 1 s env steps
@pytest.mark.own_ray  # its Ray's workers must start with the PYTHONPATH set below
def test_agent_turns_take_new_weights_in_async_mode(tmp_path, tiny_model_path, monkeypatch):
    """Async training with partial rollouts: an agent's episode in flight gets each newer
    policy at its next request; the staleness bound holds and the ledger reconciles."""
    from horizonrl.cluster.config import load_config
    from horizonrl.cluster.ops.runtime import ray_session
    from horizonrl.cluster.rollout.iteration import make_run_dir
    from horizonrl.cluster.train.driver import Trainer

    # The generator (a Ray worker) imports this module for `agent.callable`.
    here = Path(__file__).parent
    monkeypatch.setenv("PYTHONPATH", f"{here}:{here.parent}")  # and conftest.py, it imports
    cfg = load_config(ROOT / "configs/textcraft-agent.yaml", [
        "name=agents-async", "iterations=4", "metrics.port=0", f"run_root={tmp_path}",
        "checkpoint_every=0", f"model.path={tiny_model_path}", "mode=async",
        "max_staleness=1", "generator.partial_rollouts=true",
        "agent.callable=test_agent_endpoint:slow_concise", "env.kwargs={depths: [1]}",
        "env.replicas_per_actor=8", "generator.tasks_per_step=2", "generator.group_size=4",
        "curriculum.schedule=fixed", "curriculum.horizons=[4]", "learner.minibatches=1",
        "learner.warmup_steps=0", "learner.skip_zero_variance_groups=false", "eval.every=0"])
    with ray_session(cfg.ray), Trainer(cfg, run_dir=make_run_dir(cfg)) as trainer:
        run = async_steps(trainer, cfg.iterations)
    print(f"\nmid-rollout weight loads {run['loads']:.0f}, episodes spanning versions "
          f"{run['spanning']}, lags {sorted(set(run['lags']))}")
    assert all(t.failure is Failure.NONE and t.info["agent"] for t in run["trained"])
    assert run["loads"] >= 1 and run["spanning"] >= 1
    assert max(run["lags"]) <= 1
    assert run["ledger"]["reconciled"]
