"""The results behind README.md and docs/: list them, check the links to them, run them again.

    .venv/bin/python bench/figures.py --list              # each results file and its command
    .venv/bin/python bench/figures.py --check             # links resolve; who wrote what;
                                                          # which results predate their code;
                                                          # docs/ under its size limit
    .venv/bin/python bench/figures.py --run [--match S]   # rerun the recorded commands

(`make figures`, `make figures-check`.) A results file is a committed JSON under docs/ that
records the command that wrote it (`command`, or `commands` for a small set); files a command
writes beside its results (eval reports, a build record) belong to the results file whose
command names their folder. `--run` reruns every recorded command at the current code, in an order
that builds shared warm starts first (PREREQUISITES: the runs several results start from) and
writes training runs before the summaries that read them. A run folder named with its start time
(`<name>__<seed>__<time>`) stands for the one run of that name and seed in its folder now, so a
summary of runs finds the runs that `--run` has just trained. A command whose inputs neither
exist nor come from an earlier command of the plan is skipped and named. All of it takes many
hours on 2 cores; `--match` picks a subset by substring of the command or the file. After a
run, the eval logs the commands wrote under docs/ go into their section's archive
(bench/doc_episodes.py).
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

if not __package__:  # run as `python bench/NAME.py`: the checkout on the path, not bench/
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.doc_episodes import DOCS_LIMIT_BYTES, docs_bytes, pack, sections

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
"""A markdown link's target (anchors dropped)."""
SUMMARIES = ("bench/run_summary.py", "bench/miniwob_per_task.py")
"""Scripts that summarise what another command wrote (training runs, an OUT folder's
evaluations), named by their positional arguments: they go last."""
INPUT_FLAGS = ("--reuse-warm-start", "--model", "--compare", "--methods")
"""Flags whose values (up to the next option) are inputs that must exist before the command
can run; `base` is the config's own model; `NAME=DIR,DIR` (bench/credit_compare.py) names
folders."""
OUTPUT_FLAGS = ("--runs", "--out")
"""Flags (and `run_root=`) whose value is a folder (of training runs, of results) the command
writes."""
_TC_WS = ("horizonrl train --config configs/textcraft-bc-rl.yaml seed={s} "
          "run_root=runs/tc-ws/seed{s} iterations=1 init.eval_tasks=0 learner.dtype=auto "
          "generator.dtype=auto metrics.port=0")
_DS_WS = ("horizonrl train --config configs/deepsearch-bc-rl.yaml seed={s} "
          "run_root=runs/ds-ws/seed{s} iterations=1 init.eval_tasks=0 model.tiny.names=true "
          "model.tiny.vocab_size=8192 model.tiny.reading=6000 model.tiny.pretrain_steps=900 "
          "init.sft_epochs=8 metrics.port=0")
PREREQUISITES: dict[str, tuple[str, ...]] = {
    # Warm starts (demos + clone, one RL step) that several TextCraft and Deep Search results
    # start from with --reuse-warm-start, as docs/long-horizon.md gives them, and the default
    # run that docs/eval-babyai.md compares with the base model. They write runs, not results
    # files, so no results file records them. (Deep Search's seed 0 first reused the
    # deepsearch-names-reading run's warm start, the same recipe; here it is built like 1, 2.)
    "runs/tc-ws": tuple(_TC_WS.format(s=s) for s in range(3)),
    "runs/ds-ws": tuple(_DS_WS.format(s=s) for s in range(3)),
    "runs/eval-babyai": ("horizonrl train --config configs/babyai-local.yaml "
                         "run_root=runs/eval-babyai metrics.port=0",),
}
CODE = ("actors", "cluster", "envpool", "learner", "protos", "configs", "pyproject.toml")
"""What every result depends on; a result also depends on the scripts its commands run."""
NOT_WRITTEN = "[results not rerun]"
"""In a commit message: the commit edited results files without running their commands again (a
script renamed in their recorded commands), so it does not count as writing them."""
STAMPED = re.compile(r"^(?P<name>.+__\d+__)\d{8}-\d{6}$")
"""A run folder's name: `<config name>__<seed>__<start time>`."""


