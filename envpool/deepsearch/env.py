"""Deep Search: answer multi-hop questions about a fictional world by calling a search tool.

Each episode is one question from the world's fixed train or eval list (see world.py). The agent
searches (`search[query]`, or AgentGym's `<search>query</search>`) and sees the top-k passages,
then answers once (`answer[text]` / `<answer>text</answer>`); the reward is exact match after
normalisation, with token F1 in the info.

    env = DeepSearchEnv(world_seed=0, hops=(1, 2))
    obs, info = env.reset(seed=1_000_003)
    result = env.step(parse_action(model_text))
"""

from __future__ import annotations

import random
import re
from collections import Counter
from functools import lru_cache
from typing import Any, Self

from horizonrl.envpool.base import MAX_ACTION_CHARS, StepResult, parse_agentgym_action, task_split
from horizonrl.envpool.deepsearch.retriever import BM25Retriever, Passage, Retriever
from horizonrl.envpool.deepsearch.world import RELATION, Question, Relation, build_world

SYSTEM_PROMPT = (
    "You answer questions about a fictional world; every name is invented, so only the search "
    "results can tell you the answer. Each turn, reply in exactly this format, one line per "
    "field:\n"
    "Thought: <your reasoning>\n"
    "Action: <action>\n"
    "The action is either search[<query>], which returns the top passages for the query, or "
    "answer[<name>], which gives your final answer (just the name) and ends the episode. "
    "A question may need several searches: find one fact, then search for the next."
)

_BRACKET_RE = re.compile(r"(search|answer)\s*\[(.*)\]", re.IGNORECASE | re.DOTALL)
_TAG_RE = re.compile(r"<(search|answer)>(.*?)</\1>", re.IGNORECASE | re.DOTALL)
_NAME = r"([A-Z][A-Za-z]*(?: [A-Z][A-Za-z]*)*)"  # world names are Title Case words
_ARTICLES = frozenset({"a", "an", "the"})
_USAGE = "Use search[query] or answer[text]."


def _split(action: str) -> tuple[str, str] | None:
    """(verb, argument) for one whole action in either syntax; whitespace collapsed."""
    action = action.strip()
    match = _BRACKET_RE.fullmatch(action) or _TAG_RE.fullmatch(action)
    if match is None:
        return None
    return match.group(1).lower(), " ".join(match.group(2).split())


def parse_action(text: str) -> str:
    """The action in a model's reply as `search[query]` or `answer[text]`. Never raises.

    Reads the "Action:" line (base.parse_agentgym_action); failing that, the last
    <search>/<answer> tag anywhere in the reply (Search-R1 style, possibly over several lines).
    Anything else comes back as the parsed line, which the env then rejects as invalid.
    """
    if not isinstance(text, str):
        return ""
    line = parse_agentgym_action(text)
    found = _split(line)
    if found is None:
        tags = list(_TAG_RE.finditer(text[: MAX_ACTION_CHARS * 4]))
        if tags:
            found = tags[-1].group(1).lower(), " ".join(tags[-1].group(2).split())
    return f"{found[0]}[{found[1]}]" if found else line


def format_action(action: str) -> str:
    """How a well-formed reply carries `action` (AgentGym's "Action: <action>" style)."""
    return f"Action: {action}"


def normalize_answer(text: str) -> str:
    """Lowercase, punctuation to spaces, articles dropped, whitespace collapsed (SQuAD-style)."""
    text = "".join(ch if ch.isalnum() else " " for ch in text.lower())
    return " ".join(w for w in text.split() if w not in _ARTICLES)


def token_f1(prediction: str, gold: str) -> float:
    """Token-overlap F1 between normalised answers."""
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def read_fact(text: str, subject: str, relation: Relation) -> str | None:
    """The object of `relation` for `subject` if `text` states it in the world's sentence form."""
    pattern = re.escape(relation.sentence)
    pattern = pattern.replace(re.escape("{s}"), r"(?<!\w)" + re.escape(subject))
    match = re.search(pattern.replace(re.escape("{o}"), _NAME), text)
    return match.group(1) if match else None


@lru_cache(maxsize=4)
def shared_bm25(world_seed: int) -> BM25Retriever:
    """One BM25 index per world seed per process, shared by every env instance."""
    return BM25Retriever(build_world(world_seed).passages)


