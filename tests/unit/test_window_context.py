"""Window-context episodes: per-turn prompts, per-turn training rows, over-long handling.

The engine is scripted so every id is known; a real BabyAI env answers. The rows are checked
token for token against what the engine was given and what it returned, and the learner's loss
over the rows against the loss over the whole episode in one row, on the tiny model.
"""

import numpy as np
import pytest
import torch

from horizonrl.actors.rollout import AgentLoop, ContextOverflow, run_episode
from horizonrl.envpool.babyai import SYSTEM_PROMPT, BabyAITextEnv, parse_action
from horizonrl.learner.batch import apply_overlong, pad_batch, turn_rows, valid_mask
from horizonrl.learner.config import LearnerConfig
from horizonrl.learner.objectives import policy_objective
from horizonrl.protos.chat import ChatFormat
from horizonrl.protos.codec import decode, encode
from horizonrl.protos.trajectory import Trajectory

ACTIONS = ["turn left", "move forward", "turn right", "turn left", "move forward"]




def _episode(tokenizer, scripted_engine, *, keep_turns, horizon=5, max_context=4096, seed=3):
    chat = ChatFormat(tokenizer)
    turns = []
    for k, a in enumerate(ACTIONS[:horizon]):
        ids = chat.encode(a) + ([chat.im_end_id] if k != 1 else [])  # turn 2 cut by max_tokens
        turns.append((ids, [-0.1 * (k + 1)] * len(ids)))
    engine = scripted_engine(turns)
    loop = AgentLoop(chat=chat, system_prompt=SYSTEM_PROMPT, parse_action=parse_action,
                     horizon=horizon, max_context_tokens=max_context, max_tokens_per_turn=8,
                     keep_turns=keep_turns)
    run_episode(loop, engine, BabyAITextEnv(level="BabyAI-GoToRedBall-v0"), seed=seed)
    traj = loop.to_trajectory(trajectory_id=f"w{keep_turns}", group_id="g", task_id="t",
                              env_name="babyai", policy_version=0)
    return loop, engine, turns, traj


def test_each_row_is_the_windowed_prompt_and_the_sampled_reply(tokenizer, scripted_engine):
    _loop, engine, turns, traj = _episode(tokenizer, scripted_engine, keep_turns=2)
    assert traj.num_turns == 5 and len(traj.turn_spans) == 5
    resp = list(traj.response_ids)
    for k, (ws, ts, te) in enumerate(traj.turn_spans):
        # The prompt of row k is exactly what the engine was given for turn k ...
        assert list(traj.prompt_ids) + resp[ws:ts] == engine.prompts[k]
        # ... which holds the last two turns (each reply and the observation after it).
        first_kept = traj.turn_spans[max(0, k - 2)][1]
        assert ws == first_kept
        # The reply is the engine's ids (plus the closing token a cut turn did not sample).
        ids = turns[k][0]
        assert resp[ts:ts + len(ids)] == ids
        assert traj.response_mask[ts:te] == (1,) * len(ids) + (0,) * (te - ts - len(ids))
    # Earlier turns really left the window: turn 5 did not see turn 1's reply.
    assert len(engine.prompts[4]) < len(traj.prompt_ids) + traj.turn_spans[4][1]

    batch = turn_rows([traj], pad_batch([traj], [0.75], pad_id=0), pad_id=0)
    assert len(batch["input_ids"]) == 5
    for k, (ws, ts, te) in enumerate(traj.turn_spans):
        n = len(traj.prompt_ids) + te - ws
        assert batch["input_ids"][k, :n].tolist() == engine.prompts[k] + resp[ts:te]
        assert batch["attention_mask"][k].sum() == n
        mask = batch["loss_mask"][k]
        p = len(engine.prompts[k])
        assert mask[:p].sum() == 0 and mask[p:n].tolist() == list(traj.response_mask[ts:te])
        assert np.allclose(batch["old_logprobs"][k, p:n], traj.response_logprobs[ts:te])
        # Every row carries the episode's one advantage on its model tokens.
        assert set(batch["advantages"][k][mask > 0].tolist()) == {0.75}
    # Every model token is trained in exactly one row, and the shares make one episode.
    assert batch["loss_mask"].sum() == sum(traj.response_mask)
    assert batch["row_share"].sum() == pytest.approx(1.0)


def test_window_at_least_the_horizon_is_the_full_context(tokenizer, scripted_engine):
    _, full_engine, _, full = _episode(tokenizer, scripted_engine, keep_turns=None)
    _, win_engine, _, win = _episode(tokenizer, scripted_engine, keep_turns=5)
    assert full.turn_spans == () and len(win.turn_spans) == 5
    assert full_engine.prompts == win_engine.prompts
    assert full.response_ids == win.response_ids


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_rows_give_the_full_context_loss(tokenizer, tiny_model_path, agg, scripted_engine):
    """With K >= horizon, the per-turn rows of two episodes train on exactly the numbers the
    two whole episodes give, in every aggregation mode (turn_rows' row_scale/row_share)."""
    from transformers import AutoModelForCausalLM

    _, _, _, full_a = _episode(tokenizer, scripted_engine, keep_turns=None, seed=3)
    _, _, _, win_a = _episode(tokenizer, scripted_engine, keep_turns=5, seed=3)
    _, _, _, full_b = _episode(tokenizer, scripted_engine, keep_turns=None, horizon=2, seed=4)
    _, _, _, win_b = _episode(tokenizer, scripted_engine, keep_turns=5, horizon=2, seed=4)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()
    cfg = LearnerConfig(loss_agg=agg, kl_coef=0.0)

    def loss(batch):
        t = {k: torch.from_numpy(v) for k, v in batch.items()}
        with torch.no_grad():
            logits = model(input_ids=t["input_ids"]).logits
        return policy_objective(logits, t, cfg, ref_logprobs=None)[0].item()

    adv = [1.5, -0.5]
    whole = loss(pad_batch([full_a, full_b], adv, pad_id=0))
    rows = loss(turn_rows([win_a, win_b], pad_batch([win_a, win_b], adv, pad_id=0), pad_id=0))
    assert rows == pytest.approx(whole, rel=1e-4, abs=1e-6)
    assert whole != 0.0


