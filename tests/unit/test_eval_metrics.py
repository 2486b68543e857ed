"""Evaluation metrics against numbers computed by hand."""

from __future__ import annotations

import dataclasses
import json
import math
import random
from fractions import Fraction

import pytest

from horizonrl.cluster.eval import metrics as em
from horizonrl.cluster.eval.metrics import EpisodeRecord


def rec(*, model: str = "base", env: str = "babyai", task: str = "t0", sample: int = 0,
        max_turns: int = 10, success: bool = False, actions: tuple[str, ...] = ("a",),
        invalid: int = 0, failure: str = "", goal_turn: int | None = None) -> EpisodeRecord:
    return EpisodeRecord(model=model, env=env, task_id=task, seed=sample, sample=sample,
                         max_turns=max_turns, success=success, reward=float(success),
                         num_turns=len(actions), actions=actions, invalid_actions=invalid,
                         failure=failure, goal_turn=goal_turn)


@pytest.mark.parametrize(("n", "c", "k", "expected"), [
    (5, 2, 1, 0.4),   # c / n
    (5, 2, 2, 0.7),   # 1 - C(3,2)/C(5,2) = 1 - 3/10
    (5, 2, 3, 0.9),   # 1 - C(3,3)/C(5,3) = 1 - 1/10
    (5, 0, 3, 0.0),
    (5, 5, 1, 1.0),
    (5, 1, 5, 1.0),   # k = n with a success: every draw of all samples contains it
    (4, 1, 2, 0.5),   # 1 - C(3,2)/C(4,2) = 1 - 3/6
])
def test_pass_at_k_hand_computed(n: int, c: int, k: int, expected: float) -> None:
    assert em.pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_matches_exact_binomials() -> None:
    for n in range(1, 13):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
                assert em.pass_at_k(n, c, k) == pytest.approx(float(exact), abs=1e-12)


def test_pass_at_k_is_stable_for_large_n() -> None:
    # C(1000, 500) overflows a float; the product form does not.
    exact = 1 - Fraction(math.comb(900, 500), math.comb(1000, 500))
    assert em.pass_at_k(1000, 100, 500) == pytest.approx(float(exact), rel=1e-9)
    assert em.pass_at_k(1000, 1, 1) == pytest.approx(0.001)


@pytest.mark.parametrize(("n", "c", "k"), [(5, 2, 6), (5, 2, 0), (5, 6, 1), (5, -1, 1)])
def test_pass_at_k_rejects_bad_arguments(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError):
        em.pass_at_k(n, c, k)


def test_pass_at_k_tasks_groups_by_task_and_budget() -> None:
    records = [
        rec(task="a", sample=0, success=True), rec(task="a", sample=1),
        rec(task="b", sample=0, success=True), rec(task="b", sample=1, success=True),
        # Same task id under another budget is another task: (0 + 0) samples succeed.
        rec(task="a", sample=0, max_turns=5), rec(task="a", sample=1, max_turns=5),
        # A failed episode adds no sample (task "a" at 10 turns keeps n=2, c=1).
        rec(task="a", sample=2, success=True, failure="env_error"),
    ]
    assert em.task_counts(records) == {("base", "babyai", "a", 5): (2, 0),
                                       ("base", "babyai", "a", 10): (2, 1),
                                       ("base", "babyai", "b", 10): (2, 2)}
    assert em.pass_at_k_tasks(records, 1) == pytest.approx((0 + 0.5 + 1) / 3)
    assert em.pass_at_k_tasks(records, 2) == pytest.approx((0 + 1 + 1) / 3)
    with pytest.raises(ValueError):
        em.pass_at_k_tasks(records, 3)


def test_pass_at_k_tasks_skips_tasks_left_short_by_failures() -> None:
    records = [rec(task="a", sample=0, success=True), rec(task="a", sample=1, failure="timeout"),
               rec(task="b", sample=0), rec(task="b", sample=1, success=True)]
    assert em.pass_at_k_tasks(records, 2) == pytest.approx(1.0)  # only task b has 2 samples
    assert em.pass_at_k_tasks(records, 1) == pytest.approx((1 + 0.5) / 2)


