"""The exact-token rule of the agent endpoint's sessions, on a scripted engine's replies: a
request that extends the history is prompted from the kept ids plus the new messages' tokens;
an edited one is re-tokenised, flagged, and trains one row per turn from the prompt each turn
was really sampled from."""

from __future__ import annotations

import pytest

from horizonrl.actors.agent_sessions import AgentRequestError, AgentSession
from horizonrl.actors.rollout import Completion
from horizonrl.actors.tool_calls import parse_hermes
from horizonrl.envpool.agent_worker import AgentOutcome
from horizonrl.protos.chat import ChatFormat
from horizonrl.protos.messages import Renderer
from horizonrl.protos.trajectory import Failure

TOOLS = [{"type": "function", "function": {"name": "get", "parameters": {"type": "object"}}}]
SYSTEM = {"role": "system", "content": "You craft items."}
TASK = {"role": "user", "content": "Goal: craft 4 oak planks."}


@pytest.fixture()
def session(tokenizer):
    chat = ChatFormat(tokenizer)
    return AgentSession(renderer=Renderer(tokenizer), parser=parse_hermes, horizon=4,
                        max_context_tokens=4096, max_tokens=64, version=3,
                        end_id=chat.im_end_id)


def reply(session, text, *, closed=True, lp=-0.5):
    ids = session.renderer.encode(text) + ([session.end_id] if closed else [])
    return session.complete(Completion(tuple(ids), tuple([lp] * len(ids)),
                                       "stop" if closed else "length")), ids


def turn_context(traj, k):
    ws, ts, te = traj.turn_spans[k]
    return list(traj.prompt_ids + traj.response_ids[ws:ts]), list(traj.response_ids[ts:te])


def test_a_history_that_grows_is_prompted_from_the_kept_ids(session, tokenizer):
    messages = [SYSTEM, TASK]
    p1, _ = session.prompt({"messages": messages, "tools": TOOLS})
    assert p1 == session.renderer.ids(messages, TOOLS)
    # The model writes a call with its own spacing; the client echoes it re-serialised.
    out, s1 = reply(session, 'Logs. <tool_call>{"name":"get","arguments":{"item":"oak logs"}}'
                             "</tool_call>")
    msg = out["choices"][0]["message"]
    assert out["choices"][0]["finish_reason"] == "tool_calls"
    assert msg["tool_calls"][0]["function"]["arguments"] == '{"item": "oak logs"}'
    messages = [*messages, msg, {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"],
                                 "content": "Got 1 oak logs"}]
    p2, _ = session.prompt({"messages": messages, "tools": TOOLS})
    new = session.renderer.continuation(messages[:3], messages[3:], TOOLS)
    assert p2 == p1 + s1 + new  # nothing sampled was re-encoded
    # The kept prompt reads as the template renders the history (the model's own spacing).
    text = tokenizer.decode(p2)
    assert text.endswith(tokenizer.apply_chat_template(messages[3:], tokenize=False,
                                                       add_generation_prompt=True))
    _, s2 = reply(session, "Action: inventory", closed=False)  # cut by max_tokens
    traj = session.trajectory(AgentOutcome(reward=1.0, success=True), Failure.NONE,
                              trajectory_id="t", group_id="g", task_id="x", env_name="e",
                              info={})
    assert traj.turn_spans == () and traj.info["edited_history"] == 0
    assert list(traj.prompt_ids) == p1
    resp = list(traj.response_ids)
    assert resp == s1 + new + s2 + [session.end_id]
    assert traj.response_mask == tuple([1] * len(s1) + [0] * len(new) + [1] * len(s2) + [0])
    assert traj.response_logprobs[:len(s1)] == tuple([-0.5] * len(s1))
    assert traj.rewards == (0.0, 1.0) and traj.terminated and traj.info["success"]
    assert traj.policy_version == 3 and traj.num_turns == 2


