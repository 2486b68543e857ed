"""DeepSearchEnv: the generated world, BM25 and HTTP retrieval, oracle vs random, bad input."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from horizonrl.envpool.base import EVAL_SEED_OFFSET, MAX_ACTION_CHARS, TextEnv
from horizonrl.envpool.deepsearch import (
    SYSTEM_PROMPT,
    DeepSearchEnv,
    HTTPRetriever,
    Passage,
    Retriever,
    RetrieverError,
    build_world,
    format_action,
    parse_action,
    random_action,
)
from horizonrl.envpool.deepsearch.env import normalize_answer, read_fact, shared_bm25, token_f1
from horizonrl.envpool.deepsearch.world import RELATION
from horizonrl.envpool.registry import make_env

ROOT = Path(__file__).resolve().parents[2]
EVAL_SEEDS = range(EVAL_SEED_OFFSET, EVAL_SEED_OFFSET + 60)  # 15 questions per hop count
INFO_KEYS = {"invalid_action", "success", "f1", "hops", "question", "question_id", "turn",
             "retrieved_titles"}


def _run(env: DeepSearchEnv, policy, seeds, *, rng_seed: int = 0) -> dict[int, list[bool]]:
    """Per hop count, whether each episode succeeded; every action goes through the reply
    format and the parser, as a model's would."""
    rng = random.Random(rng_seed)
    wins: dict[int, list[bool]] = {}
    for seed in seeds:
        _, info = env.reset(seed=seed)
        for _ in range(env.max_turns):
            result = env.step(parse_action(format_action(policy(env, info, rng))))
            info = result.info
            if result.terminated or result.truncated:
                break
        wins.setdefault(info["hops"], []).append(info["success"])
    return wins


_DIGEST = (
    "import hashlib; from envpool.deepsearch import build_world; w = build_world(0); "
    "print(hashlib.sha256(repr((w.passages, w.train, w.eval)).encode()).hexdigest())"
)


def _rates(wins: dict[int, list[bool]]) -> dict[int, float]:
    return {hops: sum(w) / len(w) for hops, w in sorted(wins.items())}


def test_world_is_deterministic_sized_and_split():
    start = time.perf_counter()
    fresh = build_world.__wrapped__(0)  # bypass the per-process cache
    seconds = time.perf_counter() - start
    print(f"world build: {seconds:.2f}s, {len(fresh.passages)} passages, "
          f"{len(fresh.train)} train + {len(fresh.eval)} eval questions")
    assert seconds < 4.0  # ~0.2 s measured; slack for a loaded machine
    world = build_world(0)
    assert fresh.passages == world.passages
    assert fresh.train == world.train and fresh.eval == world.eval
    assert build_world.__wrapped__(1).passages != world.passages
    # ... and in another process with another hash seed (no set or dict order leaks in).
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    other = subprocess.run([sys.executable, "-c", _DIGEST], capture_output=True, text=True,
                           env=env, cwd=ROOT, timeout=60, check=True).stdout.strip()
    here = repr((world.passages, world.train, world.eval)).encode()
    assert other == hashlib.sha256(here).hexdigest()
    assert 2_000 <= len(world.passages) <= 6_000
    assert len(world.train) + len(world.eval) >= 3_000
    assert not {q.id for q in world.train} & {q.id for q in world.eval}
    for split in ("train", "eval"):
        questions = world.questions(split)
        assert Counter(q.hops for q in questions).keys() == {1, 2, 3, 4}
        assert [q.hops for q in questions[:8]] == [1, 2, 3, 4, 1, 2, 3, 4]  # interleaved
    kinds = Counter(world.entities.values())
    assert set(kinds) == {"person", "city", "country", "company", "film", "university"}
    assert len({p.id for p in world.passages}) == len(world.passages)


def test_questions_need_their_hops():
    world = build_world(0)
    by_id = {p.id: p for p in world.passages}
    for q in world.train + world.eval:
        assert len(q.chain) == q.hops and q.chain[-1].answer == q.answer
        assert q.chain[0].subject in q.text
        assert not re.search(rf"\b{re.escape(q.answer.lower())}\b", q.text.lower())
        for hop, nxt in zip(q.chain, q.chain[1:]):
            assert hop.answer == nxt.subject
        for hop in q.chain:  # each hop's fact is written in its gold passage, in sentence form
            relation = RELATION[hop.relation]
            assert read_fact(by_id[hop.passage_id].text, hop.subject, relation) == hop.answer
    bm25 = shared_bm25(0)
    one_hop = [q for q in world.eval if q.hops == 1]
    hits = sum(q.chain[0].passage_id in {p.id for p in bm25.search(q.chain[0].query, 3)}
               for q in one_hop)
    print(f"1-hop gold passage in BM25 top-3: {hits}/{len(one_hop)}")
    assert hits >= 0.9 * len(one_hop)
    # Searching a multi-hop question as written does not reach the passage with its answer.
    multi = [q for q in world.eval if q.hops >= 2][:200]
    direct = sum(q.chain[-1].passage_id in {p.id for p in bm25.search(q.text, 3)} for q in multi)
    print(f"multi-hop question text finds the final gold passage: {direct}/{len(multi)}")
    assert direct <= 0.1 * len(multi)


