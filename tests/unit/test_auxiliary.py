"""SFT / rejection-sampling / DPO data builders and losses (hand-checked values, tiny models)."""

from __future__ import annotations

import copy
import json
import math
import re

import numpy as np
import pytest
import torch

from horizonrl.learner.auxiliary import (
    DPOPair,
    SFTExample,
    dpo_loss,
    dpo_pairs_from_groups,
    pad_examples,
    read_pairs_jsonl,
    rejection_sampling_examples,
    sequence_logprob,
    sft_examples_from_jsonl,
    sft_examples_from_trajectories,
    sft_loss,
    write_pairs_jsonl,
)
from horizonrl.protos.chat import IM_END, SPECIAL_TOKENS, ChatFormat
from horizonrl.protos.trajectory import Failure, Trajectory


def traj(group: str, response: tuple[int, ...], mask: tuple[int, ...], *, reward: float = 0.0,
         success: bool = False, prompt: tuple[int, ...] = (1, 2),
         failure: Failure = Failure.NONE, tid: str = "t") -> Trajectory:
    return Trajectory(
        trajectory_id=tid, group_id=group, task_id=group, env_name="fake", policy_version=0,
        horizon=4, prompt_ids=prompt, response_ids=response, response_mask=mask,
        response_logprobs=(0.0,) * len(response), rewards=(reward,), reward=reward, num_turns=1,
        terminated=True, truncated=False, failure=failure, info={"success": success},
    )


class CharTokenizer:
    """Stand-in tokenizer: one id per character, the ChatML specials kept whole."""

    def __init__(self) -> None:
        self.vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
        self._split = re.compile("(" + "|".join(re.escape(t) for t in SPECIAL_TOKENS) + ")")

    def convert_tokens_to_ids(self, token: str) -> int:
        return self.vocab[token]

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids = []
        for piece in self._split.split(text):
            if piece in self.vocab and piece in SPECIAL_TOKENS:
                ids.append(self.vocab[piece])
            else:
                ids += [self.vocab.setdefault(c, len(self.vocab)) for c in piece]
        return ids


# -- losses, by hand --------------------------------------------------------------------------
def test_sft_loss_hand_value_and_masking():
    # Row logits: position 0 gives p(token 1) = 3/4, position 1 is uniform over 2 tokens.
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, 0.0], [5.0, -5.0]]])
    ids = torch.tensor([[0, 1, 0]])
    mask = torch.tensor([[1.0, 1.0, 1.0]])  # position 0 has no prediction and must not count
    expected = (math.log(4 / 3) + math.log(2)) / 2
    assert sft_loss(logits, ids, mask).item() == pytest.approx(expected, rel=1e-6)
    seq = sequence_logprob(logits, ids, mask)
    assert seq.item() == pytest.approx(math.log(3 / 4) + math.log(1 / 2), rel=1e-6)

    # Mask out position 2: changing the logits that predict it leaves the loss unchanged.
    mask2 = torch.tensor([[0.0, 1.0, 0.0]])
    before = sft_loss(logits, ids, mask2).item()
    changed = logits.clone()
    changed[0, 1] = torch.tensor([7.0, -3.0])
    assert sft_loss(changed, ids, mask2).item() == pytest.approx(before)
    assert sequence_logprob(changed, ids, mask2).item() == pytest.approx(math.log(3 / 4))
    assert sft_loss(changed, ids, mask).item() != pytest.approx(expected)  # unmasked: it moves


def test_dpo_loss_hand_values():
    pc, pr = torch.tensor([-1.0, -2.0]), torch.tensor([-3.0, -1.0])
    rc, rr = torch.tensor([-2.0, -1.0]), torch.tensor([-2.0, -1.0])
    loss, acc, margin = dpo_loss(pc, pr, rc, rr, beta=0.5)
    # Pair 1: r_c = 0.5, r_r = -0.5, diff 1. Pair 2: r_c = -0.5, r_r = 0, diff -0.5.
    expected = (math.log1p(math.exp(-1.0)) + math.log1p(math.exp(0.5))) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert acc.item() == pytest.approx(0.5)
    assert margin.item() == pytest.approx(0.25)
    with pytest.raises(ValueError, match="beta"):
        dpo_loss(pc, pr, rc, rr, beta=0.0)


