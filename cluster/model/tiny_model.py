"""Build the embedded default's stand-in for a pretrained base model, entirely offline.

A byte-level BPE tokenizer is trained on transcripts of a uniformly random valid-action policy,
a small Qwen2 model is randomly initialised, then briefly trained (next-token prediction) on the
same kind of transcripts so it knows the language and the action format but nothing about which
action solves the task. RL does the rest. The result is a `save_pretrained` folder that
transformers and vLLM load like any real checkpoint.
"""

from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path
from typing import Literal

import torch

from horizonrl.cluster.model.reading import (
    observation_lines,
    probe_tasks,
    reading_accuracy,
    reading_ids,
    reading_tasks,
)
from horizonrl.envpool.registry import EnvSpec, env_spec, make_env
from horizonrl.protos.chat import CHATML_TEMPLATE, IM_END, IM_START, PAD, SPECIAL_TOKENS, ChatFormat

MODEL_MARKER = "horizonrl_tiny_model.json"
Thought = Literal["short", "none"]


def expert_reply(spec: EnvSpec, action: str, thought: Thought = "short") -> str:
    """The reply text for `action`: a short templated thought, then the env's action line (the
    format of the demonstrations, and of the pre-training transcripts that teach its words)."""
    line = spec.format_action(action)
    return line if thought == "none" else f"Thought: I will {action}.\n{line}"


def random_transcripts(
    *, env_name: str, env_kwargs: dict, episodes: int, max_turns: int, seed: int,
    thought: str = "none",
) -> list[list[tuple[str, str]]]:
    """Episodes of a uniformly random valid-action policy as (role, text) message lists."""
    spec = env_spec(env_name)
    env = make_env(env_name, **env_kwargs)
    rng = random.Random(seed)
    out = []
    for ep in range(episodes):
        obs, info = env.reset(seed=10_000_000 + seed * 100_000 + ep)  # disjoint from RL task seeds
        messages = [("system", spec.system_prompt), ("user", obs)]
        for _ in range(rng.randint(1, max_turns)):
            action = spec.random_action(info, rng)
            res = env.step(action)
            messages += [("assistant", expert_reply(spec, action, thought)),
                         ("user", res.observation)]
            info = res.info
            if res.terminated or res.truncated:
                break
        out.append(messages)
    env.close()
    return out


def whole_words(tokenizer, words: list[str]) -> int:
    """How many of `words` are one token both after a space and after punctuation."""
    return sum(len(tokenizer(" " + w)["input_ids"]) == len(tokenizer(w)["input_ids"]) == 1
               for w in words)


