"""Partial rollouts without Ray: the board's posts, per-turn policy versions in the agent loop,
the trajectory and its wire format, the horizon rule for episodes in flight, the per-turn
staleness bound, and the independent loop's switch (generations in flight finish on the old
weights, the held turns go out on the new). The real engine and learner run it in
tests/integration/test_partial_rollouts.py."""

from __future__ import annotations

import pytest
from test_episodes import StaggeredEngine  # the same dir's stand-in

from horizonrl.actors.curriculum import HorizonSetting
from horizonrl.actors.episodes import Episode, IndependentEpisodes
from horizonrl.actors.policy_board import CLOSED, PolicyBoard, PolicyFeed
from horizonrl.actors.rollout import AgentLoop, Completion
from horizonrl.cluster.train.async_phase import split_stale
from horizonrl.envpool.babyai import SYSTEM_PROMPT, parse_action
from horizonrl.envpool.base import StepResult
from horizonrl.envpool.config import EnvConfig
from horizonrl.envpool.pool import EnvPool
from horizonrl.protos.chat import ChatFormat
from horizonrl.protos.codec import decode, encode
from horizonrl.protos.trajectory import Trajectory


def _loop(chat, horizon=4):
    return AgentLoop(chat=chat, system_prompt=SYSTEM_PROMPT, parse_action=parse_action,
                     horizon=horizon, max_context_tokens=4096, max_tokens_per_turn=8)


def _turn(loop, chat, reward=0.0):
    reply = chat.encode("turn left") + [chat.im_end_id]
    loop.add_model_turn(Completion(tuple(reply), (-0.5,) * len(reply), "stop"))
    loop.add_env_result(StepResult("You see a wall.", reward, False, False, {}))


def test_board_keeps_the_newest_version_and_setting():
    board = PolicyBoard()
    assert board.news(0, 0) is None
    board.post(2, ["w2"], HorizonSetting(10, 1))
    assert board.news(1, 0) == (2, ["w2"], HorizonSetting(10, 1), None)
    assert board.news(2, 1) is None  # nothing newer than what the generator holds
    board.post(1, ["w1"], HorizonSetting(5, 0))  # older: ignored
    assert board.news(0, 0)[:2] == (2, ["w2"])
    board.post(3, [], HorizonSetting(20, 2))  # a setting alone leaves the weights
    assert board.news(2, 1) == (2, [], HorizonSetting(20, 2), None)
    feed = PolicyFeed(board, version=1, horizon_version=1)
    assert feed.pending() and feed.take() == (2, "w2", HorizonSetting(20, 2))
    assert not feed.pending()  # it holds both now


def test_the_frontier_admits_steps_up_to_it_and_needs_no_reload():
    board = PolicyBoard()
    feed = PolicyFeed(board, version=0, horizon_version=0)
    assert not feed.pending() and feed.admits(50)  # no frontier posted: no bound
    board.admit(3)
    assert board.news(0, 0, 3) is None  # the generator knows it already
    assert not feed.pending()  # a frontier alone is kept at once, nothing to take
    assert feed.frontier == 3 and feed.admits(3) and not feed.admits(4)
    assert feed.admits(None)  # a task outside the step count (evaluation)
    board.post(1, ["w1"], None)
    board.admit(4)
    assert feed.pending() and feed.frontier == 4 and feed.take()[0] == 1
    board.admit(CLOSED)
    assert not feed.pending() and feed.closed and not feed.admits(0)


def test_turns_record_their_version_and_the_oldest_is_the_episodes(tokenizer):
    chat = ChatFormat(tokenizer)
    loop = _loop(chat)
    loop.start("You see a red ball.")
    loop.new_policy(3)
    _turn(loop, chat)
    loop.new_policy(4)
    _turn(loop, chat)
    t = loop.to_trajectory(trajectory_id="x", group_id="g", task_id="t", env_name="babyai",
                           policy_version=3)
    assert t.turn_versions == (3, 4) and t.policy_version == 3
    assert [t.version_of_turn(k) for k in range(2)] == [3, 4]
    assert decode(encode(t)).turn_versions == (3, 4)  # the wire format carries them
    one = _loop(chat)
    one.start("You see a red ball.")
    one.new_policy(5)
    _turn(one, chat)
    u = one.to_trajectory(trajectory_id="y", group_id="g", task_id="t", env_name="babyai",
                          policy_version=4)
    assert u.turn_versions == () and u.policy_version == 5 and u.version_of_turn(0) == 5


def test_trajectory_rejects_turn_versions_that_do_not_fit():
    base = dict(trajectory_id="x", group_id="g", task_id="t", env_name="e", horizon=4,
                prompt_ids=(1,), response_ids=(), response_mask=(), response_logprobs=(),
                rewards=(0.0, 0.0), reward=0.0, num_turns=2, terminated=True, truncated=False)
    Trajectory(policy_version=3, turn_versions=(3, 4), **base)
    with pytest.raises(ValueError, match="turn_versions"):
        Trajectory(policy_version=4, turn_versions=(3, 4), **base)  # not the oldest
    with pytest.raises(ValueError, match="turn_versions"):
        Trajectory(policy_version=3, turn_versions=(3,), **base)  # one per turn


def test_a_new_horizon_never_falls_below_the_turns_taken(tokenizer):
    chat = ChatFormat(tokenizer)
    loop = _loop(chat, horizon=3)
    loop.start("You see a red ball.")
    _turn(loop, chat)
    _turn(loop, chat)
    loop.new_policy(1, horizon=1)  # lowered below the 2 turns taken: the next one still runs
    assert loop.horizon == 3 and not loop.done
    loop.new_policy(1, horizon=6)  # raised: the episode may go on to 6
    assert loop.horizon == 6
    _turn(loop, chat)
    assert not loop.done and loop.num_turns == 3


