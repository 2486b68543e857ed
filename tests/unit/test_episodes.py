"""Episodes that run independently (actors/episodes.py), without Ray: in-process env pools of
real BabyAI replicas and a continuous-batching stand-in whose replies finish after 1-3 engine
steps, so episodes drift apart as they would over vLLM. The real engine runs the same loop in
tests/integration/test_independent_loop.py."""

from __future__ import annotations

import pytest

from horizonrl.actors.episodes import BatchSteps, Episode, IndependentEpisodes
from horizonrl.actors.rollout import AgentLoop, Completion
from horizonrl.envpool.babyai import SYSTEM_PROMPT, BabyAITextEnv, parse_action
from horizonrl.envpool.config import EnvConfig
from horizonrl.envpool.pool import EnvPool
from horizonrl.protos.chat import ChatFormat
from horizonrl.protos.trajectory import Failure


class StaggeredEngine:
    """Request n finishes after 1 + n % 3 steps with the same reply; counts what it holds.
    `finish(request_id)` makes the reply (subclasses stamp it: test_turn_versions.py)."""

    def __init__(self, reply: list[int]) -> None:
        self.reply, self.live, self.prompts, self.n, self.peak = reply, {}, {}, 0, 0

    def submit(self, request_id, prompt, *, max_tokens, temperature):
        self.live[request_id] = 1 + self.n % 3
        self.prompts[request_id] = list(prompt)
        self.n += 1
        self.peak = max(self.peak, len(self.live))

    def finish(self, request_id) -> Completion:
        return Completion(tuple(self.reply), (-0.5,) * len(self.reply), "stop")

    def step(self):
        out = []
        for rid in list(self.live):
            self.live[rid] -= 1
            if self.live[rid] == 0:
                del self.live[rid]
                out.append((rid, self.finish(rid)))
        return out

    def busy(self):
        return bool(self.live)

    def abort(self, request_ids):
        for rid in request_ids:
            self.live.pop(rid, None)


def _pool(name="babyai", kwargs=None, **over) -> EnvPool:
    cfg = EnvConfig(name=name, kwargs=kwargs or {"level": "BabyAI-GoToRedBall-v0"},
                    in_process=True, **over)
    pool = EnvPool(cfg, name=f"test-{name}")
    pool.wait_ready()
    return pool


def _episodes(chat, n, key="babyai", horizon=3):
    return [Episode(i, key, 100 + i // 2, AgentLoop(
        chat=chat, system_prompt=SYSTEM_PROMPT, parse_action=parse_action, horizon=horizon,
        max_context_tokens=4096, max_tokens_per_turn=8)) for i in range(n)]


def test_every_episode_finishes_with_exact_ids_under_the_bound(tokenizer):
    chat = ChatFormat(tokenizer)
    reply = chat.encode("turn left") + [chat.im_end_id]
    engine = StaggeredEngine(reply)
    pool = _pool(replicas_per_actor=6)
    done_batches = []
    runner = IndependentEpisodes(engine, {"babyai": pool}, max_tokens=8, temperature=1.0,
                                 max_in_flight=4, on_done=done_batches.append)
    eps = _episodes(chat, 10)
    tally = runner.run(eps)

    finished = [ep.index for batch in done_batches for ep in batch]
    assert sorted(finished) == list(range(10))  # each once
    assert tally.peak_in_flight == 4 and engine.peak <= 4  # the bound holds, and is reached
    assert pool.free_replicas() == 6  # every replica back
    assert len(done_batches) > 1  # pushed as they finished, not all at the end
    for ep in eps:
        loop = ep.loop
        assert loop.failure is Failure.NONE and loop.done
        # The same seed and actions on a fresh env give exactly the ids the loop holds.
        env = BabyAITextEnv(level="BabyAI-GoToRedBall-v0")
        obs, _ = env.reset(seed=ep.seed)
        assert loop.prompt_ids == chat.prompt_ids(SYSTEM_PROMPT, obs)
        expected, mask = [], []
        for n, action in enumerate(loop.actions):
            assert action == "turn left"
            expected += reply
            mask += [1] * len(reply)
            res = env.step(action)
            if n + 1 < loop.num_turns:
                o = chat.observation_ids(res.observation)
                expected += o
                mask += [0] * len(o)
        assert loop.response_ids == expected and loop.response_mask == mask
        assert [lp for lp, m in zip(loop.response_logprobs, mask) if m] == [-0.5] * sum(mask)
    assert tally.env_steps == sum(ep.loop.num_turns for ep in eps)


