"""bench/long_horizon.py's `--scores-from`: the base and clone scores of an earlier invocation
are reused only where that invocation scored the same clones on the same tasks."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.long_horizon import earlier_scores

SCORES = {"base": {"textcraft-d1": 0.1}, "bc": {"textcraft-d1": 0.6},
          "bc+rl": {"textcraft-d1": 0.7}}


def source(run_dir: str, **header) -> dict:
    return {"tasks": 48, "max_turns": 30, "samples": 1, **header,
            "per_seed": {"1": {"run_dir": run_dir,
                               "eval": {"train-new": SCORES, "eval": SCORES}}}}


def ask(src: dict, warm: Path, splits=("train-new", "eval"), **over) -> dict:
    kw = {"tasks": 48, "max_turns": 30, "samples": 1, **over}
    return earlier_scores(src, 1, warm, splits=list(splits), **kw)


def test_the_clones_own_scores_are_taken_and_the_rl_score_is_not(tmp_path: Path) -> None:
    warm = tmp_path / "tc-s"
    got = ask(source(str(warm / "seed1" / "textcraft__1__x")), warm)
    assert set(got) == {"train-new", "eval"}
    assert got["eval"] == {"base": {"textcraft-d1": 0.1}, "bc": {"textcraft-d1": 0.6}}


def test_scores_of_another_warm_start_are_refused(tmp_path: Path) -> None:
    src = source(str(tmp_path / "other" / "seed1" / "textcraft__1__x"))
    with pytest.raises(SystemExit, match="not the clone under"):
        ask(src, tmp_path / "tc-s")


@pytest.mark.parametrize("over", [{"tasks": 100}, {"max_turns": 20}, {"samples": 2}])
def test_scores_on_other_tasks_are_refused(tmp_path: Path, over: dict) -> None:
    warm = tmp_path / "tc-s"
    with pytest.raises(SystemExit, match="other tasks"):
        ask(source(str(warm / "seed1" / "r")), warm, **over)


def test_a_missing_seed_or_split_is_refused(tmp_path: Path) -> None:
    warm = tmp_path / "tc-s"
    src = source(str(warm / "seed1" / "r"))
    with pytest.raises(SystemExit, match="no seed 2"):
        earlier_scores(src, 2, warm, splits=["eval"], tasks=48, max_turns=30, samples=1)
    del src["per_seed"]["1"]["eval"]["eval"]
    with pytest.raises(SystemExit, match=r"no \['eval'\] scores"):
        ask(src, warm)
