"""Synthetic reading tasks for the tiny model's pre-training: find a line and copy it, count,
track a small inventory.

Behaviour cloning on TextCraft failed on goals never seen in training because the model could
not find the goal's line among the crafting commands and copy its names (issue 14's
prototypes). These tasks teach that skill before any demonstration: each is one user message
(lines of the env's own observations, some names replaced by made-up words the tokenizer
spells from pieces, then a question) and one assistant answer, trained on the answer's tokens.

    tasks = reading_tasks(observation_lines(transcripts), count=2000, seed=0)
    ids, targets = reading_ids(chat, tasks[0])
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Literal

READING_SYSTEM = "Read the lines and answer the question in one line."
Kind = Literal["find", "count", "inventory"]
KINDS: tuple[Kind, ...] = ("find", "count", "inventory")
_SYLLABLES = ("ka", "lo", "mi", "ren", "tor", "vi", "sa", "del", "ur", "pha", "qui", "zo",
              "bel", "nix", "tra", "go", "wen", "fir", "ash", "mol")
_WORD_RE = re.compile(r"[a-z][a-z_]{2,}")


@dataclass(frozen=True, slots=True)
class ReadingTask:
    """One question about `text`; `answer` is what a reader who copies exactly replies."""

    kind: Kind
    text: str
    answer: str


def observation_lines(transcripts: list[list[tuple[str, str]]], limit: int = 20_000) -> list[str]:
    """Distinct lines of at least three words from the transcripts' user messages."""
    seen: dict[str, None] = {}
    for messages in transcripts:
        for role, text in messages:
            if role != "user":
                continue
            for line in text.splitlines():
                line = line.strip()
                if len(line.split()) >= 3 and len(line) <= 200:
                    seen.setdefault(line, None)
            if len(seen) >= limit:
                return list(seen)
    return list(seen)


def made_up_word(rng: random.Random) -> str:
    """A name no corpus contains (2-3 syllables), as a held-out item name is to the model."""
    return "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3)))


def _words(line: str) -> set[str]:
    return set(_WORD_RE.findall(line.lower()))


def _find(rng: random.Random, pool: list[str]) -> ReadingTask | None:
    lines = rng.sample(pool, rng.randint(4, min(10, len(pool))))
    target = rng.randrange(len(lines))
    others = set().union(*(_words(x) for i, x in enumerate(lines) if i != target))
    keys = sorted(_words(lines[target]) - others)
    if not keys:
        return None
    key = rng.choice(keys)
    if rng.random() < 0.5:  # copy a name never seen: the held-out-goal case
        new = made_up_word(rng)
        lines[target] = re.sub(rf"\b{re.escape(key)}\b", new, lines[target], flags=re.I)
        key = new
    body = "\n".join(lines)
    return ReadingTask("find", f"{body}\n\nQuestion: which line mentions {key}?", lines[target])


def _count(rng: random.Random, pool: list[str]) -> ReadingTask | None:
    name = made_up_word(rng)
    lines = rng.sample(pool, rng.randint(3, min(8, len(pool))))
    hits = rng.randint(0, min(4, len(lines)))
    for i in rng.sample(range(len(lines)), hits):
        words = lines[i].split()
        words.insert(rng.randrange(len(words) + 1), name)
        lines[i] = " ".join(words)
    body = "\n".join(lines)
    return ReadingTask("count", f"{body}\n\nQuestion: how many lines mention {name}?", str(hits))


def _inventory(rng: random.Random, pool: list[str]) -> ReadingTask | None:
    names = [made_up_word(rng) for _ in range(rng.randint(2, 3))]
    held = dict.fromkeys(names, 0)
    lines = []
    for _ in range(rng.randint(3, 7)):
        name = rng.choice(names)
        if held[name] > 0 and rng.random() < 0.4:
            n = rng.randint(1, held[name])
            held[name] -= n
            lines.append(f"Used {n} {name}")
        else:
            n = rng.randint(1, 4)
            held[name] += n
            lines.append(f"Got {n} {name}")
    query = rng.choice(names)
    body = "\n".join(lines)
    return ReadingTask("inventory", f"{body}\n\nQuestion: how many {query} are held?",
                       str(held[query]))


_MAKERS = {"find": _find, "count": _count, "inventory": _inventory}


def reading_tasks(pool: list[str], *, count: int, seed: int) -> list[ReadingTask]:
    """`count` tasks, kinds in turn, deterministic in `seed`."""
    if len(pool) < 4:
        raise ValueError(f"reading tasks need at least 4 observation lines, got {len(pool)}")
    rng = random.Random(seed)
    out: list[ReadingTask] = []
    for _ in range(count * 20):  # `find` may draw lines without a unique word: retry
        if len(out) == count:
            break
        task = _MAKERS[KINDS[len(out) % len(KINDS)]](rng, pool)
        if task is not None:
            out.append(task)
    return out


def probe_tasks(pool: list[str], seed: int, count: int = 60) -> list[ReadingTask]:
    """The held-out probe of a model pre-trained with `reading_tasks(pool, seed=seed)`: other
    line draws and other made-up names."""
    return reading_tasks(pool, count=count, seed=seed + 1)


def reading_messages(task: ReadingTask) -> list[tuple[str, str]]:
    return [("system", READING_SYSTEM), ("user", task.text), ("assistant", task.answer)]


def reading_ids(chat, task: ReadingTask) -> tuple[list[int], list[int]]:
    """(ids, targets) with the loss on the answer and its <|im_end|> only."""
    prompt = chat.prompt_ids(READING_SYSTEM, task.text)
    answer = chat.assistant_ids(task.answer)
    return prompt + answer, [-100] * len(prompt) + answer


def reading_accuracy(model, chat, tasks: list[ReadingTask]) -> dict[str, dict[str, float]]:
    """Per kind: `exact`, the share of greedy answers equal to the answer, and `tokens`, the
    share of answer tokens predicted right with the answer so far given (teacher forcing:
    partial copying shows here before whole answers come out right)."""
    import torch

    exact: dict[str, list[bool]] = {}
    tokens: dict[str, list[float]] = {}
    model.eval()
    with torch.no_grad():
        for task in tasks:
            ids, targets = reading_ids(chat, task)
            start = len(ids) - sum(t != -100 for t in targets)
            logits = model(input_ids=torch.tensor([ids])).logits[0, start - 1:-1]
            right = (logits.argmax(-1) == torch.tensor(ids[start:])).float().mean().item()
            tokens.setdefault(task.kind, []).append(right)
            prompt = torch.tensor([ids[:start]])
            out = model.generate(prompt, max_new_tokens=len(ids) - start + 4, do_sample=False,
                                 eos_token_id=chat.im_end_id, pad_token_id=chat.pad_id)
            text = chat.tokenizer.decode(out[0, start:], skip_special_tokens=True)
            exact.setdefault(task.kind, []).append(text.strip() == task.answer)
    return {kind: {"exact": sum(exact[kind]) / len(exact[kind]),
                   "tokens": round(sum(tokens[kind]) / len(tokens[kind]), 4)}
            for kind in sorted(exact)}