# -- data builders ----------------------------------------------------------------------------
def test_sft_examples_mask_and_filters():
    ok = traj("g", (5, 6, 7), (1, 0, 1), reward=1.0)
    failed_run = traj("g", (5, 6), (1, 1), reward=1.0, failure=Failure.TIMEOUT)
    unsolved = traj("g", (8,), (1,))
    all_ex = sft_examples_from_trajectories([ok, failed_run, unsolved], only_successful=False)
    assert all_ex == [SFTExample((1, 2, 5, 6, 7), (0, 0, 1, 0, 1)),
                      SFTExample((1, 2, 8), (0, 0, 1))]
    solved = sft_examples_from_trajectories([ok, failed_run, unsolved], only_successful=True)
    assert solved == [all_ex[0]]


def test_rejection_sampling_dedups_within_group_only():
    a = traj("g1", (5, 6), (1, 1), reward=1.0)
    a_again = traj("g1", (5, 6), (1, 1), success=True)
    b = traj("g1", (5, 7), (1, 1), reward=0.5)
    a_other_group = traj("g2", (5, 6), (1, 1), reward=1.0)
    loser = traj("g1", (9,), (1,), reward=0.0)
    out = rejection_sampling_examples([a, a_again, b, a_other_group, loser])
    assert [e.input_ids for e in out] == [(1, 2, 5, 6), (1, 2, 5, 7), (1, 2, 5, 6)]


def _no_model() -> str:
    raise AssertionError("trajectories carry their token ids: no model should be built for them")


def test_offline_rs_masks_invalid_turns_like_the_online_learner(tmp_path):
    from dataclasses import replace

    from horizonrl.cluster.config import load_config
    from horizonrl.cluster.warm_start.auxiliary import build_data
    from horizonrl.protos.codec import to_json_line

    two_turns = replace(traj("g", (5, 6, 7, 8), (1, 0, 1, 1), reward=1.0), num_turns=2,
                        rewards=(0.0, 1.0), info={"success": True, "invalid_turns": [0]})
    data = tmp_path / "step_0.jsonl"
    data.write_text(to_json_line(two_turns) + "\n")
    for mask, want in ((False, [0, 0, 1, 0, 1, 1]), (True, [0, 0, 0, 0, 1, 1])):
        cfg = load_config(None, [f"learner.mask_invalid_turns={str(mask).lower()}"])
        (example,) = build_data("rs", str(data), cfg, model_path=_no_model)
        assert list(example.loss_mask) == want, mask


def test_dpo_pairs_within_groups_and_never_ties():
    g1 = [traj("g1", (10,), (1,), reward=0.2), traj("g1", (11,), (1,), reward=0.0, success=True),
          traj("g1", (12,), (1,), reward=0.9), traj("g1", (13,), (1,), reward=0.0)]
    ties = [traj("g2", (20,), (1,), reward=1.0), traj("g2", (21,), (1,), reward=1.0)]
    lone = [traj("g3", (30,), (1,), reward=1.0)]
    other_prompt = [traj("g4", (40,), (1,), reward=1.0, prompt=(3,)),
                    traj("g4", (41,), (1,), reward=0.0, prompt=(4,))]
    broken = [traj("g5", (50,), (1,), reward=1.0),
              traj("g5", (51,), (1,), reward=0.0, failure=Failure.ENV_ERROR)]
    pairs = dpo_pairs_from_groups(g1 + ties + lone + other_prompt + broken)
    assert [(p.chosen_ids, p.rejected_ids) for p in pairs] == [((12,), (13,))]
    # The env's success flag outranks a higher reward.
    flagged = [traj("g", (1,), (1,), reward=0.0), traj("g", (2,), (1,), reward=-0.5, success=True)]
    assert [p.chosen_ids for p in dpo_pairs_from_groups(flagged)] == [(2,)]
    two = dpo_pairs_from_groups(g1, max_pairs_per_group=2)
    assert [(p.chosen_ids, p.rejected_ids) for p in two] == [((12,), (13,)), ((10,), (11,))]
    half_tied = [traj("g", (1,), (1,), reward=1.0), traj("g", (2,), (1,), reward=0.5),
                 traj("g", (3,), (1,), reward=0.5), traj("g", (4,), (1,), reward=0.0)]
    assert len(dpo_pairs_from_groups(half_tied, max_pairs_per_group=2)) == 1
    by_group = {p.chosen_ids[0] // 10 for p in dpo_pairs_from_groups(
        [t for k in range(6) for t in (traj(f"h{k}", (10 * k + 1,), (1,), reward=1.0),
                                       traj(f"h{k}", (10 * k + 2,), (1,)))])}
    assert by_group == set(range(6))  # one pair per group, chosen and rejected from that group


