"""Reading and writing files: every read fault one line naming the file, every write atomic.

Reading a user's text files (benchmark JSONL, training corpora, results): a path that is a directory, a missing
file, unreadable or truncated gzip, and bytes that are not UTF-8 (with the line they are on) each become a
`UserError`, so a reader never surfaces an OSError or UnicodeDecodeError, and never a write-side message ("free
some space") for a read.

Writing (results, cards, checkpoints, exports): `replace_atomic` is the one way a file is replaced. The new
content goes into a temporary file beside it, which is renamed onto the name, so a reader (or a crash, a full
disk, a kill) sees the old file or the new one, never a cut one; `write_text_atomic` and `write_json` also fsync
the file and the rename (result files).
"""
from __future__ import annotations

import contextlib
import gzip
import json
import lzma
import os
import re
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


_OS_ERROR = re.compile(r"\(os error (\d+)\)|code: (\d+)")


def as_os_error(e: BaseException, path) -> OSError | None:
    """An I/O fault reported by a library as its own exception (safetensors: `SafetensorError: ... (os error 28)`)
    as the OSError it is, naming `path`, so that a full disk reads alike whoever wrote the file; None when `e`
    carries no OS error code."""
    if isinstance(e, OSError):
        return None
    m = _OS_ERROR.search(str(e))
    code = int(m.group(1) or m.group(2)) if m else None
    return OSError(code, os.strerror(code), str(path)) if code else None


def replace_atomic(path: str | os.PathLike, write, durable: bool = False) -> None:
    """`write(tmp)` into a temporary file beside `path`, then rename it onto `path`. The temporary file lives in the
    same directory (os.replace is atomic only within one file system), is made as readable as any other file
    (mkstemp and safetensors make 0600), and never outlives a failure; os.replace cannot half-replace `path`.
    `durable`: the directory is fsynced after the rename, so the rename itself survives a power cut."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.errno is not None and str(e.filename) == tmp:
            raise OSError(e.errno, e.strerror, str(path)) from None     # the file meant, not its temporary name
        translated = as_os_error(e, path)
        if translated is not None:
            raise translated from None
        raise
    if durable:
        _fsync_dir(path.parent)


def append_text(path: str | os.PathLike, text: str, durable: bool = True) -> None:
    """Append `text` (UTF-8) to `path` in one write, fsynced when `durable` (a crash then leaves at most a torn last
    line). A fault while writing (a full disk) names `path`: a write error alone carries no file name."""
    try:
        with open(path, "a", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            if durable:
                os.fsync(f.fileno())
    except OSError as e:
        if e.filename or e.errno is None:
            raise
        raise OSError(e.errno, e.strerror, str(path)) from None


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Replace `path` with `text` (UTF-8, newlines as given) atomically and durably: the file is fsynced before the
    rename and the rename after it (`replace_atomic`)."""
    def write(tmp: Path) -> None:
        with open(tmp, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())

    replace_atomic(path, write, durable=True)


def write_json(path: str | os.PathLike, obj) -> None:
    """Write JSON atomically (`write_text_atomic`), indented, with a final newline."""
    write_text_atomic(path, json.dumps(obj, indent=2) + "\n")


def _fsync_dir(d: Path) -> None:
    """Make a rename durable (POSIX); skipped where a directory cannot be opened."""
    with contextlib.suppress(OSError):
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
