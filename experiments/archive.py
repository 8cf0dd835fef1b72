"""A kept sweep of many run directories as one file: `DIR/cells.tar.xz` holds DIR's cell directories (each one's
config.yaml, summary.json and samples.jsonl, as `task=replay` wrote them). The cells of a grid share their prompts
and most of their accept lengths, so xz over the whole sweep keeps a 121-cell α/β grid in about 0.2 MB, where the
cells as separate gzipped files take 3 MB. The scripts that read a sweep (mini_claims.py, dels_alpha_beta.py) call
`cells(DIR)`: the directory itself when its cells are there, else the archive unpacked once into a temporary
directory. By hand: `tar -xJf DIR/cells.tar.xz -C DIR`.

    python experiments/archive.py pack DIR        # DIR/*/ -> DIR/cells.tar.xz (the cell directories go)
    python experiments/archive.py unpack DIR      # DIR/cells.tar.xz -> DIR/*/
"""
from __future__ import annotations

import argparse
import atexit
import gzip
import io
import lzma
import os
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

ARCHIVE = "cells.tar.xz"
_UNPACKED: dict[Path, Path] = {}


def _cell_dirs(d: Path) -> list[Path]:
    return sorted(c for c in d.iterdir() if c.is_dir() and (c / "summary.json").exists())


def pack(d: Path) -> int:
    """Archive the cells of `d` (samples stored uncompressed inside: xz compresses across cells), reproducibly (sorted
    names, mtime 0, no owner); checked by reading it back before the cells are removed. Returns the archive's size."""
    cells = _cell_dirs(d)
    if not cells:
        raise SystemExit(f"archive: {d} has no cell directories (subdirectories with a summary.json)")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for c in cells:
            for f in sorted(c.iterdir()):
                data = gzip.decompress(f.read_bytes()) if f.suffix == ".gz" else f.read_bytes()
                info = tarfile.TarInfo(f"{c.name}/{f.name.removesuffix('.gz')}")
                info.size, info.mtime, info.mode = len(data), 0, 0o644
                tar.addfile(info, io.BytesIO(data))
    packed = lzma.compress(buf.getvalue(), preset=9 | lzma.PRESET_EXTREME)
    with tarfile.open(fileobj=io.BytesIO(lzma.decompress(packed))) as tar:       # the round trip, before deleting
        names = set(tar.getnames())
    missing = [f"{c.name}/{f.name.removesuffix('.gz')}" for c in cells for f in c.iterdir()
               if f"{c.name}/{f.name.removesuffix('.gz')}" not in names]
    if missing:
        raise SystemExit(f"archive: {missing[0]} did not reach the archive; nothing removed")
    tmp = d / f".{ARCHIVE}.{os.getpid()}.tmp"
    tmp.write_bytes(packed)
    os.replace(tmp, d / ARCHIVE)
    for c in cells:
        shutil.rmtree(c)
    return len(packed)


def unpack(d: Path, into: Path | None = None) -> Path:
    """Extract `d/cells.tar.xz` into `into` (default: `d`); only plain files below it are ever written."""
    into = into or d
    with tarfile.open(d / ARCHIVE, mode="r:xz") as tar:
        tar.extractall(into, filter="data")
    return into


def cells(d: Path) -> Path:
    """The directory holding `d`'s cell directories: `d` itself, or its archive unpacked once per process."""
    d = Path(d).resolve()
    if not (d / ARCHIVE).exists() or _cell_dirs(d):
        return d
    if d not in _UNPACKED:
        tmp = Path(tempfile.mkdtemp(prefix="specexp-cells-"))
        atexit.register(shutil.rmtree, tmp, True)
        _UNPACKED[d] = unpack(d, tmp)
    return _UNPACKED[d]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=["pack", "unpack"])
    ap.add_argument("dir", type=Path)
    a = ap.parse_args(argv)
    if not a.dir.is_dir():
        print(f"archive: {a.dir} is not a directory", file=sys.stderr)
        return 2
    if a.action == "pack":
        print(f"{a.dir / ARCHIVE}: {pack(a.dir):,} bytes")
    else:
        if not (a.dir / ARCHIVE).exists():
            print(f"archive: no {ARCHIVE} in {a.dir}", file=sys.stderr)
            return 2
        print(f"unpacked into {unpack(a.dir)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
