"""Imports run one way: between the roles (cluster/ -> actors/, learner/ -> envpool/, protos/),
and inside cluster/ from the top of docs/architecture.md's order to the bottom."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# cluster/'s sub-packages (and its two top modules), top first: each imports only later ones.
ORDER = ("cli", "train", "warm_start", "eval", "rollout", "ops", "model", "config")
# Which folders each folder may import (protos/ imports nothing of ours).
ALLOWED = {"cluster": {"cluster", "actors", "learner", "envpool", "protos"},
           "actors": {"actors", "envpool", "protos"}, "learner": {"learner", "protos"},
           "envpool": {"envpool", "protos"}, "protos": {"protos"}}


def _imports(path: Path) -> list[str]:
    """Every `horizonrl.X...` module `path` imports, at the top or inside a function."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return [m for m in found if m.startswith("horizonrl.")]


def test_no_import_runs_upward() -> None:
    upward = []
    for folder, allowed in ALLOWED.items():
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT / folder).with_suffix("").parts
            for mod in _imports(path):
                parts = mod.split(".")
                if parts[1] not in allowed:
                    upward.append(f"{path.relative_to(ROOT)} imports {mod}")
                elif folder == "cluster" == parts[1] and len(parts) > 2 and rel[0] in ORDER \
                        and parts[2] in ORDER and ORDER.index(parts[2]) < ORDER.index(rel[0]):
                    upward.append(f"{path.relative_to(ROOT)} imports {mod}")
    assert not upward, "\n".join(sorted(set(upward)))


def test_the_order_names_every_part_of_cluster() -> None:
    parts = {p.stem for p in (ROOT / "cluster").glob("*.py") if p.stem != "__init__"}
    parts |= {p.name for p in (ROOT / "cluster").iterdir() if (p / "__init__.py").exists()}
    assert parts == set(ORDER)