@dataclass(frozen=True)
class Result:
    path: str              # relative to the checkout
    commands: tuple[str, ...]


def results_files(root: Path = ROOT) -> list[Result]:
    """Every JSON under docs/ (tracked by git when root is a checkout), with its commands."""
    found = []
    for path in sorted(_docs_json(root)):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            data = None
        cmds = ()
        if isinstance(data, dict):
            got = data.get("command") or data.get("commands") or ()
            cmds = (got,) if isinstance(got, str) else tuple(c for c in got if isinstance(c, str))
        found.append(Result(str(path.relative_to(root)), cmds))
    return found


def _docs_json(root: Path) -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "docs"], cwd=root, capture_output=True,
                             text=True, check=True).stdout.split()
        return [root / p for p in out if p.endswith(".json")]
    except (OSError, subprocess.CalledProcessError):  # not a checkout: every file there
        return list((root / "docs").rglob("*.json"))


def owner(path: str, by_path: dict[str, Result]) -> str | None:
    """The results file that accounts for `path`: itself when it records a command, else one
    whose command names a folder that holds `path` (the `--out` of a benchmark that writes
    eval reports or a build record beside its results)."""
    if by_path[path].commands:
        return path
    for other, res in by_path.items():
        for command in res.commands:
            for arg in _split(command):
                folder = arg.rstrip("/")
                if folder.startswith("docs/") and path.startswith(folder + "/"):
                    return other
    return None


def _split(command: str) -> list[str]:
    try:
        return shlex.split(command)
    except ValueError:  # an unbalanced quote in a hand-written command: plain words
        return command.split()


def code_commits_since(result: Result, root: Path = ROOT) -> int | None:
    """How many commits changed the code behind `result` (CODE and the bench scripts its
    commands run) after the commit that last wrote it; None outside a git checkout. By commit
    order: a file produced before a code change and committed after it counts as current."""
    scripts = [a for c in result.commands for a in _split(c) if a.startswith("bench/")]

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()

    try:
        written = git("log", "-1", "--format=%H", "--invert-grep", f"--grep={NOT_WRITTEN}",
                      "--fixed-strings", "--", result.path)
        if not written:
            return None
        return int(git("rev-list", "--count", f"{written}..HEAD", "--", *CODE, *scripts))
    except (OSError, subprocess.CalledProcessError, ValueError):
        return None