def test_window_shrinks_to_fit_and_a_turn_that_cannot_fit_ends_the_episode(
        tokenizer, scripted_engine, capsys):
    _loop, engine, _, _traj = _episode(tokenizer, scripted_engine, keep_turns=5)
    # The same episode in a context just big enough for the prompt and about two turns.
    budget = len(engine.prompts[2]) + 8
    _small, small_engine, _, small_traj = _episode(tokenizer, scripted_engine, keep_turns=5,
                                                   max_context=budget)
    assert all(len(p) + 8 <= budget for p in small_engine.prompts)
    assert small_traj.num_turns == 5 and small_traj.cut == "horizon"
    assert [s[0] for s in small_traj.turn_spans][3:] != [0, 0]  # older turns dropped
    # Full mode in that context ends the episode cut by the context instead.
    _full, _, _, full_traj = _episode(tokenizer, scripted_engine, keep_turns=None,
                                      max_context=budget)
    assert full_traj.cut == "context" and full_traj.num_turns < 5
    # A context without room for the newest turn: cut, with the numbers in the message.
    _tight, _, _, tight_traj = _episode(tokenizer, scripted_engine, keep_turns=2,
                                       max_context=len(engine.prompts[0]) + 8)
    assert tight_traj.cut == "context" and tight_traj.num_turns == 1
    assert "max_context_tokens=" in tight_traj.info["context_error"]
    # The driver says so on the console once per run (actor output stays in Ray's logs).
    from types import SimpleNamespace

    from horizonrl.cluster.train.driver import Trainer

    trainer = SimpleNamespace(_context_warned=False)
    for _ in range(2):
        Trainer._warn_context(trainer, [full_traj, tight_traj])
    out = capsys.readouterr().out
    assert out.count("an episode ended because") == 1
    assert tight_traj.info["context_error"] in out or full_traj.info["context_error"] in out


def test_first_turn_that_cannot_fit_is_a_clear_error(tokenizer, scripted_engine):
    with pytest.raises(ContextOverflow, match=r"prompt tokens .* > generator.max_context_tokens"):
        _episode(tokenizer, scripted_engine, keep_turns=2, max_context=64)


def test_turn_spans_travel_and_bad_spans_are_rejected(tokenizer, scripted_engine):
    _, _, _, traj = _episode(tokenizer, scripted_engine, keep_turns=2)
    assert decode(encode(traj)).turn_spans == traj.turn_spans
    fields = {f: getattr(traj, f) for f in traj.__dataclass_fields__}
    with pytest.raises(ValueError, match="turn span 1"):
        Trajectory(**{**fields, "turn_spans": (traj.turn_spans[1], traj.turn_spans[0])})
    with pytest.raises(ValueError, match="turn span 0"):
        Trajectory(**{**fields, "turn_spans": ((0, 5, 10 ** 6),)})


def test_overlong_modes(tokenizer, scripted_engine):
    _, _, _, cut = _episode(tokenizer, scripted_engine, keep_turns=2)  # runs out of turns
    fields = {f: getattr(cut, f) for f in cut.__dataclass_fields__}
    ended = Trajectory(**{**fields, "trajectory_id": "e", "info": {"success": True},
                          "reward": 1.0, "terminated": True, "truncated": False})
    assert cut.cut == "horizon" and ended.cut is None
    assert apply_overlong([cut, ended], "train", 0.5) == [cut, ended]
    masked = apply_overlong([cut, ended], "mask", 0.5)
    assert valid_mask(masked).tolist() == [False, True]
    pen = apply_overlong([cut, ended], "penalty", 0.25)
    assert [t.reward for t in pen] == [cut.reward - 0.25, 1.0]
    assert pen[0].info["env_reward"] == cut.reward


def test_window_rejects_the_learners_that_need_whole_episodes():
    from horizonrl.cluster.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"context.mode=window .*algorithm=rejection_sampling"):
        load_config(None, ["generator.context.mode=window", "learner.algorithm=rejection_sampling"])
    # PPO trains window rows with one value per turn (learner.objectives.turn_gae_targets).
    for algo in ("ppo", "gigpo", "turn_rloo"):
        assert load_config(None, ["generator.context.mode=window",
                                  f"learner.algorithm={algo}"]).learner.algorithm == algo
    assert load_config(None, ["generator.context.mode=window"]).generator.context.keep_turns == 4