def test_an_edited_history_is_flagged_and_each_turn_keeps_its_own_prompt(session):
    p1, _ = session.prompt({"messages": [SYSTEM, TASK]})
    out1, s1 = reply(session, "Action: get 1 oak logs")
    m1 = out1["choices"][0]["message"]
    obs1 = {"role": "user", "content": "Got 1 oak logs."}
    p2, _ = session.prompt({"messages": [SYSTEM, TASK, m1, obs1]})
    out2, s2 = reply(session, "Action: inventory")
    m2 = out2["choices"][0]["message"]
    # The agent trims its history: the first exchange is gone.
    obs2 = {"role": "user", "content": "Inventory: 1 oak logs."}
    trimmed = [SYSTEM, TASK, m2, obs2]
    p3, _ = session.prompt({"messages": trimmed})
    assert p3 == session.renderer.ids(trimmed) and session.edits == 1
    _, s3 = reply(session, "Action: craft 4 oak planks using 1 oak logs")
    traj = session.trajectory(AgentOutcome(reward=0.0, terminated=False), Failure.NONE,
                              trajectory_id="t", group_id="g", task_id="x", env_name="e",
                              info={})
    assert traj.info["edited_history"] == 1 and len(traj.turn_spans) == 3
    for k, (prompt, sampled) in enumerate([(p1, s1), (p2, s2), (p3, s3)]):
        assert turn_context(traj, k) == (prompt, sampled)
    assert sum(traj.response_mask) == len(s1) + len(s2) + len(s3)
    assert traj.truncated and not traj.terminated


def test_horizon_context_and_one_request_at_a_time(session):
    session.prompt({"messages": [SYSTEM, TASK]})
    with pytest.raises(AgentRequestError) as exc:
        session.prompt({"messages": [SYSTEM, TASK]})
    assert exc.value.status == 409
    for _ in range(4):
        reply(session, "Action: inventory")
        session.pending = None
        if len(session.turns) < 4:
            session.prompt({"messages": [SYSTEM, TASK]})
    with pytest.raises(AgentRequestError) as exc:
        session.prompt({"messages": [SYSTEM, TASK]})
    assert exc.value.code == "horizon_reached" and session.cut == "horizon"
    traj = session.trajectory(AgentOutcome(reward=0.0), Failure.NONE, trajectory_id="t",
                              group_id="g", task_id="x", env_name="e", info={})
    assert traj.truncated and traj.info["cut"] == "horizon" and traj.num_turns == 4


def test_bad_requests_are_clear_errors(tokenizer):
    chat = ChatFormat(tokenizer)
    small = AgentSession(renderer=Renderer(tokenizer), parser=parse_hermes, horizon=4,
                         max_context_tokens=64, max_tokens=32, version=0,
                         end_id=chat.im_end_id)
    for body, code in [({"messages": []}, "invalid_messages"),
                       ({"messages": [{"role": "robot", "content": "x"}]}, "invalid_messages"),
                       ({"messages": [TASK], "tool_choice": "required"}, "invalid_tool_choice"),
                       ({"messages": [SYSTEM, {"role": "user", "content": "word " * 80}]},
                        "context_length_exceeded")]:
        with pytest.raises(AgentRequestError) as exc:
            small.prompt(body)
        assert exc.value.code == code and exc.value.status == 400
    traj = small.trajectory(None, Failure.ENV_ERROR, trajectory_id="t", group_id="g",
                            task_id="x", env_name="e", info={"agent_error": "boom"})
    assert traj.failure is Failure.ENV_ERROR and traj.num_turns == 0


def test_a_malformed_call_is_an_invalid_turn_with_the_parsers_message(session):
    session.prompt({"messages": [SYSTEM, TASK], "tools": TOOLS})
    out, _ = reply(session, '<tool_call>{"name": "get", "arguments": ')
    assert out["choices"][0]["message"] == {"role": "assistant", "content":
                                            '<tool_call>{"name": "get", "arguments": '}
    assert "not closed" in out["horizonrl"]["invalid_tool_call"]
    traj = session.trajectory(AgentOutcome(reward=0.0), Failure.NONE, trajectory_id="t",
                              group_id="g", task_id="x", env_name="e", info={})
    assert traj.info["invalid_turns"] == [0] and traj.info["invalid_actions"] == 1
    assert "not closed" in traj.info["invalid_tool_calls"][0]


def test_asking_again_with_nothing_new_extends_the_kept_ids(session):
    p1, _ = session.prompt({"messages": [SYSTEM, TASK]})
    out, s1 = reply(session, "Let me think.")
    again = [SYSTEM, TASK, out["choices"][0]["message"]]
    p2, _ = session.prompt({"messages": again})
    assert p2 == p1 + s1 + session.renderer.continuation(again, [])
    assert session.edits == 0


def test_env_rejected_steps_count_as_invalid_actions(session):
    session.prompt({"messages": [SYSTEM, TASK]})
    reply(session, "Action: get 8 planks")
    traj = session.trajectory(AgentOutcome(reward=0.0, info={"env_invalid_steps": 3}),
                              Failure.NONE, trajectory_id="t", group_id="g", task_id="x",
                              env_name="e", info={})
    assert traj.info["invalid_actions"] == 1  # capped at the turns taken
    assert traj.info["invalid_turns"] == []  # no malformed call