def broken_links(root: Path = ROOT) -> list[str]:
    """`page: target` for each local link in README.md and docs/**/*.md that names no file."""
    pages = [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
    bad = []
    for page in pages:
        if not page.exists():
            continue
        for target in LINK.findall(page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                bad.append(f"{page.relative_to(root)}: {target}")
    return bad


def commands_not_shown(root: Path = ROOT) -> list[str]:
    """`page: results file` for each results file a page links to (or to a file beside it)
    whose recorded command the page does not give word for word (line breaks aside)."""
    by_path = {r.path: r for r in results_files(root)}
    missing = []
    for page in [root / "README.md", *sorted((root / "docs").rglob("*.md"))]:
        if not page.exists() or page.name == "results.md":  # a command's own report
            continue
        raw = page.read_text()
        text = " ".join(raw.replace("`", " ").split())
        shown = set()
        for target in LINK.findall(raw):
            path = (page.parent / target).resolve()
            if "://" in target or target.endswith(".md") or \
                    not path.is_relative_to(root.resolve()):
                continue  # another page gives its own results' commands
            rel = str(path.relative_to(root.resolve()))
            beside = [rel] if rel in by_path else \
                [p for p in by_path if str(Path(p).parent) == str(Path(rel).parent)]
            for res in beside:
                if res in shown or not by_path[res].commands:
                    continue
                shown.add(res)
                if any(" ".join(c.split()) not in text for c in by_path[res].commands):
                    missing.append(f"{page.relative_to(root)}: {res}")
    return missing


def run_order(results: list[Result]) -> list[tuple[str, str]]:
    """(command, results file) pairs, each command once, summaries of runs last."""
    seen: dict[str, str] = {}
    for r in results:
        for c in r.commands:
            seen.setdefault(c, r.path)
    return sorted(seen.items(), key=lambda kv: any(s in kv[0] for s in SUMMARIES))


def local(arg: str) -> str:
    """An absolute path into another checkout's runs/ (an experiment run beside this one) as
    the same path in this checkout's runs/, where the plan writes it; anything else as is."""
    parts = Path(arg).parts
    if not Path(arg).is_absolute() or "runs" not in parts or Path(arg).is_relative_to(ROOT):
        return arg
    return str(Path(*parts[parts.index("runs"):]))


def inputs(argv: list[str]) -> list[str]:
    """The paths a command reads that another command writes: the folders a summary is given,
    the values of input flags."""
    found = []
    if any(s in argv[1:2] for s in SUMMARIES):
        found += [a for i, a in enumerate(argv[2:], 2)
                  if a.startswith(("runs/", "docs/")) and not argv[i - 1].startswith("--")]
    for i, flag in enumerate(argv):
        if flag in INPUT_FLAGS:
            found += [local(p) for v in itertools.takewhile(_is_value, argv[i + 1:])
                      if v != "base" for p in v.split("=", 1)[-1].split(",")]
    return found


def outputs(argv: list[str]) -> list[str]:
    """The folders a command writes (`--runs R`, `--out O`, `run_root=R`)."""
    found = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in OUTPUT_FLAGS]
    return found + [a.split("=", 1)[1] for a in argv if a.startswith("run_root=")]


def resolve(path: str, root: Path = ROOT) -> str:
    """`path` itself when it exists; else, where a component is a stamped run folder that is
    gone, the same path through the one run of that name and seed in its folder now (the run
    a rerun wrote), when there is exactly one."""
    if (root / path).exists():
        return path
    parts = Path(path).parts
    for i, part in enumerate(parts):
        m = STAMPED.match(part)
        folder = root.joinpath(*parts[:i])
        if not m or (folder / part).exists() or not folder.is_dir():
            continue
        runs = sorted(p.name for p in folder.iterdir() if p.name.startswith(m["name"]))
        if len(runs) == 1:
            return str(Path(*parts[:i], runs[0], *parts[i + 1:]))
    return path


def _overlaps(a: str, b: str) -> bool:
    pa, pb = Path(a).parts, Path(b).parts
    return pa[:len(pb)] == pb or pb[:len(pa)] == pa


def missing_inputs(argv: list[str], root: Path = ROOT, produced: tuple[str, ...] = ()) -> \
        list[str]:
    """Inputs that are not there (after `resolve`) and that no folder in `produced` (the
    outputs of the commands planned before this one) will hold."""
    return [p for p in inputs(argv) if not (root / resolve(p, root)).exists()
            and not any(_overlaps(p, out) for out in produced)]


def plan(pairs: list[tuple[str, str]], root: Path = ROOT) -> list[tuple[str, str]]:
    """`pairs` (command, results file) with the prerequisites they need that are not built yet
    (command, its run folder), each command after those that write the runs it reads, and
    otherwise in the order given."""
    wanted = [p for c, _ in pairs for p in inputs(_split(c))]
    steps = [(c, folder) for folder, cmds in PREREQUISITES.items()
             if not (root / folder).exists() and any(_overlaps(p, folder) for p in wanted)
             for c in cmds] + pairs
    ins = [inputs(_split(c)) for c, _ in steps]
    outs = [outputs(_split(c)) for c, _ in steps]
    placed: set[int] = set()
    order: list[tuple[str, str]] = []

    def place(i: int) -> None:
        placed.add(i)  # before its writers: a cycle cannot recurse for ever
        for j in range(len(steps)):
            if j not in placed and any(_overlaps(p, o) for p in ins[i] for o in outs[j]):
                place(j)
        order.append(steps[i])

    for i in range(len(steps)):
        if i not in placed:
            place(i)
    return order


def _is_value(arg: str) -> bool:
    """Not an option and not a dotted `key=value` override."""
    return not arg.startswith("-") and "=" not in arg


def run(pairs: list[tuple[str, str]], *, dry_run: bool, keep_going: bool) -> int:
    failed = 0
    produced: tuple[str, ...] = ()  # run folders the commands so far write
    for i, (command, path) in enumerate(pairs, 1):
        argv = _split(command)
        gone = missing_inputs(argv, produced=produced)
        head = f"[figures] {i}/{len(pairs)} {path}"
        if gone:
            print(f"{head}: skipped, inputs missing: {', '.join(gone)}", flush=True)
            continue
        produced += tuple(outputs(argv))
        print(f"{head}: {command}", flush=True)
        if dry_run:
            continue
        argv = [resolve(local(a)) if local(a).startswith("runs/") else a for a in argv]
        if argv and argv[0] in ("python", "python3"):
            argv[0] = sys.executable
        elif argv and argv[0] == "horizonrl":  # the CLI of this interpreter's install
            argv[:1] = [sys.executable, "-m", "horizonrl.cluster.cli"]
        t0 = time.perf_counter()
        rc = subprocess.run(argv, cwd=ROOT).returncode
        print(f"{head}: rc {rc} ({time.perf_counter() - t0:.0f} s)", flush=True)
        if rc:
            failed += 1
            if not keep_going:
                return rc
    return 1 if failed else 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--list", action="store_true", help="each results file and its command")
    what.add_argument("--check", action="store_true", help="links resolve; list the JSON no "
                      "command accounts for and the results older than their code")
    what.add_argument("--run", action="store_true", help="rerun the recorded commands")
    p.add_argument("--match", help="only commands or results files containing this text")
    p.add_argument("--dry-run", action="store_true", help="with --run: print, do not run")
    p.add_argument("--keep-going", action="store_true", help="with --run: go on after a failure")
    args = p.parse_args()
    results = results_files()
    by_path = {r.path: r for r in results}
    if args.list:
        for r in results:
            own = owner(r.path, by_path)
            print(r.path, "::", " ;; ".join(r.commands) if r.commands else
                  f"(written with {own})" if own else "(no recorded command)")
        return
    if args.check:
        bad = broken_links()
        orphans = [r.path for r in results if owner(r.path, by_path) is None]
        for line in bad:
            print(f"broken link: {line}")
        for path in orphans:
            print(f"no recorded command: {path}")
        unshown = commands_not_shown()
        for line in unshown:
            print(f"command not on the page: {line}")
        stale = 0
        for r in results:
            if r.commands and (n := code_commits_since(r)):
                stale += 1
                print(f"older than the code: {r.path} ({n} code commits since it was written)")
        size = docs_bytes()
        print(f"[figures] {len(results)} results files, {len(orphans)} without a recorded "
              f"command, {stale} of those with one written before the code's last change, "
              f"{len(unshown)} linked without their command; {len(bad)} broken links; docs/ "
              f"{size / 2**20:.1f} MiB (limit {DOCS_LIMIT_BYTES / 2**20:.0f})")
        raise SystemExit(1 if bad or size > DOCS_LIMIT_BYTES else 0)
    pairs = [(c, path) for c, path in run_order(results)
             if not args.match or args.match in c or args.match in path]
    rc = run(plan(pairs), dry_run=args.dry_run, keep_going=args.keep_going)
    if not args.dry_run:  # what the commands wrote into docs/, in the form docs/ keeps it
        for section in sections():
            print(f"[figures] {section.relative_to(ROOT)}: {pack(section)} eval logs packed")
    raise SystemExit(rc)


if __name__ == "__main__":
    main()
