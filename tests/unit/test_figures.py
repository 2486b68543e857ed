"""The recorded command of a results file runs again as it was typed, and bench/figures.py finds
who wrote what, broken links, and the order to rerun in."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from bench import figures
from horizonrl.cluster.ops.provenance import ROOT, command_line

DICT_ARG = "curriculum.env_weights={textcraft-d1: [3, 3], textcraft-d2: [1, 1]}"


def test_command_line_keeps_each_argument_whole() -> None:
    argv = [str(ROOT / "bench" / "long_horizon.py"), "--seeds", "0", "1", DICT_ARG, "a b"]
    got = command_line(argv)
    assert got.startswith("python bench/long_horizon.py ")
    assert shlex.split(got) == ["python", "bench/long_horizon.py", *argv[1:]]


def test_command_line_outside_the_checkout_keeps_the_path(tmp_path: Path) -> None:
    script = str(tmp_path / "x.py")
    assert shlex.split(command_line([script, "--k", "v"], python="python3")) == \
        ["python3", script, "--k", "v"]


def test_command_line_records_the_cli_by_its_name() -> None:
    """The console script and `python -m horizonrl.cluster.cli` are both `horizonrl ...`, the
    form figures.py runs with this interpreter's install."""
    args = ["eval", "--out", "docs/x", DICT_ARG]
    for script in ("/some/venv/bin/horizonrl", str(ROOT / "cluster" / "cli.py")):
        assert shlex.split(command_line([script, *args])) == ["horizonrl", *args]


def _tree(root: Path) -> None:
    docs = root / "docs"
    (docs / "exp" / "eval" / "seed0").mkdir(parents=True)
    (docs / "exp" / "results.json").write_text(json.dumps(
        {"command": shlex.join(["python", "bench/long_horizon.py", "--out", "docs/exp",
                                DICT_ARG]), "x": 1}))
    (docs / "exp" / "eval" / "seed0" / "results.json").write_text("{}")
    (docs / "exp" / "training.json").write_text(json.dumps(
        {"command": "python bench/run_summary.py runs/gone/seed0/r --out docs/exp/training.json"}))
    (docs / "lonely.json").write_text(json.dumps({"rows": []}))
    (docs / "page.md").write_text("[ok](exp/results.json), [bad](exp/missing.json), "
                                  "[web](https://example.org/a.json), [anchor](page.md#top)")
    (root / "README.md").write_text("[docs](docs/page.md) [gone](docs/nope.png)")


def test_owners_links_and_order(tmp_path: Path) -> None:
    _tree(tmp_path)
    results = figures.results_files(tmp_path)
    by_path = {r.path: r for r in results}
    assert figures.owner("docs/exp/eval/seed0/results.json", by_path) == "docs/exp/results.json"
    assert figures.owner("docs/exp/training.json", by_path) == "docs/exp/training.json"
    assert figures.owner("docs/lonely.json", by_path) is None
    assert sorted(figures.broken_links(tmp_path)) == ["README.md: docs/nope.png",
                                                       "docs/page.md: exp/missing.json"]
    order = figures.run_order(results)
    assert [p for _, p in order] == ["docs/exp/results.json", "docs/exp/training.json"]
    # The recorded command splits back into the arguments it was run with.
    assert DICT_ARG in figures._split(order[0][0])
    summary = figures._split(order[1][0])
    assert figures.missing_inputs(summary, tmp_path) == ["runs/gone/seed0/r"]
    # An eval of a run folder that is gone, by --model or the second of --compare's two.
    (tmp_path / "runs" / "here").mkdir(parents=True)
    for models in (["--model", "runs/gone/x"], ["--compare", "base", "runs/gone/x"],
                   ["--compare", "runs/here", "runs/gone/x"]):
        argv = ["horizonrl", "eval", *models, "--tasks", "4", "seed=0"]
        assert figures.missing_inputs(argv, tmp_path) == ["runs/gone/x"]
    assert figures.missing_inputs(["horizonrl", "eval", "--compare", "base", "runs/here",
                                   "metrics.port=0"], tmp_path) == []
    (tmp_path / "runs/gone/seed0/r").mkdir(parents=True)
    assert figures.missing_inputs(summary, tmp_path) == []