def test_staleness_counts_the_oldest_turn():
    base = dict(group_id="g", task_id="t", env_name="e", horizon=4, prompt_ids=(1,),
                response_ids=(), response_mask=(), response_logprobs=(), rewards=(0.0, 0.0),
                reward=0.0, num_turns=2, terminated=True, truncated=False)
    mixed = Trajectory(trajectory_id="mixed", policy_version=3, turn_versions=(3, 5), **base)
    fresh = Trajectory(trajectory_id="fresh", policy_version=4, turn_versions=(4, 5), **base)
    keep, stale = split_stale([mixed, fresh], version=5, max_staleness=1)
    assert [t.trajectory_id for t in keep] == ["fresh"]
    assert [t.trajectory_id for t in stale] == ["mixed"]  # its first turn is 2 versions behind


class VersionedEngine(StaggeredEngine):
    """StaggeredEngine whose reply's logprobs say which weights it was sampled with
    (-(1 + version)); raises if the weights change while a request is in flight."""

    def __init__(self, reply):
        super().__init__(reply)
        self.version, self.sampled_by = 0, {}

    def submit(self, request_id, prompt, *, max_tokens, temperature):
        super().submit(request_id, prompt, max_tokens=max_tokens, temperature=temperature)
        self.sampled_by[request_id] = self.version

    def finish(self, request_id):
        v = self.sampled_by.pop(request_id)
        assert v == self.version, "a turn was sampled across a weight change"
        return Completion(tuple(self.reply), (-(1.0 + v),) * len(self.reply), "stop")


def test_independent_loop_switches_weights_between_turns_only(tokenizer):
    chat = ChatFormat(tokenizer)
    reply = chat.encode("turn left") + [chat.im_end_id]
    engine = VersionedEngine(reply)
    pool = EnvPool(EnvConfig(kwargs={"level": "BabyAI-GoToRedBall-v0"}, in_process=True,
                             replicas_per_actor=6), name="test-partial")
    pool.wait_ready()
    eps = [Episode(i, "babyai", 100 + i, _loop(chat, horizon=5)) for i in range(6)]
    for ep in eps:
        ep.loop.new_policy(0)
    asks = {"n": 0}
    switches = []

    def news():  # the second version is posted after a few checks
        asks["n"] += 1
        return asks["n"] in (4, 9)

    def take_news():
        assert not engine.busy()
        engine.version += 1
        switches.append(engine.version)
        for ep in eps:
            if not ep.loop.done:
                ep.loop.new_policy(engine.version, horizon=6 if engine.version == 2 else None)

    runner = IndependentEpisodes(engine, {"babyai": pool}, max_tokens=8, temperature=1.0,
                                 max_in_flight=6, on_done=lambda done: None, news=news,
                                 take_news=take_news)
    runner.run(eps)
    assert switches == [1, 2]
    spanning = 0
    for ep in eps:
        loop = ep.loop
        model_lps = [lp for lp, m in zip(loop.response_logprobs, loop.response_mask) if m]
        per_turn = [model_lps[k * len(reply)] for k in range(loop.num_turns)]
        # Each turn's logprobs came from the weights of the version the turn recorded.
        assert per_turn == [-(1.0 + v) for v in loop.turn_versions]
        assert loop.turn_versions == sorted(loop.turn_versions)
        spanning += len(set(loop.turn_versions)) > 1
    assert spanning >= 1
    assert any(ep.loop.num_turns == 6 for ep in eps)  # the raised horizon reached them


def test_independent_loop_starts_an_episode_only_once_the_frontier_reaches_its_step(tokenizer):
    chat = ChatFormat(tokenizer)
    reply = chat.encode("turn left") + [chat.im_end_id]
    pool = EnvPool(EnvConfig(kwargs={"level": "BabyAI-GoToRedBall-v0"}, in_process=True,
                             replicas_per_actor=6), name="test-frontier")
    pool.wait_ready()
    # Two episodes of each of steps 0, 1, 2; room for all six at once without the bound.
    eps = [Episode(i, "babyai", 100 + i, _loop(chat, horizon=3), step=i // 2) for i in range(6)]
    board = PolicyBoard()
    board.admit(0)
    feed = PolicyFeed(board, version=0, horizon_version=0)
    done: list[int] = []
    started_early: list[int] = []

    def on_done(batch):
        done.extend(ep.index for ep in batch)
        # Both of step 0's episodes: they may finish in different batches (a loaded machine).
        if all(e.index in done for e in eps if e.step == 0) and board.frontier == 0:
            # Step 0 is over; nothing of step 1 may have started before the frontier moved.
            started_early.extend(ep.index for ep in eps if ep.step == 1 and ep.loop.prompt_ids)
            board.admit(1)
        elif all(e.index in done for e in eps if e.step == 1):
            board.admit(CLOSED)  # the run ends: step 2 never starts

    runner = IndependentEpisodes(StaggeredEngine(reply), {"babyai": pool}, max_tokens=8,
                                 temperature=1.0, max_in_flight=6, on_done=on_done,
                                 news=feed.pending, take_news=lambda: None,
                                 admit=feed.admits, closed=lambda: feed.closed)
    runner.run(eps)
    assert started_early == []
    assert sorted(done) == [0, 1, 2, 3]  # step 2's episodes never started, none was lost
    assert not eps[4].loop.prompt_ids and not eps[5].loop.prompt_ids
    assert runner.tally.peak_in_flight == 2 and pool.free_replicas() == 6