def train_tokenizer(texts: list[str], vocab_size: int, kind: str = "phrase",
                    names: list[str] | tuple[str, ...] = ()):
    """Byte-level BPE trained on `texts`, wrapped as a transformers fast tokenizer with ChatML.

    `names` join the corpus after a space (" Kyn" in a passage) and after a newline
    ("search[Kyn"), eight times, so that when vocab_size is tight their merges win over the
    texts' rare words (BPE ranks merges by how often a pair occurs).
    """
    if names:
        texts = [*texts, *[" " + " ".join(names), "\n".join(names)] * 8]
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    if kind == "word":
        # GPT-2's split (words with their leading space): a name seen often enough becomes one
        # token, and a name never seen is spelled from pieces of words, never across them.
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        # Split only at punctuation and newlines, so merges can span words: "red ball 1" or
        # "2 steps forward" become single tokens. Transcripts get ~2x shorter than with
        # word-level pre-tokenisation, and every token the tiny model reads or writes costs
        # CPU time.
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(r"[,;:.\n]"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=IM_END, pad_token=PAD, bos_token=None, unk_token=None
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast


def name_words(env_name: str, env_kwargs: dict) -> list[str]:
    """The words of the env's own names (`EnvSpec.vocabulary`); a clear error where it has none."""
    spec = env_spec(env_name)
    if spec.vocabulary is None:
        raise ValueError(f"model.tiny.names=true, but env {env_name!r} lists no names (no "
                         f"`vocabulary` in its module); set model.tiny.names=false")
    return spec.vocabulary(**env_kwargs)


def _render(messages: list[tuple[str, str]]) -> str:
    return "".join(f"{IM_START}{r}\n{t}{IM_END}\n" for r, t in messages)


def transcript_ids(chat: ChatFormat, messages: list[tuple[str, str]], *,
                   all_tokens: bool = True) -> tuple[list[int], list[int]]:
    """Encode a transcript with the same segments the agent loop uses at rollout time.

    Returns (ids, targets): targets are the ids, or with `all_tokens=False` the ids on
    assistant tokens only (-100 elsewhere). Measured here on BabyAI after 300 steps: the base
    wrote invalid actions 39% of the time with all tokens, 44-52% with assistant-only loss;
    predicting the observations trains the embeddings of the object phrases it must copy.
    """
    ids = chat.prompt_ids(messages[0][1], messages[1][1])
    targets = [-100] * len(ids)
    for (_, action), (_, obs) in zip(messages[2::2], messages[3::2]):
        turn, following = chat.assistant_ids(action), chat.observation_ids(obs)
        ids += turn + following
        targets += turn + [-100] * len(following)
    return ids, (list(ids) if all_tokens else targets)


def length_batches(lengths: list[int], batch_size: int, seed: int) -> list[list[int]]:
    """Batches of similar length (sorted, chunked, shuffled): far less padding to compute."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    random.Random(seed).shuffle(batches)
    return batches


def pretrain(model, sequences: list[tuple[list[int], list[int]]], *, steps: int,
             batch_size: int, lr: float, pad_id: int, seed: int,
             log_every: int = 25) -> list[float]:
    """Next-token training on (ids, targets) pairs (AdamW, warm-up then cosine)."""
    if steps == 0:
        return []
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    warmup = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warmup, 0.5 * (1 + math.cos(math.pi * s / steps)))
    )
    batches = length_batches([len(s) for s, _ in sequences], batch_size, seed)
    model.train()
    losses, t0 = [], time.time()
    for step in range(steps):
        idx = batches[step % len(batches)]
        width = max(len(sequences[i][0]) for i in idx)
        ids = torch.full((len(idx), width), pad_id, dtype=torch.long)
        labels = torch.full((len(idx), width), -100, dtype=torch.long)
        for row, i in enumerate(idx):
            seq, tgt = sequences[i]
            ids[row, : len(seq)] = torch.tensor(seq)
            labels[row, : len(seq)] = torch.tensor(tgt)
        # Right padding under causal attention never reaches real tokens: no mask needed.
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if (step + 1) % log_every == 0 or step + 1 == steps:
            print(f"[make-tiny-model] pretrain step {step + 1}/{steps} "
                  f"loss {sum(losses[-log_every:]) / len(losses[-log_every:]):.3f} "
                  f"({time.time() - t0:.0f}s)", flush=True)
    model.eval()
    return losses


def tiny_qwen2_config(vocab: int, hidden_size: int, num_layers: int):
    """The locally built model's architecture (also what `--dry-run` plans memory for)."""
    from transformers import Qwen2Config

    from horizonrl.cluster.config import TINY_MAX_POSITIONS

    return Qwen2Config(
        vocab_size=64 * math.ceil(vocab / 64),  # padded to a multiple of 64
        hidden_size=hidden_size,
        intermediate_size=3 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=TINY_MAX_POSITIONS,
        tie_word_embeddings=True,
        torch_dtype="float32",
    )


def build_tiny_model(out: str | Path, *, env_name: str = "babyai", env_kwargs: dict | None = None,
                     vocab_size: int = 1024, hidden_size: int = 128, num_layers: int = 2,
                     transcripts: int = 6000, horizon: int = 6, pretrain_steps: int = 600,
                     batch_size: int = 32, lr: float = 2e-3, seed: int = 0,
                     preset: str | None = None, tokenizer: str = "phrase",
                     thought: str = "none", reading: int = 0, names: bool = False) -> Path:
    """Build tokenizer + Qwen2 model at `out` (a `save_pretrained` folder) and return the path.
    `preset` (see cluster.config.TINY_PRESETS) overrides hidden_size and num_layers; `reading`
    synthetic reading tasks (cluster.model.reading) are mixed into the pre-training sequences;
    `names` adds the env's vocabulary to the tokenizer's corpus (see `name_words`)."""
    from transformers import Qwen2ForCausalLM

    from horizonrl.cluster.config import TINY_PRESETS

    if preset is not None:
        hidden_size, num_layers = TINY_PRESETS[preset]
    out = Path(out)
    env_kwargs = dict(env_kwargs or {})
    torch.manual_seed(seed)
    t0 = time.time()
    episodes = random_transcripts(env_name=env_name, env_kwargs=env_kwargs,
                                  episodes=transcripts, max_turns=horizon, seed=seed,
                                  thought=thought)
    print(f"[make-tiny-model] {len(episodes)} random-policy transcripts "
          f"({time.time() - t0:.0f}s)", flush=True)
    words = name_words(env_name, env_kwargs) if names else []
    tokenizer = train_tokenizer([_render(m) for m in episodes], vocab_size, tokenizer, words)
    whole = whole_words(tokenizer, words)
    if words:
        print(f"[make-tiny-model] {whole}/{len(words)} name words are one token "
              f"(vocab {len(tokenizer)})", flush=True)
    chat = ChatFormat(tokenizer)
    sequences = [transcript_ids(chat, m) for m in episodes]
    probe = []
    if reading:
        pool = observation_lines(episodes)
        sequences += [reading_ids(chat, t) for t in reading_tasks(pool, count=reading, seed=seed)]
        probe = probe_tasks(pool, seed)
    config = tiny_qwen2_config(len(tokenizer), hidden_size, num_layers)
    config.update({"eos_token_id": chat.im_end_id, "pad_token_id": chat.pad_id,
                   "bos_token_id": None})
    model = Qwen2ForCausalLM(config)
    n_params = sum(p.numel() for p in model.parameters())
    mean_len = sum(len(s) for s, _ in sequences) / len(sequences)
    print(f"[make-tiny-model] Qwen2 {n_params / 1e6:.2f}M params, vocab {len(tokenizer)}, "
          f"mean transcript {mean_len:.0f} tokens", flush=True)
    losses = pretrain(model, sequences, steps=pretrain_steps, batch_size=batch_size, lr=lr,
                      pad_id=chat.pad_id, seed=seed)
    accuracy = reading_accuracy(model, chat, probe) if probe else None
    if accuracy:
        print(f"[make-tiny-model] reading probe (exact match and token accuracy per kind): "
              f"{accuracy}", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config.eos_token_id = chat.im_end_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / MODEL_MARKER).write_text(json.dumps({
        "env_name": env_name, "env_kwargs": env_kwargs, "params": n_params,
        "pretrain_steps": pretrain_steps, "final_loss": losses[-1] if losses else None,
        "reading_tasks": reading, "reading_accuracy": accuracy,
        "name_words": len(words), "name_words_whole": whole,
        "seconds": round(time.time() - t0, 1), "seed": seed,
    }, indent=2))
    print(f"[make-tiny-model] saved to {out} ({time.time() - t0:.0f}s)", flush=True)
    return out