def test_pairs_jsonl_round_trip_and_malformed_line(tmp_path):
    pairs = [DPOPair((1, 2), (3, 4), (1, 0), (5,), (1,)), DPOPair((7,), (8,), (1,), (9, 9), (0, 1))]
    path = tmp_path / "pairs.jsonl"
    assert write_pairs_jsonl(pairs, path) == 2
    assert read_pairs_jsonl(path) == pairs
    ex = pairs[0].chosen_example()
    assert ex == SFTExample((1, 2, 3, 4), (0, 0, 1, 0))
    with open(path, "a") as f:
        f.write("\n" + json.dumps({"prompt_ids": [1], "chosen_ids": [2], "chosen_mask": [1, 1],
                                   "rejected_ids": [3], "rejected_mask": [1]}) + "\n")
    with pytest.raises(ValueError, match=r"pairs\.jsonl:4: chosen_mask"):
        read_pairs_jsonl(path)
    path.write_text('{"prompt_ids": [1]\n')
    with pytest.raises(ValueError, match=r"pairs\.jsonl:1: invalid JSON"):
        read_pairs_jsonl(path)


def test_sft_from_jsonl_segments_truncation_and_errors(tmp_path):
    chat = ChatFormat(CharTokenizer())
    conv = [{"role": "system", "content": "S"}, {"role": "user", "content": "obs1"},
            {"role": "assistant", "content": "go"}, {"role": "user", "content": "obs2"},
            {"role": "assistant", "content": "stop"}]
    path = tmp_path / "sft.jsonl"
    long = conv[:2] + [{"role": "assistant", "content": "x" * 200}]
    path.write_text("\n".join(json.dumps({"messages": m}) for m in (conv, long)) + "\n")
    data = sft_examples_from_jsonl(path, chat, max_tokens=100)
    assert (len(data.examples), data.truncated, data.skipped) == (2, 1, 0)
    ex = data.examples[0]
    prompt, end = chat.prompt_ids("S", "obs1"), chat.tokenizer.convert_tokens_to_ids(IM_END)
    want = prompt + chat.encode("go") + [end] + chat.observation_ids("obs2") \
        + chat.encode("stop") + [end]
    assert list(ex.input_ids) == want
    model_tokens = [t for t, m in zip(ex.input_ids, ex.loss_mask) if m]
    assert model_tokens == chat.encode("go") + [end] + chat.encode("stop") + [end]
    assert len(data.examples[1].input_ids) == 100 and data.examples[1].loss_mask[-1] == 1

    skipped = sft_examples_from_jsonl(path, chat, max_tokens=len(prompt))
    assert (len(skipped.examples), skipped.truncated, skipped.skipped) == (0, 0, 2)

    path.write_text(json.dumps({"messages": conv}) + "\n"
                    + json.dumps({"messages": conv[1:]}) + "\n")
    with pytest.raises(ValueError, match=r"sft\.jsonl:2: the first message must be the system"):
        sft_examples_from_jsonl(path, chat, max_tokens=100)
    assert len(sft_examples_from_jsonl(path, chat, max_tokens=100,
                                       default_system="S").examples) == 2
    path.write_text(json.dumps({"messages": conv[:4]}) + "\n")
    with pytest.raises(ValueError, match=r"sft\.jsonl:1: .*end with assistant"):
        sft_examples_from_jsonl(path, chat, max_tokens=100)
    path.write_text("not json\n")
    with pytest.raises(ValueError, match=r"sft\.jsonl:1: invalid JSON"):
        sft_examples_from_jsonl(path, chat, max_tokens=100)


