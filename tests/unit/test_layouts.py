"""learner.layout: padded, bucketed, packed and shared-prefix micro-batches give the padded
path's loss and gradients, on fixed batches of mixed lengths and window-mode turn rows dealt to
2 ranks, for every loss aggregation.

The ranks are run one after the other in this process on one float32 Qwen2 model, as a
DeepSpeed step sums them: each micro-batch's loss times its units over the step's (times the
world size, which DeepSpeed's gradient average takes back), gradients accumulated.
"""

import numpy as np
import pytest
import torch

from horizonrl.learner.batch import pad_batch, shard_episodes, split_minibatches, trim, turn_rows
from horizonrl.learner.config import LearnerConfig
from horizonrl.learner.layout import (
    computed_tokens,
    plan_micro_batches,
    rank_plan,
    shared_prefix_length,
    token_logprobs_by_layout,
)
from horizonrl.learner.objectives import policy_loss
from horizonrl.protos.trajectory import Trajectory

AGGREGATIONS = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]
RANKS = 2


def _episode(rng: np.random.Generator, k: int, *, prompt: list[int], turns: int,
             window: int | None) -> Trajectory:
    """`turns` turns of a reply (mask 1) then an observation (mask 0), random lengths; with
    `window`, the turn spans of a K-turn sliding window."""
    resp, mask, starts, ends = [], [], [], []
    for _ in range(turns):
        reply, obs = int(rng.integers(2, 7)), int(rng.integers(3, 12))
        starts.append(len(resp))
        resp += rng.integers(4, 60, size=reply).tolist()
        ends.append(len(resp))
        resp += rng.integers(4, 60, size=obs).tolist()
        mask += [1] * reply + [0] * obs
    spans = () if window is None else tuple(
        (starts[max(0, j - window + 1)], starts[j], ends[j] if j == turns - 1 else starts[j + 1])
        for j in range(turns))
    return Trajectory(
        trajectory_id=f"e{k}", group_id=f"g{k // 2}", task_id=f"t{k // 2}", env_name="test",
        policy_version=0, horizon=turns, prompt_ids=tuple(prompt), response_ids=tuple(resp),
        response_mask=tuple(mask), response_logprobs=tuple(rng.normal(-2, 0.3, len(resp))),
        rewards=(0.0,) * turns, reward=float(k % 2), num_turns=turns, terminated=True,
        truncated=False, turn_spans=spans)


def _batch(window: int | None, agg: str) -> tuple[dict[str, np.ndarray], list[int]]:
    rng = np.random.default_rng(7)
    trajs = []
    for k in range(6):  # prompts of 9-30 tokens, 1-6 turns: rows from ~15 to ~150 tokens
        prompt = rng.integers(4, 60, size=int(rng.integers(9, 31))).tolist()
        trajs.append(_episode(rng, k, prompt=prompt, turns=int(rng.integers(1, 7)),
                              window=window))
    adv = [float(a) for a in rng.normal(0, 1, len(trajs))]
    batch = pad_batch(trajs, adv, pad_id=0)
    if window is not None:
        batch = turn_rows(trajs, batch, pad_id=0)
    return batch, [t.rows for t in trajs]


@pytest.fixture(scope="module")
def model():
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=False)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()


def _step(model, batch, counts, *, layout: str, agg: str, budget: int):
    """The step's loss and gradients as the ranks' DeepSpeed step computes them."""
    cfg = LearnerConfig(loss_agg=agg, kl_coef=0.0, layout=layout, micro_batch_tokens=budget,
                        minibatches=1)
    shards = shard_episodes(batch, counts, ranks=RANKS, minibatches=1,
                            token_mean=agg == "token-mean", balance=layout != "padded")
    model.zero_grad()
    total = 0.0
    for shard in shards:
        (mb,) = split_minibatches(shard, 1)
        how, plan = rank_plan(mb, layout, budget, agree=lambda n: n)
        scale = 1.0 / float(mb["step_units"][0])  # x world size / world size
        for rows in plan:
            micro = {k: torch.from_numpy(v) for k, v in trim(
                {k: v[rows] for k, v in mb.items()}).items()}
            logp, ent = token_logprobs_by_layout(model, micro, layout=how, temperature=0.7)
            loss, _ = policy_loss(logp, ent, micro, cfg, ref_logprobs=None)
            weighted = loss * float(micro["loss_units"].sum()) * scale
            weighted.backward()
            total += float(weighted.detach())
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return total, grads.clone()