def hand_made() -> list[EpisodeRecord]:
    return [
        # 5 turns, 3 repeats (a a, b b, b b), 2 invalid, goal reachable after turn 3 -> 2 extra.
        rec(sample=0, success=True, actions=("a", "a", "b", "b", "b"), invalid=2, goal_turn=3),
        # 2 turns, no repeat, 1 invalid, goal unknown.
        rec(sample=1, actions=("x", "y"), invalid=1),
        # 2 turns ending on the goal: 0 extra turns.
        rec(sample=2, success=True, actions=("p", "q"), goal_turn=2),
        # Failed: would add 3 repeats, 4 invalid and 4 extra turns if it were counted.
        rec(sample=3, actions=("z",) * 4, invalid=4, failure="env_error", goal_turn=0),
        rec(sample=4, actions=(), failure="timeout"),
    ]


def test_metric_definitions_on_hand_made_records() -> None:
    records = hand_made()
    assert em.accuracy(records) == pytest.approx(2 / 3)
    assert em.mean_turns(records) == pytest.approx((5 + 2 + 2) / 3)
    assert em.repeated_action_rate(records) == pytest.approx(3 / 9)
    assert em.invalid_action_rate(records) == pytest.approx(3 / 9)
    turns_after, share, known = em.over_interaction(records)
    assert (turns_after, share, known) == (pytest.approx(1.0), pytest.approx(0.5), 2)
    assert em.failures(records) == {"env_error": 1, "timeout": 1}


def test_metrics_are_undefined_without_valid_episodes() -> None:
    records = [rec(failure="env_error")]
    assert em.accuracy(records) is None
    assert em.repeated_action_rate(records) is None
    assert em.invalid_action_rate(records) is None
    assert em.over_interaction(records) == (None, None, 0)


@pytest.mark.parametrize("bad", [
    {"actions": ("a", "b"), "num_turns": 3},
    {"invalid_actions": 4},
    {"invalid_actions": -1},
    {"goal_turn": 4},
])
def test_inconsistent_record_is_rejected(bad: dict) -> None:
    good = dataclasses.asdict(rec(actions=("a", "b", "c")))
    with pytest.raises(ValueError):
        EpisodeRecord(**{**good, **bad})


def test_record_round_trips_through_json() -> None:
    r = hand_made()[0]
    assert EpisodeRecord.from_dict(json.loads(json.dumps(dataclasses.asdict(r)))) == r


def grid() -> list[EpisodeRecord]:
    """2 models x 2 envs x budgets 5 and 20 x 3 tasks x 4 samples, outcomes from a fixed rng."""
    rng = random.Random(7)
    return [rec(model=m, env=e, task=f"t{t}", sample=s, max_turns=mt, success=rng.random() < 0.5,
                actions=tuple(rng.choice("ab") for _ in range(rng.randint(1, mt))),
                failure="env_error" if rng.random() < 0.05 else "")
            for m in ("trained", "base") for e in ("textcraft", "babyai") for mt in (20, 5)
            for t in range(3) for s in range(4)]


def test_summarise_nests_and_orders_deterministically() -> None:
    records = grid()
    results = em.summarise(records, ks=[8, 1, 2, 4])
    assert list(results) == ["base", "trained"]
    assert list(results["base"]) == ["babyai", "textcraft"]
    assert list(results["base"]["babyai"]) == ["5", "20"]  # numeric, not string order
    shuffled = records[:]
    random.Random(1).shuffle(shuffled)
    text = json.dumps(results)
    assert json.dumps(em.summarise(shuffled, ks=[1, 2, 4, 8])) == text
    assert json.loads(text) == results  # JSON-serialisable without loss


def test_summarise_cells_hold_the_metrics_of_their_records() -> None:
    records = grid()
    results = em.summarise(records, ks=[1, 4, 8])
    cell_records = [r for r in records if (r.model, r.env, r.max_turns) == ("trained",
                                                                            "textcraft", 5)]
    cell = results["trained"]["textcraft"]["5"]
    assert cell["accuracy"] == pytest.approx(em.accuracy(cell_records))
    assert cell["repeated_action_rate"] == pytest.approx(em.repeated_action_rate(cell_records))
    assert cell["episodes"] == len(em.valid(cell_records))
    assert cell["failed_episodes"] == len(cell_records) - cell["episodes"]
    assert cell["tasks"] == 3
    # 4 samples per task: pass@8 cannot be estimated and is left out.
    assert list(cell["pass_at_k"]) == ["1", "4"]
    assert cell["pass_at_k"]["1"]["value"] == pytest.approx(em.pass_at_k_tasks(cell_records, 1))


def test_summarise_rejects_k_below_one() -> None:
    with pytest.raises(ValueError):
        em.summarise(grid(), ks=[0, 1])
