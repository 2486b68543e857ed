"""docs/ keeps eval logs in one xz archive per section: reading one back gives the records the
eval wrote, packing merges and replaces by folder, and the same logs make the same bytes."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from bench import doc_episodes


def _write(folder: Path, records: list[dict], *, gz: bool) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    raw = "".join(json.dumps(r) + "\n" for r in records).encode()
    if gz:
        (folder / "episodes.jsonl.gz").write_bytes(gzip.compress(raw))
    else:
        (folder / "episodes.jsonl").write_bytes(raw)
    (folder / "results.json").write_text("{}")


def test_pack_keeps_every_record_and_reads_back_by_folder(tmp_path: Path) -> None:
    section = tmp_path / "docs" / "sec"
    a, b = section / "x/eval/seed0-eval", section / "y/eval/seed1-train-new"
    ra = [{"task_id": f"t{i}", "success": i % 2 == 0, "actions": ["go"] * i} for i in range(5)]
    rb = [{"task_id": "u", "success": True, "actions": []}]
    _write(a, ra, gz=True)
    _write(b, rb, gz=False)
    assert doc_episodes.read_episodes(a) == ra  # loose, gzipped
    assert doc_episodes.pack(section) == 2
    assert not list(section.rglob("episodes.jsonl*"))
    assert doc_episodes.read_episodes(a) == ra and doc_episodes.read_episodes(b) == rb
    with pytest.raises(FileNotFoundError, match=r"no episodes\.jsonl"):
        doc_episodes.read_episodes(section / "z/eval/seed0-eval")


def test_a_rerun_replaces_its_member_and_the_bytes_repeat(tmp_path: Path) -> None:
    section = tmp_path / "sec"
    a, b = section / "x/eval/seed0-eval", section / "y/eval/seed0-eval"
    _write(a, [{"v": 1}], gz=False)
    _write(b, [{"v": 2}], gz=False)
    doc_episodes.pack(section)
    first = (section / doc_episodes.ARCHIVE).read_bytes()
    _write(a, [{"v": 3}], gz=True)  # the rerun of one eval
    assert doc_episodes.read_episodes(a) == [{"v": 3}]  # the loose log wins before packing
    assert doc_episodes.pack(section) == 1
    assert doc_episodes.read_episodes(a) == [{"v": 3}]
    assert doc_episodes.read_episodes(b) == [{"v": 2}]
    _write(a, [{"v": 1}], gz=False)
    doc_episodes.pack(section)
    assert (section / doc_episodes.ARCHIVE).read_bytes() == first
    assert doc_episodes.pack(section) == 0  # nothing loose: the archive is left as it is


def test_docs_size_counts_files(tmp_path: Path) -> None:
    (tmp_path / "docs" / "a").mkdir(parents=True)
    (tmp_path / "docs" / "a" / "f.bin").write_bytes(b"x" * 1000)
    (tmp_path / "docs" / "g.md").write_text("y" * 24)
    assert doc_episodes.docs_bytes(tmp_path) == 1024
