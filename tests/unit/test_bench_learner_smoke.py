"""bench/learner_throughput.py's pieces without Ray: the synthetic batch, the torch mirror, the
table."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from horizonrl.learner.config import LearnerConfig

pytestmark = pytest.mark.slow  # loads and trains real (tiny) models

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    from bench import learner_throughput

    return learner_throughput


def test_synthetic_batch_is_multi_turn_and_no_group_is_skipped(bench) -> None:
    trajs = bench.synthetic_trajectories(n=16, tokens=300, group_size=4, vocab=500, seed=3)
    again = bench.synthetic_trajectories(n=16, tokens=300, group_size=4, vocab=500, seed=3)
    assert trajs == again
    for t in trajs:
        mask = t.response_mask
        assert mask[0] == 1 and mask[-1] == 1 and 0 in mask
        assert t.num_turns == sum(1 for a, b in zip((0, *mask), mask) if b and not a) >= 2
        assert 0.8 * 300 <= len(t.prompt_ids) + len(t.response_ids) <= 1.2 * 300 + 84
        assert max(t.prompt_ids + t.response_ids) < 500
    for g in {t.group_id for t in trajs}:
        rewards = {t.reward for t in trajs if t.group_id == g}
        assert rewards == {0.0, 1.0}, g


def test_torch_mirror_starts_on_policy_and_moves_the_weights(bench, tiny_model_path) -> None:
    trajs = bench.synthetic_trajectories(n=8, tokens=120, group_size=4, vocab=200, seed=0)
    trajs = bench.with_behaviour_logprobs(trajs, tiny_model_path, pad_id=0)
    cfg = LearnerConfig(kl_coef=0.0, minibatches=1)
    plain = bench.TorchLearner(cfg, model_path=tiny_model_path, pad_id=0, world_size=2)
    before = [p.detach().clone() for p in plain.params]
    m = plain.train(trajs)
    # Ratio 1 everywhere before the first step: each rank's loss is -token-mean(advantage).
    expected = []
    for half in (trajs[:4], trajs[4:]):
        r = np.array([t.reward for t in half])
        adv = (r - r.mean()) / (r.std(ddof=1) + 1e-6)
        tokens = np.array([sum(t.response_mask) for t in half])
        expected.append(-(adv * tokens).sum() / tokens.sum())
    assert m["loss"] == pytest.approx(np.mean(expected), abs=1e-4)
    assert any(not torch.equal(a, b) for a, b in zip(before, plain.params))


def test_random_model_has_the_size_asked_and_the_tokenizer(bench, tiny_model_path,
                                                           tmp_path) -> None:
    from transformers import AutoConfig

    out = bench.random_model(tiny_model_path, tmp_path / "m", hidden=64, layers=3, seed=0)
    cfg = AutoConfig.from_pretrained(out)
    assert (cfg.hidden_size, cfg.num_hidden_layers) == (64, 3)
    assert cfg.vocab_size == AutoConfig.from_pretrained(tiny_model_path).vocab_size
    tokenizer = (tiny_model_path / "tokenizer.json").read_bytes()
    assert (out / "tokenizer.json").read_bytes() == tokenizer


def test_table_divides_by_the_same_models_torch_row(bench) -> None:
    def row(model: str, learner: str, seconds: tuple[float, ...]):
        return bench.Timing(model=model, params=10**6, learner=learner, layout="1 x 1",
                            seconds=seconds, rank_seconds=seconds, loss_first=0.1, loss_last=0.2)

    text = bench.table([row("a", "torch", (1.0, 1.0)), row("a", "ZeRO-2", (3.0, 3.0)),
                        row("b", "torch", (2.0, 2.0)), row("b", "ZeRO-2", (1.0, 1.0))])
    lines = text.splitlines()
    assert len(lines) == 6
    assert "| 3.00x |" in lines[3] and "| 0.50x |" in lines[5]
