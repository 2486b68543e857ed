"""bench/capacity.py on hand-made `bench/long_horizon.py` results: per-preset rows, the seeds
where RL beats BC, and the size and credit deltas on the seeds both sides have."""

from __future__ import annotations

import json

import pytest

from bench.capacity import deltas, mark, markdown, preset_rows
from bench.credit_compare import merge_results


def results(tmp_path, name: str, seeds: dict[str, tuple[float, float, float]], **extra) -> str:
    """A results folder: seed -> (base, bc, bc+rl) on one env label."""
    per_seed = {s: {"eval": {"eval": {"base": {"babyai": b}, "bc": {"babyai": c},
                                      "bc+rl": {"babyai": r}}},
                    "wall_seconds": 100.0, "resumed": False, "warm_start_from": None,
                    "warm_start_seconds": 40.0, "train_success": [0.1] * 10 + [0.3] * 10,
                    **extra}
                for s, (b, c, r) in seeds.items()}
    folder = tmp_path / name
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps({"command": name, "per_seed": per_seed}))
    return str(folder)


@pytest.fixture
def presets(tmp_path):
    xs_grpo = merge_results(",".join([
        results(tmp_path, "xs-grpo", {"0": (0.0, 0.30, 0.34)}),
        results(tmp_path, "xs-grpo-s12", {"1": (0.02, 0.26, 0.26), "2": (0.01, 0.32, 0.36)})]))
    xs_gigpo = merge_results(results(tmp_path, "xs-gigpo", {
        "0": (0.0, 0.30, 0.36), "1": (0.02, 0.26, 0.30), "2": (0.01, 0.32, 0.38)},
        warm_start_from="xs-grpo"))
    s_grpo = merge_results(results(tmp_path, "s-grpo", {
        "0": (0.1, 0.30, 0.40), "1": (0.1, 0.36, 0.34)}))
    s_gigpo = merge_results(results(tmp_path, "s-gigpo", {"0": (0.1, 0.31, 0.45)}))
    return {"xs": preset_rows({"grpo": xs_grpo, "gigpo": xs_gigpo}, "eval"),
            "s": preset_rows({"grpo": s_grpo, "gigpo": s_gigpo}, "eval")}


def test_preset_rows_merge_invocations_and_count_wins(presets):
    xs = presets["xs"]
    assert xs["bc"]["babyai"]["per_seed"] == {"0": 0.30, "1": 0.26, "2": 0.32}
    assert xs["bc"]["babyai"]["mean"] == pytest.approx(0.88 / 3, abs=1e-4)
    grpo = xs["methods"]["grpo"]
    assert grpo["bc+rl"]["babyai"]["mean"] == pytest.approx(0.32)
    assert grpo["rl_beats_bc_seeds"]["babyai"] == 2  # seed 1 ties: not a win
    assert xs["methods"]["gigpo"]["rl_beats_bc_seeds"]["babyai"] == 3
    assert grpo["train_success_first_last_10"]["0"] == [0.1, 0.3]
    assert xs["bc_disagreements"] == []
    assert mark(xs["methods"]["gigpo"], "0") == "†" and mark(grpo, "0") == ""


def test_a_clone_that_differs_between_methods_is_recorded(presets):
    (d,) = presets["s"]["bc_disagreements"]  # s/gigpo's seed-0 BC is 0.31, grpo's 0.30
    assert (d["method"], d["seed"], d["kept"], d["this"]) == ("gigpo", "0", 0.30, 0.31)
    assert presets["s"]["bc"]["babyai"]["per_seed"]["0"] == 0.30


def test_deltas_on_common_seeds(presets):
    moved = deltas(presets)
    size = moved["size"]["xs->s"]
    # BC: seeds 0 and 1 in both; (0.30 - 0.30 + 0.36 - 0.26) / 2
    assert size["bc"]["babyai"] == {"seeds": ["0", "1"], "mean": pytest.approx(0.05)}
    # GRPO: (0.40 - 0.34 + 0.34 - 0.26) / 2
    assert size["grpo"]["babyai"]["mean"] == pytest.approx(0.07)
    assert size["gigpo"]["babyai"] == {"seeds": ["0"], "mean": pytest.approx(0.09)}
    # credit at xs: gigpo - grpo per seed 0.02, 0.04, 0.02 (the file keeps 4 places)
    credit = moved["credit"]["xs"]["grpo->gigpo"]["babyai"]["mean"]
    assert credit == pytest.approx(0.08 / 3, abs=1e-4)
    assert moved["credit"]["s"]["grpo->gigpo"]["babyai"]["seeds"] == ["0"]
    text = markdown("maze", "eval", presets, moved)
    assert "| babyai | s | 0.100 ± 0.000 (2) | 0.330 ± 0.030 (2) |" in text
