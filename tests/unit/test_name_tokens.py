"""`model.tiny.names`: the env's own names join the tokenizer's corpus, so each name word is one
token where a plain word-level BPE of the same size spells most of them from pieces."""

import pytest
from pydantic import ValidationError

from horizonrl.cluster.config import ModelConfig, TinyModelConfig
from horizonrl.cluster.model.load import tiny_model_dir
from horizonrl.cluster.model.tiny_model import (
    _render,
    name_words,
    random_transcripts,
    train_tokenizer,
    whole_words,
)
from horizonrl.envpool.config import EnvConfig
from horizonrl.envpool.deepsearch import build_world

KWARGS = {"world_seed": 0, "hops": [2], "top_k": 3}


def test_deepsearch_lists_every_word_of_its_entity_names():
    words = name_words("deepsearch", KWARGS)
    entities = build_world(0).entities
    assert set(words) == {w for name in entities for w in name.split()}
    assert len(words) > 1000 and all(w[0].isupper() for w in words)


def test_names_become_whole_tokens_and_copy_back_exactly():
    texts = [_render(m) for m in random_transcripts(
        env_name="deepsearch", env_kwargs=KWARGS, episodes=200, max_turns=4, seed=0,
        thought="short")]
    words = name_words("deepsearch", KWARGS)
    plain = train_tokenizer(texts, 8192, "word")
    named = train_tokenizer(texts, 8192, "word", words)
    assert whole_words(named, words) == len(words)
    assert whole_words(plain, words) < len(words) // 2  # 200 transcripts name few entities
    # A reply that copies a two-word name: one token per word, and decoding gives the text back.
    name = next(n for n in build_world(0).entities if len(n.split()) == 2)
    reply = f"Action: answer[{name}]"
    ids = named(reply)["input_ids"]
    assert named.decode(ids) == reply
    assert sum(named.decode([i]).strip() in name.split() for i in ids) == 2


def test_names_need_the_word_tokenizer_and_an_env_that_lists_them():
    with pytest.raises(ValidationError, match=r"model\.tiny\.tokenizer=word"):
        TinyModelConfig(names=True)
    with pytest.raises(ValueError, match="lists no names"):
        name_words("babyai", {})


def test_cache_key_tells_a_names_tokenizer_apart():
    env = EnvConfig(name="deepsearch", kwargs=KWARGS)
    off = tiny_model_dir(ModelConfig(tiny=TinyModelConfig(tokenizer="word")), env)
    on = tiny_model_dir(ModelConfig(tiny=TinyModelConfig(tokenizer="word", names=True)), env)
    assert off != on