def test_a_hung_env_fails_only_its_own_episode(tokenizer, tmp_path):
    chat = ChatFormat(tokenizer)
    reply = chat.encode("turn left") + [chat.im_end_id]
    # One replica per env worker: the hung worker is rebuilt without touching the others.
    pool = _pool("faulty", {"env": "babyai", "env_kwargs": {"level": "BabyAI-GoToRedBall-v0"},
                            "fault": "sleep", "at_step": 1, "sleep_s": 3.0,
                            "once_file": str(tmp_path / "fired")},
                 num_actors=6, replicas_per_actor=1, call_timeout_s=1.5)
    done = []
    runner = IndependentEpisodes(StaggeredEngine(reply), {"faulty": pool}, max_tokens=8,
                                 temperature=1.0, max_in_flight=6, on_done=done.extend)
    eps = _episodes(chat, 6, key="faulty")
    runner.run(eps)
    failures = [ep.loop.failure for ep in eps]
    assert failures.count(Failure.TIMEOUT) == 1, failures
    assert failures.count(Failure.NONE) == 5
    assert all(ep.loop.num_turns == ep.loop.horizon or ep.loop.terminated
               for ep in eps if ep.loop.failure is Failure.NONE)
    assert pool.restarts == 1 and len(done) == 6


def test_a_batch_only_engine_runs_through_batch_steps(tokenizer, scripted_engine):
    chat = ChatFormat(tokenizer)
    reply = chat.encode("turn left") + [chat.im_end_id]
    engine = scripted_engine([(reply, [-0.1] * len(reply))] * 2)
    runner = IndependentEpisodes(engine, {"babyai": _pool(replicas_per_actor=1)}, max_tokens=8,
                                 temperature=1.0, max_in_flight=1, on_done=lambda eps: None)
    assert isinstance(runner.engine, BatchSteps)
    (ep,) = _episodes(chat, 1, horizon=2)
    runner.run([ep])
    assert ep.loop.actions == ["turn left", "turn left"] and engine.prompts[1] == \
        ep.loop.prompt_ids + ep.loop.response_ids[:len(engine.prompts[1]) - len(ep.loop.prompt_ids)]


def test_the_bound_must_be_positive(tokenizer):
    with pytest.raises(ValueError, match="max_in_flight must be >= 1"):
        IndependentEpisodes(StaggeredEngine([1]), {}, max_tokens=8, temperature=1.0,
                            max_in_flight=0, on_done=lambda eps: None)


def test_one_tally_serves_both_loops():
    """The lock-step loop counts into a Tally directly; the independent loop's Tally is added."""
    from horizonrl.actors.episodes import Tally
    from horizonrl.protos.reports import RolloutSeconds

    rollout = Tally(generate=1.0, env=0.5, transport=0.25, generated_tokens=10, env_steps=2)
    rollout.add(Tally(generate=2.0, overlap=0.75, prompt_tokens=7, cached_tokens=3,
                      env_steps=5, peak_in_flight=4))
    assert rollout.seconds() == RolloutSeconds(generate=3.0, env=0.5, transport=0.25,
                                               overlap=0.75)
    assert rollout.counts() == {"generated_tokens": 10, "prompt_tokens": 7, "cached_tokens": 3,
                                "env_steps": 7}
    assert rollout.peak_in_flight == 4
