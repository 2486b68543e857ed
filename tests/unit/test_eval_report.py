"""The eval report: every file written, the numbers in the tables, plots that are real images."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from horizonrl.cluster.eval.metrics import EpisodeRecord, summarise
from horizonrl.cluster.eval.report import PLOTS, markdown, write_report

pytest.importorskip("matplotlib")


def records(models: tuple[str, ...], *, seed: int = 0) -> list[EpisodeRecord]:
    """models x 2 envs x budgets 4 and 8 x 3 tasks x 4 samples; babyai knows its goal turn."""
    rng = random.Random(seed)
    out = []
    for m in models:
        for env in ("babyai", "textcraft"):
            for mt in (4, 8):
                for t in range(3):
                    for s in range(4):
                        n = rng.randint(1, mt)
                        ok = rng.random() < (0.7 if m == "trained" else 0.3)
                        out.append(EpisodeRecord(
                            model=m, env=env, task_id=f"t{t}", seed=s, sample=s, max_turns=mt,
                            success=ok, reward=float(ok), num_turns=n,
                            actions=tuple(rng.choice(["go", "look"]) for _ in range(n)),
                            invalid_actions=rng.randint(0, n), failure="",
                            goal_turn=rng.randint(0, n) if ok and env == "babyai" else None))
    return out


@pytest.fixture(scope="module")
def compare_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, list[Path]]:
    results = summarise(records(("base", "trained")), ks=[1, 2, 4])
    return results, write_report(results, tmp_path_factory.mktemp("report"))


def test_write_report_creates_every_file(compare_report: tuple[dict, list[Path]]) -> None:
    results, paths = compare_report
    assert [p.name for p in paths] == ["results.json", "results.md", *PLOTS]
    assert all(p.is_file() for p in paths)
    assert json.loads(paths[0].read_text()) == results


def test_markdown_contains_the_numbers(compare_report: tuple[dict, list[Path]]) -> None:
    results, paths = compare_report
    md = paths[1].read_text()
    for heading in ("## Accuracy per env", "## Accuracy against the horizon", "## pass@K against K",
                    "## Interaction statistics"):
        assert heading in md
    for model in ("base", "trained"):
        for env in ("babyai", "textcraft"):
            for mt in ("4", "8"):
                cell = results[model][env][mt]
                assert f"{cell['accuracy']:.3f}" in md
                assert f"{cell['pass_at_k']['4']['value']:.3f}" in md
                assert f"{cell['invalid_action_rate']:.3f}" in md
    a, b = (results[m]["babyai"]["8"]["accuracy"] for m in ("base", "trained"))
    assert f"| babyai | 8 | {a:.3f} | {b:.3f} | {b - a:+.3f} |" in md  # the per-env headline


def test_two_model_report_mentions_both_labels(compare_report: tuple[dict, list[Path]]) -> None:
    md = compare_report[1][1].read_text()
    assert "| env | horizon | base | trained |" in md
    assert "| babyai | 8 | base |" in md and "| babyai | 8 | trained |" in md


def test_plots_are_real_images(compare_report: tuple[dict, list[Path]]) -> None:
    import matplotlib.image

    for path in compare_report[1][2:]:
        img = matplotlib.image.imread(path)
        assert img.ndim == 3 and img.shape[0] >= 400 and img.shape[1] >= 600, path.name
        assert img[..., :3].std() > 0.05, f"{path.name} is nearly blank"


def test_single_model_report_has_no_comparison_column(tmp_path: Path) -> None:
    results = summarise(records(("base",)), ks=[1, 2])
    paths = write_report(results, tmp_path)
    md = paths[1].read_text()
    assert "| env | horizon | base |" in md
    assert "Δ" not in md and "trained" not in md
    from PIL import Image

    # Drawn plots: axes, text and series make many colours (a blank figure has one or two).
    assert all(len(Image.open(p).convert("RGB").getcolors(256) or ()) >= 8 for p in paths[2:])


def test_missing_cells_show_as_dashes() -> None:
    # The trained model was not run on textcraft: its cells must read "—", not 0.
    recs = [r for r in records(("base", "trained")) if (r.model, r.env) != ("trained", "textcraft")]
    md = markdown(summarise(recs, ks=[1]))
    assert "| textcraft | 8 | base |" in md
    assert "| textcraft | 8 | trained | — |" in md


def test_empty_results_still_write_a_report(tmp_path: Path) -> None:
    paths = write_report({}, tmp_path)
    assert "No episodes" in paths[1].read_text()
    assert all(p.is_file() for p in paths)