class DeepSearchEnv:
    """Multi-hop question answering with a search tool, as a `TextEnv` (see envpool/base.py).

    Task seeds pick a question from the world's fixed train or eval list, restricted to `hops`.
    A search or an answer each use one turn, invalid actions too; the episode is truncated after
    `max_turns` turns without an answer. `retriever` defaults to BM25 over the world's passages;
    an `HTTPRetriever` should serve that same corpus (`build_world(world_seed).passages`).
    """

    env_name = "deepsearch"

    def __init__(
        self,
        world_seed: int = 0,
        hops: tuple[int, ...] = (1, 2, 3, 4),
        top_k: int = 3,
        retriever: Retriever | None = None,
        *,
        max_turns: int = 10,
        max_passage_chars: int = 300,
    ) -> None:
        hops = tuple(sorted(set(hops)))
        if not hops or not set(hops) <= {1, 2, 3, 4}:
            raise ValueError(f"hops must be a non-empty subset of 1..4, got {hops}")
        if top_k < 1 or max_turns < 1 or max_passage_chars < 20:
            raise ValueError(
                f"need top_k >= 1, max_turns >= 1, max_passage_chars >= 20; got {top_k}, "
                f"{max_turns}, {max_passage_chars}"
            )
        self.world = build_world(world_seed)
        self.hops = hops
        self.top_k = top_k
        self.max_turns = max_turns
        self.max_passage_chars = max_passage_chars
        self.retriever: Retriever = retriever if retriever is not None else shared_bm25(world_seed)
        self._tasks = {split: [q for q in self.world.questions(split) if q.hops in hops]
                       for split in ("train", "eval")}
        self._question: Question | None = None
        self._split = "train"
        self._turn = 0
        self._terminated = self._truncated = False
        self._success = False
        self._f1 = 0.0
        self._titles: list[str] = []
        self._last_query: str | None = None
        self._last_obs = ""
        # The scripted agent's progress: hops read so far, the entity it holds, its open query.
        self._oracle_hop = 0
        self._oracle_subject = ""
        self._oracle_query: str | None = None
        self._oracle_failed = False

    @property
    def question(self) -> Question:
        """This episode's question (with its gold chain; never shown to the agent)."""
        if self._question is None:
            raise RuntimeError("call reset() first")
        return self._question

    # ----------------------------------------------------------------------------- gym API
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Start the episode for task `seed`; the same seed always gives the same question."""
        self._split, index = task_split(seed)
        tasks = self._tasks[self._split]
        self._question = tasks[index % len(tasks)]
        self._turn, self._success, self._f1 = 0, False, 0.0
        self._terminated = self._truncated = False
        self._titles, self._last_query, self._last_obs = [], None, ""
        self._oracle_hop, self._oracle_subject = 0, self._question.chain[0].subject
        self._oracle_query, self._oracle_failed = None, False
        obs = (
            "Answer the question about a fictional world. search[query] shows the top "
            f"{self.top_k} passages for a query; answer[name] gives your final answer. You have "
            f"{self.max_turns} turns.\nQuestion: {self._question.text}"
        )
        return obs, self._info(invalid=False)

    def step(self, action: str) -> StepResult:
        """Run one search or answer. Never raises on any string."""
        question = self.question
        if self._terminated or self._truncated:
            return self._invalid("the episode is over", count_turn=False)
        # Length first: a runaway 1 MB generation is rejected without being parsed.
        ok = isinstance(action, str) and len(action) <= MAX_ACTION_CHARS
        found = _split(action) if ok else None
        if found is None:
            reason = "too long" if isinstance(action, str) and not ok else "unrecognised action"
            return self._invalid(reason)
        verb, arg = found
        if not arg:
            return self._invalid(f"empty {'query' if verb == 'search' else 'answer'}")
        self._turn += 1
        if verb == "answer":
            self._terminated = True
            self._success = normalize_answer(arg) == normalize_answer(question.answer)
            self._f1 = token_f1(arg, question.answer)
            obs = f"Your answer: {arg}. " + ("Correct." if self._success else "Incorrect.")
            return StepResult(obs, float(self._success), True, False, self._info(invalid=False))
        passages = self.retriever.search(arg, self.top_k)[: self.top_k]
        self._titles = [p.title for p in passages]
        self._last_query, self._last_obs = arg, self._render(arg, passages)
        return self._result(self._last_obs, invalid=False)

    def oracle_action(self) -> str:
        """The scripted agent's next action: the gold hop queries in order, then the answer.

        It reads each hop's object out of what its search actually returned (the world's
        sentence for that fact, about the entity it holds), builds the next query from it, and
        answers "unknown" as soon as a search did not show the fact, so its score measures
        whether the retriever supports the whole chain.
        """
        question = self.question
        if self._terminated or self._truncated:
            return "answer[unknown]"
        chain = question.chain
        if self._oracle_query is not None and self._oracle_query == self._last_query:
            relation = RELATION[chain[self._oracle_hop].relation]
            found = read_fact(self._last_obs, self._oracle_subject, relation)
            self._oracle_query = None
            if found is None:
                self._oracle_failed = True
            else:
                self._oracle_subject, self._oracle_hop = found, self._oracle_hop + 1
        if self._oracle_failed:
            return "answer[unknown]"
        if self._oracle_hop == len(chain):
            return f"answer[{self._oracle_subject}]"
        relation = RELATION[chain[self._oracle_hop].relation]
        self._oracle_query = relation.query.format(s=self._oracle_subject)
        return f"search[{self._oracle_query}]"

    def close(self) -> None:
        """Nothing to release: the world and the BM25 index are shared per process."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------------------- internals
    def _render(self, query: str, passages: list[Passage]) -> str:
        lines = [f'Search results for "{query}":']
        for i, p in enumerate(passages, 1):
            text = p.text if len(p.text) <= self.max_passage_chars else (
                p.text[: self.max_passage_chars - 3].rstrip() + "...")
            lines.append(f"[{i}] {p.title[:100]}: {text}")
        if not passages:
            lines.append("No passage matches this query.")
        return "\n".join(lines)

    def _result(self, obs: str, *, invalid: bool) -> StepResult:
        self._truncated = self._turn >= self.max_turns
        left = self.max_turns - self._turn
        if not self._truncated:
            obs += f"\n({left} turn{'s' if left != 1 else ''} left)"
        return StepResult(obs, 0.0, False, self._truncated, self._info(invalid=invalid))

    def _invalid(self, reason: str, *, count_turn: bool = True) -> StepResult:
        obs = f"Invalid action ({reason}). {_USAGE}"
        if not count_turn:
            return StepResult(obs, 0.0, self._terminated, self._truncated,
                              self._info(invalid=True))
        self._turn += 1
        return self._result(obs, invalid=True)

    def _info(self, *, invalid: bool) -> dict[str, Any]:
        """The step's info. `state_key` (GiGPO's anchor state, actors/rollout.state_key) is the
        last search's results (the question before any) without the "(n turns left)" counter,
        which would split equal results by turn; an invalid action keeps the key."""
        question = self.question
        return {
            "state_key": self._last_obs or f"Question: {question.text}",
            "invalid_action": invalid,
            "success": self._success,
            "f1": self._f1,
            "hops": question.hops,
            "question": question.text,
            "question_id": question.id,
            "split": self._split,
            "turn": self._turn,
            "retrieved_titles": list(self._titles),
        }


def vocabulary(world_seed: int = 0, **_: Any) -> list[str]:
    """Every word of the world's entity names (~1.1k for the default world), for a tokenizer
    that keeps them whole: each answer and most query words are copied from a passage."""
    return sorted({word for name in build_world(world_seed).entities for word in name.split()})


def random_action(info: dict[str, Any], rng: random.Random) -> str:
    """A random agent: searches a few words of the question, sometimes answers a random entity
    (a title from its last search or a name in the question)."""
    question = str(info.get("question", ""))
    words = re.findall(r"[A-Za-z]+", question) or ["question"]
    names = list(info.get("retrieved_titles") or []) + re.findall(_NAME, question)
    if not names or rng.random() < 0.6:
        size = min(len(words), rng.randint(1, 3))
        return f"search[{' '.join(rng.sample(words, size))}]"
    return f"answer[{rng.choice(names)}]"