def test_reset_is_deterministic_and_follows_splits_and_hops():
    env_a, env_b = DeepSearchEnv(), DeepSearchEnv()
    assert isinstance(env_a, TextEnv) and env_a.retriever is env_b.retriever  # one shared index
    for seed in (0, 5, EVAL_SEED_OFFSET + 7):
        assert env_a.reset(seed=seed) == env_b.reset(seed=seed)
    obs, info = env_a.reset(seed=EVAL_SEED_OFFSET + 2)
    assert set(info) >= INFO_KEYS and info["split"] == "eval"
    assert not info["invalid_action"] and not info["success"] and info["turn"] == 0
    assert obs.endswith(f"Question: {info['question']}")
    assert "Thought:" in SYSTEM_PROMPT and "search[" in SYSTEM_PROMPT
    two = DeepSearchEnv(hops=(2,))
    assert {two.reset(seed=s)[1]["hops"] for s in range(20)} == {2}
    train_ids = {env_a.reset(seed=s)[1]["question_id"] for s in range(50)}
    eval_ids = {env_a.reset(seed=EVAL_SEED_OFFSET + s)[1]["question_id"] for s in range(50)}
    assert len(train_ids) == 50 and not train_ids & eval_ids


def test_oracle_solves_chains_and_random_does_not():
    env = DeepSearchEnv(max_turns=8)
    queries: dict[str, list[str]] = {}

    def oracle(env: DeepSearchEnv, info: dict, rng: random.Random) -> str:
        action = env.oracle_action()
        if action.startswith("search["):
            queries.setdefault(info["question_id"], []).append(action[len("search[") : -1])
        return action

    oracle_rates = _rates(_run(env, oracle, EVAL_SEEDS))
    random_wins = _run(env, lambda e, info, rng: random_action(info, rng), EVAL_SEEDS)
    random_rates = _rates(random_wins)
    print(f"exact match per hop: oracle {oracle_rates}, random {random_rates}")
    assert set(oracle_rates) == {1, 2, 3, 4}
    assert all(rate >= 0.9 for rate in oracle_rates.values())
    assert sum(sum(w) for w in random_wins.values()) < 0.1 * len(EVAL_SEEDS)
    for seed in EVAL_SEEDS[:12]:  # the oracle issues exactly the gold queries, in order
        question = env.reset(seed=seed)[1]["question_id"]
        gold = [h.query for h in env.question.chain]
        assert queries[question] == gold


def test_oracle_answers_from_retrieval_not_from_the_gold_chain():
    class Unhelpful:
        """Always the same passage, never the fact asked for."""

        def search(self, query: str, k: int) -> list[Passage]:
            return [Passage("x", "Nowhere", "Nothing is known about this place.")]

    assert isinstance(Unhelpful(), Retriever)
    env = DeepSearchEnv(retriever=Unhelpful())
    rates = _rates(_run(env, lambda e, info, rng: e.oracle_action(), EVAL_SEEDS[:8]))
    assert all(rate == 0.0 for rate in rates.values())
    env.reset(seed=EVAL_SEED_OFFSET)
    env.step(env.oracle_action())
    assert env.oracle_action() == "answer[unknown]"


def test_both_action_syntaxes_parse_and_act_alike():
    cases = {
        "Thought: look it up.\nAction: search[Vorak Telnu  born in]": "search[Vorak Telnu born in]",
        "Action: SEARCH [x y]": "search[x y]",
        "Thought: ok\n<search>\n  capital of Jesta </search>": "search[capital of Jesta]",
        "Action: <answer>Kreindrain Labs</answer>": "answer[Kreindrain Labs]",
        "<search>a</search> then <answer> Zed </answer>": "answer[Zed]",
        "Thought: no idea\nAction: dance": "dance",
    }
    for reply, action in cases.items():
        assert parse_action(reply) == action, reply
    assert parse_action(None) == ""  # type: ignore[arg-type]
    for action in ("search[Losgul Lantern directed by]", "answer[Some Name]"):
        assert parse_action(format_action(action)) == action
    env = DeepSearchEnv()
    env.reset(seed=3)
    query = env.question.chain[0].query
    bracket = env.step(f"search[{query}]")
    tagged = env.step(f"<search>{query}</search>")
    assert bracket.observation.split("\n")[:-1] == tagged.observation.split("\n")[:-1]
    assert not tagged.info["invalid_action"] and tagged.info["turn"] == 2
    assert env.question.chain[0].subject in tagged.info["retrieved_titles"]
    result = env.step(f"<answer>{env.question.answer}</answer>")
    assert result.terminated and result.reward == 1.0 and result.info["success"]


