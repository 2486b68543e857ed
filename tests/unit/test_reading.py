"""Synthetic reading tasks: each answer is what exact reading of its text gives, recomputed here
independently; the encoding trains on the answer only; the accuracy probe tells a trained
model from an untrained one."""

import re

import pytest

from horizonrl.cluster.model.reading import (
    observation_lines,
    reading_accuracy,
    reading_ids,
    reading_messages,
    reading_tasks,
)
from horizonrl.cluster.model.tiny_model import _render, random_transcripts, train_tokenizer
from horizonrl.protos.chat import ChatFormat


@pytest.fixture(scope="module")
def pool() -> list[str]:
    episodes = random_transcripts(env_name="textcraft", env_kwargs={"depths": [1, 2]},
                                  episodes=60, max_turns=4, seed=0)
    return observation_lines(episodes)


def _body_and_query(text: str) -> tuple[list[str], str]:
    body, question = text.rsplit("\n\nQuestion: ", 1)
    return body.split("\n"), question


def _mentions(line: str, word: str) -> bool:
    return re.search(rf"\b{re.escape(word)}\b", line, flags=re.I) is not None


def test_answers_follow_from_the_text(pool):
    tasks = reading_tasks(pool, count=300, seed=3)
    assert len(tasks) == 300
    assert {t.kind for t in tasks} == {"find", "count", "inventory"}
    for t in tasks:
        lines, question = _body_and_query(t.text)
        word = re.search(r"(?:mentions? (\S+)|many (\S+) are held)\?$", question)
        word = word.group(1) or word.group(2)
        if t.kind == "find":
            hits = [x for x in lines if _mentions(x, word)]
            assert hits == [t.answer], t.text
        elif t.kind == "count":
            assert int(t.answer) == sum(_mentions(x, word) for x in lines), t.text
        else:
            held = 0
            for x in lines:
                verb, n, name = x.split(" ", 2)
                if name == word:
                    held += int(n) if verb == "Got" else -int(n)
            assert int(t.answer) == held >= 0, t.text


def test_same_seed_same_tasks_and_made_up_names_appear(pool):
    assert reading_tasks(pool, count=30, seed=1) == reading_tasks(pool, count=30, seed=1)
    assert reading_tasks(pool, count=30, seed=1) != reading_tasks(pool, count=30, seed=2)
    finds = [t for t in reading_tasks(pool, count=300, seed=0) if t.kind == "find"]
    words = set(" ".join(pool).lower().split())
    unseen = [t for t in finds if any(w not in words for w in t.answer.lower().split())]
    assert 0.3 < len(unseen) / len(finds) < 0.7  # about half copy a name no line had


def test_too_few_lines_is_a_clear_error():
    with pytest.raises(ValueError, match="at least 4"):
        reading_tasks(["a b c"], count=3, seed=0)


def test_encoding_trains_on_the_answer_only(pool):
    tasks = reading_tasks(pool, count=6, seed=0)
    chat = ChatFormat(train_tokenizer([_render(reading_messages(t)) for t in tasks], 400, "word"))
    for t in tasks:
        ids, targets = reading_ids(chat, t)
        trained = [i for i, x in zip(ids, targets) if x != -100]
        assert targets[:len(ids) - len(trained)] == [-100] * (len(ids) - len(trained))
        assert trained[-1] == chat.im_end_id
        assert chat.tokenizer.decode(trained[:-1]) == t.answer


def test_accuracy_probe_scores_a_trained_and_an_untrained_model(pool):
    """The probe can fail: an untrained model scores 0 on every kind, and one that has
    memorised these very tasks answers most of them (prompt and answer are read alike)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from horizonrl.cluster.model.tiny_model import pretrain

    tasks = reading_tasks(pool, count=24, seed=0)
    chat = ChatFormat(train_tokenizer([_render(reading_messages(t)) for t in tasks], 400, "word"))
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=64 * (len(chat.tokenizer) // 64 + 1), hidden_size=64, intermediate_size=192,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=1024, tie_word_embeddings=True))
    before = reading_accuracy(model, chat, tasks)
    pretrain(model, [reading_ids(chat, t) for t in tasks], steps=150, batch_size=8, lr=5e-3,
             pad_id=chat.pad_id, seed=0, log_every=1000)
    after = reading_accuracy(model, chat, tasks)
    assert set(before) == set(after) == {"find", "count", "inventory"}
    assert max(v["exact"] for v in before.values()) == 0.0, before
    assert min(v["exact"] for v in after.values()) > 0.5, after
    for kind in after:  # teacher-forced token accuracy rises with the answers
        assert after[kind]["tokens"] > before[kind]["tokens"] + 0.3, (before, after)