def test_the_docs_link_only_to_files_that_exist() -> None:
    if not (ROOT / "docs").is_dir():
        pytest.skip("no docs/ in this checkout")
    assert figures.broken_links(ROOT) == []


def test_plan_builds_prerequisites_and_writers_before_readers(tmp_path: Path) -> None:
    """From a checkout without runs/: the shared warm starts first, then each command after the
    command whose runs it reads, so nothing is skipped for an input the plan itself writes."""
    rs = "python bench/long_horizon.py --out docs/a --runs runs/lh-a --reuse-warm-start runs/tc-ws"
    summary = "python bench/run_summary.py runs/lh-b/seed0/cfg__0__20261201-143952 " \
        "--out docs/b/t.json"
    reader = "python bench/long_horizon.py --out docs/c --runs runs/lh-c --reuse-warm-start " \
        "/elsewhere/exp/runs/lh-b"
    writer = "python bench/long_horizon.py --out docs/b --runs runs/lh-b"
    pairs = [(rs, "docs/a/results.json"), (reader, "docs/c/results.json"),
             (writer, "docs/b/results.json"), (summary, "docs/b/t.json")]
    got = figures.plan(pairs, tmp_path)
    cmds = [c for c, _ in got]
    assert cmds[:3] == list(figures.PREREQUISITES["runs/tc-ws"])
    assert cmds[3:] == [rs, writer, reader, summary]
    # Every input is written by an earlier command of the plan.
    produced: tuple[str, ...] = ()
    for c in cmds:
        argv = figures._split(c)
        assert figures.missing_inputs(argv, tmp_path, produced) == [], c
        produced += tuple(figures.outputs(argv))
    # A summary of an OUT folder's evaluations (given first) runs after the command writing it.
    tasks = "python bench/miniwob_per_task.py docs/b --out docs/b/per_task.json"
    assert [c for c, _ in figures.plan([(tasks, "docs/b/per_task.json"),
                                        (writer, "docs/b/results.json")], tmp_path)] == \
        [writer, tasks]
    assert figures.inputs(figures._split(tasks)) == ["docs/b"]
    # Without the writer, its reader is missing an input; a built warm start is not rebuilt.
    assert figures.missing_inputs(figures._split(reader), tmp_path) == ["runs/lh-b"]
    (tmp_path / "runs" / "tc-ws").mkdir(parents=True)
    assert [c for c, _ in figures.plan(pairs[:1], tmp_path)] == [rs]


def test_a_stamped_run_stands_for_the_one_run_of_its_name_and_seed(tmp_path: Path) -> None:
    gone = "runs/lh/seed0/cfg__0__20261201-143952/init/model"
    assert figures.resolve(gone, tmp_path) == gone  # nothing there yet
    (tmp_path / "runs/lh/seed0/cfg__0__20261203-101010/init/model").mkdir(parents=True)
    (tmp_path / "runs/lh/seed0/other__0__20261203-101010").mkdir()
    assert figures.resolve(gone, tmp_path) == "runs/lh/seed0/cfg__0__20261203-101010/init/model"
    (tmp_path / "runs/lh/seed0/cfg__0__20261204-101010").mkdir()
    assert figures.resolve(gone, tmp_path) == gone  # two candidates: none is chosen
    assert figures.local("/elsewhere/exp/runs/lh-b/seed0") == "runs/lh-b/seed0"
    assert figures.local(str(ROOT / "runs" / "x")) == str(ROOT / "runs" / "x")
    assert figures.local("docs/x") == "docs/x"