@pytest.mark.parametrize("agg", AGGREGATIONS)
@pytest.mark.parametrize("window", [None, 2])
def test_every_layout_gives_the_padded_loss_and_gradients(model, agg, window):
    batch, counts = _batch(window, agg)
    loss, grads = _step(model, batch, counts, layout="padded", agg=agg, budget=0)
    assert loss != 0.0
    layouts = ["bucketed", "packed"] + (["shared_prefix"] if window else [])
    for layout in layouts:
        # A small budget: several micro-batches per rank, long rows alone.
        other, other_grads = _step(model, batch, counts, layout=layout, agg=agg, budget=160)
        assert other == pytest.approx(loss, rel=1e-5), layout
        err = (other_grads - grads).norm() / grads.norm()
        assert err < 1e-4, (layout, float(err))


def test_balanced_shards_split_tokens_evenly_and_keep_each_step_whole():
    batch, counts = _batch(None, "token-mean")
    lengths = batch["attention_mask"].sum(1)
    plain = shard_episodes(batch, counts, ranks=RANKS, minibatches=1, token_mean=True)
    even = shard_episodes(batch, counts, ranks=RANKS, minibatches=1, token_mean=True,
                          balance=True)

    def spread(shards):
        tokens = [s["attention_mask"].sum() for s in shards]
        return max(tokens) - min(tokens)

    assert spread(even) <= spread(plain) and spread(even) <= lengths.max()
    assert sum(len(s["input_ids"]) for s in even) == len(lengths)
    assert even[0]["step_units"][0] == plain[0]["step_units"][0]


def test_buckets_hold_rows_of_like_length_within_the_budget():
    batch, _ = _batch(None, "token-mean")
    lengths = batch["attention_mask"].sum(1)
    plan = plan_micro_batches(batch, layout="bucketed", budget=200)
    assert sorted(np.concatenate(plan).tolist()) == list(range(len(lengths)))
    for rows in plan:
        assert len(rows) == 1 or len(rows) * lengths[rows].max() <= 200
    assert computed_tokens(batch, plan, "bucketed") < len(lengths) * lengths.max()


def test_the_shared_prefix_stops_at_the_first_loss_token():
    ids = np.array([[1, 2, 3, 4, 5, 0], [1, 2, 3, 4, 9, 9]])
    lengths = np.array([5, 6])
    none = np.zeros((2, 6))
    assert shared_prefix_length(ids, lengths, none) == 4
    loss = none.copy()
    loss[0, 2] = 1
    assert shared_prefix_length(ids, lengths, loss) == 2
    # One row alone shares with itself all but its last token.
    assert shared_prefix_length(ids[:1], lengths[:1], none[:1]) == 4


def test_unknown_layout_and_shared_prefix_with_checkpointing_or_zero3_are_refused():
    batch, _ = _batch(2, "token-mean")
    with pytest.raises(ValueError, match="unknown learner"):
        rank_plan(batch, "zigzag", 0, agree=lambda n: n)
    with pytest.raises(ValueError, match="gradient_checkpointing"):
        rank_plan(batch, "shared_prefix", 0, agree=lambda n: n, checkpointing=True)
    with pytest.raises(ValueError, match="zero_stage=3"):
        rank_plan(batch, "shared_prefix", 0, agree=lambda n: n, zero_stage=3)
    assert rank_plan(batch, "auto", 0, agree=lambda n: n, zero_stage=3)[0] == "bucketed"
    assert rank_plan(batch, "auto", 0, agree=lambda n: n, checkpointing=True)[0] == "bucketed"
    assert rank_plan(batch, "auto", 0, agree=lambda n: n)[0] == "shared_prefix"


def test_the_config_refuses_shared_prefix_where_it_cannot_run():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="zero_stage=3"):
        LearnerConfig(layout="shared_prefix", zero_stage=3)
    assert LearnerConfig(layout="auto", zero_stage=3).layout == "auto"


def test_the_memory_plan_counts_the_token_budget(capsys):
    from pathlib import Path

    from horizonrl.cluster.config import load_config
    from horizonrl.cluster.ops.plan import memory_report

    config = Path(__file__).resolve().parents[2] / "configs/babyai-local.yaml"
    memory_report(load_config(config, ["generator.max_context_tokens=2048"]), None)
    assert "learner micro-batch 8192 tokens" in capsys.readouterr().out
    memory_report(load_config(config, ["generator.max_context_tokens=2048",
                                       "learner.micro_batch_tokens=1024"]), None)
    assert "learner micro-batch 2048 tokens" in capsys.readouterr().out  # a row must fit
    cfg = load_config(config, ["generator.max_context_tokens=2048", "learner.layout=padded"])
    rows = cfg.generator.tasks_per_step * cfg.generator.group_size // (
        cfg.learner.world_size * cfg.learner.minibatches)
    memory_report(cfg, None)
    assert f"learner micro-batch {rows * 2048} tokens" in capsys.readouterr().out