def test_answer_normalisation_and_f1():
    assert normalize_answer("  The KREINDRAIN-labs. ") == "kreindrain labs"
    assert token_f1("Kreindrain Labs", "Kreindrain Group") == pytest.approx(0.5)
    assert token_f1("", "x") == 0.0
    env = DeepSearchEnv()
    env.reset(seed=EVAL_SEED_OFFSET + 1)
    answer = env.question.answer
    right = env.step(f"answer[the {answer.upper()}!]")
    assert right.reward == 1.0 and right.info["f1"] == 1.0
    env.reset(seed=EVAL_SEED_OFFSET + 1)
    wrong = env.step(f"answer[{answer} Extra]")
    assert wrong.terminated and wrong.reward == 0.0 and 0 < wrong.info["f1"] < 1
    again = env.step(f"answer[{answer}]")  # the episode is over: invalid, never a second reward
    assert again.info["invalid_action"] and again.reward == 0.0 and again.terminated


def _malformed(rng: random.Random, i: int) -> str:
    """One of several kinds of bad action, chosen by `i`."""
    kind = i % 10
    if kind == 0:
        return ""
    if kind == 1:
        return " " * rng.randint(1, 5) + "\t\n"
    if kind == 2:
        return rng.choice(["search[]", "answer[ ]", "<search></search>", "<answer>\n</answer>",
                           "search[   ]", "Search [\t]"])
    if kind == 3:
        return rng.choice(["search[foo", "answer]x[", "<search>x</answer>", "find[x]",
                           "search foo", "answer: x", "<search>x", "search(x)"])
    if kind == 4:
        return bytes(rng.randrange(256) for _ in range(rng.randint(1, 64))).decode(
            "utf-8", errors="replace")
    if kind == 5:
        return "".join(chr(rng.randrange(32)) for _ in range(rng.randint(1, 20)))
    if kind == 6:
        return "search[" + "a" * (MAX_ACTION_CHARS + rng.randint(0, 10)) + "]"
    if kind == 7:
        return "x" * 1_000_000
    if kind == 8:
        return "".join(chr(rng.randrange(0x20, 0x3000)) for _ in range(rng.randint(1, 80)))
    return "Thought: " + " ".join(rng.choice(["search", "answer", "[", "]", "the"])
                                  for _ in range(rng.randint(1, 6)))


def test_malformed_actions_never_raise_and_use_the_turn():
    env = DeepSearchEnv(max_turns=5)
    rng = random.Random(0)
    env.reset(seed=0)
    start = time.perf_counter()
    for i in range(1000):
        if i % 5 == 0:
            env.reset(seed=i)
        result = env.step(_malformed(rng, i))
        assert result.observation.startswith("Invalid action"), repr(result.observation)
        assert result.info["invalid_action"] and result.reward == 0.0
        assert result.info["turn"] == i % 5 + 1
        assert result.truncated == (i % 5 == 4) and not result.terminated
    print(f"1000 malformed actions: {time.perf_counter() - start:.2f}s")
    after = env.step("search[anything]")  # truncated: nothing more runs
    assert after.info["invalid_action"] and after.truncated
    with DeepSearchEnv() as fresh:
        with pytest.raises(RuntimeError):
            fresh.step("search[x]")


def test_registry_builds_the_env():
    env = make_env("deepsearch", hops=(1,), top_k=2)
    obs, info = env.reset(seed=0)
    assert info["hops"] == 1 and "Question:" in obs
    result = env.step("search[capital]")
    assert len(result.info["retrieved_titles"]) == 2


class _SearchHandler(BaseHTTPRequestHandler):
    """A tiny search service: BM25 over world 0, or a failure on path /broken."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/broken":
            self.send_response(500)
            self.end_headers()
            return
        hits = shared_bm25(0).search(body["query"], body["k"])
        data = json.dumps({"passages": [{"id": p.id, "title": p.title, "text": p.text}
                                        for p in hits]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:  # keep test output quiet
        pass


def test_http_retriever_against_a_local_service(free_port):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _SearchHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        remote = DeepSearchEnv(retriever=HTTPRetriever(f"{base}/search", timeout_s=5))
        local = DeepSearchEnv()
        wins = _run(remote, lambda e, info, rng: e.oracle_action(), EVAL_SEEDS[:4])
        assert all(all(w) for w in wins.values())
        for env in (remote, local):
            env.reset(seed=9)
        query = local.question.chain[0].query
        assert remote.step(f"search[{query}]") == local.step(f"search[{query}]")
        with pytest.raises(RetrieverError):
            HTTPRetriever(f"{base}/broken", timeout_s=5).search("x", 3)
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(RetrieverError):  # nobody listens there
        HTTPRetriever(f"http://127.0.0.1:{free_port()}/search", timeout_s=2).search("x", 3)
    with pytest.raises(ValueError):
        HTTPRetriever("file:///etc/passwd")