def test_a_result_is_older_than_the_code_changed_after_it(tmp_path: Path) -> None:
    import subprocess

    def git(*args: str) -> None:
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
                       cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "docs").mkdir()
    (tmp_path / "bench").mkdir()
    (tmp_path / "learner").mkdir()
    result = figures.Result("docs/r.json", ("python bench/a.py --out docs/r.json",))
    for path in ("docs/r.json", "bench/a.py", "bench/b.py", "learner/x.py"):
        (tmp_path / path).write_text("1")
    git("add", "-A")
    git("commit", "-qm", "all")
    assert figures.code_commits_since(result, tmp_path) == 0
    (tmp_path / "bench/b.py").write_text("2")  # another script: not this result's code
    git("commit", "-qam", "b")
    assert figures.code_commits_since(result, tmp_path) == 0
    for path in ("learner/x.py", "bench/a.py"):
        (tmp_path / path).write_text("2")
        git("commit", "-qam", path)
    assert figures.code_commits_since(result, tmp_path) == 2
    assert figures.code_commits_since(figures.Result("docs/new.json", ()), tmp_path) is None
    # A script renamed in the recorded command is not a rerun: the result stays as old.
    (tmp_path / result.path).write_text("1, its command edited")
    git("commit", "-qam", f"rename a script {figures.NOT_WRITTEN}")
    assert figures.code_commits_since(result, tmp_path) == 2
    (tmp_path / result.path).write_text("2")
    git("commit", "-qam", "rerun")
    assert figures.code_commits_since(result, tmp_path) == 0


def test_a_page_gives_the_command_of_each_results_file_it_links(tmp_path: Path) -> None:
    cmd = shlex.join(["python", "bench/long_horizon.py", "--out", "docs/exp", DICT_ARG])
    (tmp_path / "docs" / "exp").mkdir(parents=True)
    (tmp_path / "docs" / "exp" / "results.json").write_text(json.dumps({"command": cmd}))
    (tmp_path / "docs" / "exp" / "plot.png").write_text("")
    wrapped = cmd.replace(" --out ", "\n  --out ")  # a command wrapped inside backticks
    (tmp_path / "docs" / "good.md").write_text(f"`{wrapped}` -> [r](exp/results.json)")
    (tmp_path / "docs" / "bad.md").write_text("![plot](exp/plot.png), `" + cmd[:-3] + "`")
    (tmp_path / "docs" / "exp" / "results.md").write_text("[r](results.json)")  # its own report
    (tmp_path / "docs" / "other.md").write_text("[see](good.md), [also](exp/results.md)")
    assert figures.commands_not_shown(tmp_path) == ["docs/bad.md: docs/exp/results.json"]


def test_the_training_summary_records_the_command_that_trained_the_runs(tmp_path: Path) -> None:
    """bench/long_horizon.py writes training.json itself, under its own command, so a rerun
    needs no second command naming run folders by their start time."""
    from bench import run_summary

    run = tmp_path / "seed0" / "cfg__0__20261203-101010"
    run.mkdir(parents=True)
    rows = [{"success_rate": s, "invalid_action_rate": 0.5 - s / 2, "learner/groups_kept": k,
             "learner/rows_trained": 8 * k, "env/babyai/success_rate": s}
            for s, k in ((0.0, 0), (0.2, 2), (0.4, 3), (0.6, 4))]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    out = tmp_path / "training.json"
    run_summary.write([run], out, 2, "python bench/long_horizon.py --out x")
    got = json.loads(out.read_text())
    assert got["command"] == "python bench/long_horizon.py --out x" and got["window"] == 2
    (r,) = got["runs"]
    assert r["steps"] == 4 and r["steps_without_signal"] == 1 and r["groups_kept_mean"] == 2.25
    assert r["success"] == [0.1, 0.5] and r["env_success"] == {"babyai": [0.1, 0.5]}
    assert r["episodes_trained_mean"] == 18.0 and "replay_loss" not in r
    rows[-1]["learner/replay_loss"] = 0.2
    rows[-2]["learner/replay_loss"] = 0.4
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    run_summary.write([run], out, 2, "c")
    first, last = json.loads(out.read_text())["runs"][0]["replay_loss"]
    assert first != first and last == 0.3  # no replay in the first window: NaN


def test_write_results_records_the_command_beside_the_fields_and_the_table(tmp_path: Path) -> None:
    import time

    from bench.report import write_results

    write_results(tmp_path, {"modes": {"sync": 1.0}}, "| a |\n|---|", started=time.perf_counter())
    got = json.loads((tmp_path / "results.json").read_text())
    assert list(got) == ["command", "wall_seconds", "modes"] and got["modes"] == {"sync": 1.0}
    assert got["command"] == command_line() and got["wall_seconds"] >= 0
    assert (tmp_path / "results.md").read_text() == f"`{command_line()}`\n\n| a |\n|---|\n"