def test_pad_examples():
    out = pad_examples([SFTExample((4, 5, 6), (0, 1, 1)), SFTExample((7,), (0,))], pad_id=0)
    np.testing.assert_array_equal(out["input_ids"], [[4, 5, 6], [7, 0, 0]])
    np.testing.assert_array_equal(out["loss_mask"], [[0, 1, 1], [0, 0, 0]])
    np.testing.assert_array_equal(out["attention_mask"], [[1, 1, 1], [1, 0, 0]])


# -- a tiny real model learns ----------------------------------------------------------------
@pytest.fixture()
def one_thread():
    """Tiny matmuls run faster on one thread than fighting over shared cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_qwen2(seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, pad_token_id=0, bos_token_id=None,
                         eos_token_id=None)
    return Qwen2ForCausalLM(config)


def batch_tensors(examples):
    b = pad_examples(examples, pad_id=0)
    return (torch.from_numpy(b["input_ids"]), torch.from_numpy(b["attention_mask"]),
            torch.from_numpy(b["loss_mask"]))


def seq_logprobs(model, examples):
    ids, attn, mask = batch_tensors(examples)
    return sequence_logprob(model(input_ids=ids, attention_mask=attn).logits, ids, mask)


def test_sft_steps_lower_the_loss(one_thread):
    model = tiny_qwen2()
    rng = np.random.default_rng(0)
    examples = [SFTExample(tuple(int(x) for x in rng.integers(1, 64, n)),
                           (0,) * 4 + (1,) * (n - 4)) for n in (10, 12, 9)]
    ids, attn, mask = batch_tensors(examples)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(30):
        loss = sft_loss(model(input_ids=ids, attention_mask=attn).logits, ids, mask)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses


def test_dpo_steps_raise_the_margin(one_thread):
    policy = tiny_qwen2(seed=1)
    ref = copy.deepcopy(policy).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    rng = np.random.default_rng(1)
    pairs = [DPOPair(tuple(int(x) for x in rng.integers(1, 64, 4)),
                     tuple(int(x) for x in rng.integers(1, 64, 5)), (1,) * 5,
                     tuple(int(x) for x in rng.integers(1, 64, 6)), (1, 1, 0, 1, 1, 1))
             for _ in range(3)]
    chosen = [p.chosen_example() for p in pairs]
    rejected = [p.rejected_example() for p in pairs]
    with torch.no_grad():
        ref_c, ref_r = seq_logprobs(ref, chosen), seq_logprobs(ref, rejected)
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-2)
    margins, losses = [], []
    for _ in range(30):
        loss, _, margin = dpo_loss(seq_logprobs(policy, chosen), seq_logprobs(policy, rejected),
                                   ref_c, ref_r, beta=0.1)
        opt.zero_grad()
        loss.backward()
        opt.step()
        margins.append(margin.item())
        losses.append(loss.item())
    assert margins[0] == pytest.approx(0.0, abs=1e-5)  # policy == reference at the start
    with torch.no_grad():
        _, acc, final = dpo_loss(seq_logprobs(policy, chosen), seq_logprobs(policy, rejected),
                                 ref_c, ref_r, beta=0.1)
    assert final.item() > 1.0 and acc.item() == 1.0, margins
    assert losses[-1] < math.log(2) - 0.3, losses
