"""Per-episode eval logs as docs/ keeps them: one solid xz archive per docs section.

An eval writes OUT/episodes.jsonl (cluster/eval/evaluate.py); bench/long_horizon.py gzips it. Kept
one file per eval folder, those logs were 7.8 MB of docs/ (131 files), mostly the actions of
episodes that the seeds and methods of one experiment share; one xz archive per section
(`docs/long-horizon/episodes.tar.xz`, `docs/credit/episodes.tar.xz`) holds the same bytes in
2.8 MB. Nothing is dropped: every number an eval report computed from its episodes is
recomputable from the archive (`read_episodes`).

    .venv/bin/python bench/doc_episodes.py --pack     # fold loose logs into their archives
    .venv/bin/python bench/doc_episodes.py --size     # docs/ size against its limit
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import lzma
import subprocess
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARCHIVE = "episodes.tar.xz"
LOOSE = ("episodes.jsonl", "episodes.jsonl.gz")
DOCS_LIMIT_BYTES = 10 * 1024 * 1024
"""docs/ in a clone stays under this (issue "A house with rooms"); `figures --check` fails above."""


def read_episodes(folder: Path) -> list[dict]:
    """The episode records of the eval that wrote `folder`: its episodes.jsonl, gzipped or not,
    else its member in the nearest enclosing episodes.tar.xz."""
    folder = Path(folder)
    for name in LOOSE:
        if (folder / name).exists():
            raw = (folder / name).read_bytes()
            return _records(gzip.decompress(raw) if name.endswith(".gz") else raw)
    for parent in (folder.resolve(), *folder.resolve().parents):
        archive = parent / ARCHIVE
        if archive.exists():
            member = (folder.resolve().relative_to(parent) / LOOSE[0]).as_posix()
            with tarfile.open(archive, "r:xz") as tar:
                try:
                    f = tar.extractfile(member)
                except KeyError:
                    continue
                if f is not None:
                    return _records(f.read())
    raise FileNotFoundError(f"{folder}: no {' or '.join(LOOSE)} and no {ARCHIVE} above it "
                            f"holding it")


def _records(raw: bytes) -> list[dict]:
    return [json.loads(line) for line in raw.decode().splitlines() if line.strip()]


def pack(section: Path) -> int:
    """Fold the loose logs under `section` into section/episodes.tar.xz (a loose log replaces
    the member of the same folder) and delete them; the members in sorted order, with no
    times or owners, so the same logs make the same bytes. Returns how many were folded."""
    loose = sorted(p for name in LOOSE for p in section.rglob(name))
    if not loose:
        return 0
    members: dict[str, bytes] = {}
    archive = section / ARCHIVE
    if archive.exists():
        with tarfile.open(archive, "r:xz") as tar:
            for info in tar.getmembers():
                f = tar.extractfile(info)
                if f is not None:
                    members[info.name] = f.read()
    for path in loose:
        raw = path.read_bytes()
        name = (path.parent.relative_to(section) / LOOSE[0]).as_posix()
        members[name] = gzip.decompress(raw) if path.suffix == ".gz" else raw
    tmp = archive.with_suffix(".tmp")
    with tarfile.open(tmp, "w:xz", preset=9 | lzma.PRESET_EXTREME) as tar:
        for name in sorted(members):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(members[name]), 0o644
            tar.addfile(info, io.BytesIO(members[name]))
    tmp.replace(archive)
    for path in loose:
        path.unlink()
    return len(loose)


def sections(root: Path = ROOT) -> list[Path]:
    """The docs sections (folders right under docs/) that hold eval logs, loose or packed."""
    docs = root / "docs"
    return sorted(d for d in docs.iterdir() if d.is_dir() and (
        (d / ARCHIVE).exists() or any(p for name in LOOSE for p in d.rglob(name))))


def docs_bytes(root: Path = ROOT) -> int:
    """The bytes of docs/ as a clone has them: the tracked files (every file where `root` is
    not a git checkout)."""
    try:
        names = subprocess.run(["git", "ls-files", "docs"], cwd=root, capture_output=True,
                               text=True, check=True).stdout.split()
        paths = [root / n for n in names]
    except (OSError, subprocess.CalledProcessError):
        paths = [p for p in (root / "docs").rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in paths if p.exists())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--pack", action="store_true", help="fold loose eval logs into archives")
    what.add_argument("--size", action="store_true", help="docs/ size against its limit")
    args = p.parse_args()
    if args.pack:
        for section in sections():
            n = pack(section)
            print(f"{section.relative_to(ROOT)}/{ARCHIVE}: {n} logs folded in", flush=True)
    size = docs_bytes()
    print(f"docs/: {size / 2**20:.1f} MiB of {DOCS_LIMIT_BYTES / 2**20:.0f} MiB")
    raise SystemExit(0 if size <= DOCS_LIMIT_BYTES else 1)


if __name__ == "__main__":
    main()
