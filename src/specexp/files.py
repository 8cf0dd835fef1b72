"""Reading a user's text files (benchmark JSONL, training corpora, results): every fault one line naming the file.

A path that is a directory, a missing file, unreadable or truncated gzip, and bytes that are not UTF-8 (with the
line they are on) each become a `UserError`, so a reader never surfaces an OSError or UnicodeDecodeError, and
never a write-side message ("free some space") for a read."""
from __future__ import annotations

import contextlib
import gzip
import lzma
import os
import tempfile
from pathlib import Path

from .errors import UserError, check

UNPACK = {".gz": gzip.decompress, ".xz": lzma.decompress}


def stored(path) -> Path | None:
    """The file on disk behind a name: itself, else its .gz or .xz form (committed data files may be stored
    compressed beside their names; the plain file wins when both exist), else None."""
    path = Path(path)
    for f in (path, *(path.with_name(path.name + ext) for ext in UNPACK)):
        if f.is_file():
            return f
    return None


def decode_utf8(data: bytes, path) -> str:
    """`data` as UTF-8 text; otherwise one line naming the file, the line and the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise UserError(f"{path} line {line} is not UTF-8 text (byte 0x{data[e.start]:02X}); save the file as "
                        f"UTF-8") from None


def read_bytes(path, what: str = "file") -> bytes:
    """The bytes of `path` (unpacked when it ends in .gz or .xz); `what` names the file in the errors."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{what} {path} is a directory; expected a file")
    if not path.exists():
        raise UserError(f"{what} {path} does not exist")
    try:
        data = path.read_bytes()
        unpack = UNPACK.get(path.suffix)
        return unpack(data) if unpack else data
    except (OSError, EOFError, lzma.LZMAError) as e:     # gzip.BadGzipFile is an OSError
        raise UserError(f"{what} {path} cannot be read ({e.strerror or e if isinstance(e, OSError) else e})") \
            from None


def read_text(path, what: str = "file") -> str:
    """`path` as UTF-8 text (see read_bytes)."""
    return decode_utf8(read_bytes(path, what), path)


def check_new_file(path, key: str, overwrite: bool, overwrite_key: str) -> Path:
    """`path` (the value of the option `key`) as a file this run may write: not a directory, not under a file, and
    not an existing file unless `overwrite_key=true` says to replace it. Checked before any work is done."""
    path = Path(str(path)).expanduser()
    check(not path.is_dir(), f"{key}={str(path)!r} is a directory; expected the name of a file to write")
    parent = next((p for p in path.parents if p.exists()), None)
    check(parent is None or parent.is_dir(), f"{key}={str(path)!r}: {parent} is a file, not a directory")
    check(overwrite is True or not path.exists(),
          f"{key}={str(path)!r} exists; choose another name, or set {overwrite_key}=true to replace it")
    return path


def write_new_file(path: Path, write) -> None:
    """`write(tmp)` into a temporary file beside `path`, then rename it onto `path`; the temporary file never
    outlives a failure (and os.replace cannot half-replace `path`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, 0o644)                # mkstemp makes 0600; an exported file is as readable as any other
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
