"""AgentLoop token bookkeeping on a 3-turn BabyAI conversation (ids compared, not strings).

The engine here is scripted so the expected ids are known exactly; the real vLLM engine runs the
same loop in tests/integration/test_training_loop.py.
"""

from horizonrl.actors.rollout import AgentLoop, run_episode
from horizonrl.envpool.babyai import SYSTEM_PROMPT, BabyAITextEnv, parse_action
from horizonrl.learner.batch import without_invalid_turns
from horizonrl.protos.chat import ChatFormat


def test_three_turn_ids_mask_and_logprobs(tokenizer, scripted_engine):
    chat = ChatFormat(tokenizer)
    end = chat.im_end_id
    t1 = chat.encode("turn left") + [end]
    t2 = chat.encode("move forward")  # cut by max_tokens: no <|im_end|> sampled
    t3 = chat.encode("turn right") + [end]
    engine = scripted_engine([(t1, [-0.1] * len(t1)), (t2, [-0.2] * len(t2)),
                             (t3, [-0.3] * len(t3))])
    env = BabyAITextEnv(level="BabyAI-GoToRedBall-v0")
    loop = AgentLoop(chat=chat, system_prompt=SYSTEM_PROMPT, parse_action=parse_action,
                     horizon=3, max_context_tokens=4096, max_tokens_per_turn=8)
    run_episode(loop, engine, env, seed=7)

    # Rebuild the observations the loop saw from a second env with the same seed.
    env2 = BabyAITextEnv(level="BabyAI-GoToRedBall-v0")
    obs0, _ = env2.reset(seed=7)
    obs1 = env2.step("turn left").observation
    obs2 = env2.step("move forward").observation
    env2.step("turn right")

    assert loop.prompt_ids == chat.prompt_ids(SYSTEM_PROMPT, obs0)
    o1, o2 = chat.observation_ids(obs1), chat.observation_ids(obs2)
    expected = t1 + o1 + t2 + [end] + o2 + t3
    assert loop.response_ids == expected
    mask = [1] * len(t1) + [0] * len(o1) + [1] * len(t2) + [0] + [0] * len(o2) + [1] * len(t3)
    assert loop.response_mask == mask
    lps = ([-0.1] * len(t1) + [0.0] * len(o1) + [-0.2] * len(t2) + [0.0] + [0.0] * len(o2)
           + [-0.3] * len(t3))
    assert loop.response_logprobs == lps
    assert loop.actions == ["turn left", "move forward", "turn right"]
    assert loop.num_turns == 3 and loop.truncated and not loop.terminated
    # Each engine call saw exactly the ids so far: no re-encoding of decoded text.
    assert engine.prompts[1] == loop.prompt_ids + t1 + o1
    assert engine.prompts[2] == loop.prompt_ids + t1 + o1 + t2 + [end] + o2

    # The segments render the same text as the tokenizer's own chat template.
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": obs0},
                {"role": "assistant", "content": "turn left"}, {"role": "user", "content": obs1},
                {"role": "assistant", "content": "move forward"},
                {"role": "user", "content": obs2}, {"role": "assistant", "content": "turn right"}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    assert tokenizer.decode(loop.context_ids) + "\n" == rendered

    traj = loop.to_trajectory(trajectory_id="t", group_id="g", task_id="babyai-7",
                              env_name="babyai", policy_version=0)
    assert traj.response_ids == tuple(expected) and traj.horizon == 3


def test_episode_ends_on_success_before_horizon(tokenizer, scripted_engine):
    chat = ChatFormat(tokenizer)
    env = BabyAITextEnv(level="BabyAI-GoToRedBall-v0")
    for seed in range(200):  # find a start where the red ball is in view (bounded scan)
        _, info = env.reset(seed=seed)
        goal = [a for a in info["available_actions"] if a.startswith("go to red ball")]
        if goal:
            break
    ids = chat.encode(goal[0]) + [chat.im_end_id]
    loop = AgentLoop(chat=chat, system_prompt=SYSTEM_PROMPT, parse_action=parse_action,
                     horizon=5, max_context_tokens=4096, max_tokens_per_turn=8)
    run_episode(loop, scripted_engine([(ids, [-1.0] * len(ids))]), env, seed=seed)
    assert loop.terminated and loop.success and loop.num_turns == 1
    assert loop.rewards == [1.0]


def test_invalid_turns_are_recorded_and_can_leave_the_loss(tokenizer, scripted_engine):
    chat = ChatFormat(tokenizer)
    end = chat.im_end_id
    turns = [chat.encode(a) + [end] for a in ("turn left", "fly to the moon", "turn right")]
    engine = scripted_engine([(t, [-0.1] * len(t)) for t in turns])
    loop = AgentLoop(chat=chat, system_prompt=SYSTEM_PROMPT, parse_action=parse_action,
                     horizon=3, max_context_tokens=4096, max_tokens_per_turn=16)
    run_episode(loop, engine, BabyAITextEnv(level="BabyAI-GoToRedBall-v0"), seed=7)
    traj = loop.to_trajectory(trajectory_id="t", group_id="g", task_id="babyai-7",
                              env_name="babyai", policy_version=0)
    assert traj.info["invalid_turns"] == [1] and traj.info["invalid_actions"] == 1

    masked = without_invalid_turns(traj)
    start = len(turns[0]) + (traj.response_mask.index(1, len(turns[0])) - len(turns[0]))
    changed = [i for i, (a, b) in enumerate(zip(traj.response_mask, masked.response_mask))
               if a != b]
    assert changed == list(range(start, start + len(turns[1])))  # exactly turn 2's tokens
    assert masked.response_ids == traj.response_ids
    assert without_invalid_turns(masked) == masked


def test_state_keys_follow_the_states_each_turn_was_taken_in(tokenizer, scripted_engine):
    """Turn k's key is the state before its action: the env's own `state_key` where it has one,
    else the observation; equal states in two episodes give equal keys (GiGPO's anchors)."""
    from horizonrl.actors.rollout import state_key

    chat = ChatFormat(tokenizer)
    end = chat.im_end_id
    replies = [chat.encode(a) + [end] for a in ("turn left", "turn right", "turn left")]

    def play() -> tuple[list[str], list[str]]:
        engine = scripted_engine([(r, [-0.1] * len(r)) for r in replies])
        env = BabyAITextEnv(level="BabyAI-GoToRedBall-v0")
        loop = AgentLoop(chat=chat, system_prompt=SYSTEM_PROMPT, parse_action=parse_action,
                         horizon=3, max_context_tokens=4096, max_tokens_per_turn=8)
        run_episode(loop, engine, env, seed=7)
        env2 = BabyAITextEnv(level="BabyAI-GoToRedBall-v0")
        obs, info = env2.reset(seed=7)
        seen = [state_key(obs, info)]
        for action in ("turn left", "turn right"):
            step = env2.step(action)
            seen.append(state_key(step.observation, step.info))
        traj = loop.to_trajectory(trajectory_id="t", group_id="g", task_id="babyai-7",
                                  env_name="babyai", policy_version=0)
        return traj.info["state_keys"], seen

    keys, seen = play()
    assert keys == seen and len(keys) == 3
    assert keys[0] == keys[2] != keys[1]  # left then right: back in the opening state
    assert play()[0] == keys
    assert state_key("A  b\nC", None) == state_key("a b c", {}) != state_key("a b d", None)
    assert state_key("whatever", {"state_key": "inv: 1 stick"}) == \
        state_key("other text", {"state_key": "inv: 1 stick"})
