"""Store a checkpoint directory's safetensors files xz-compressed (lossless), or restore the plain files.

    python scripts/pack_checkpoint.py checkpoints/mini/smollm2_135m-dflash-b8          # model.safetensors -> .xz
    python scripts/pack_checkpoint.py --unpack checkpoints/mini/smollm2_135m-dflash-b8 # .xz -> model.safetensors

specexp reads either form (`checkpoints.read_tensors`); the committed mini checkpoints are packed because bf16
weights compress to about 0.7 of their size, which keeps the repository under its 48 MiB budget. The packed file
holds the exact bytes of the plain one: a pack is checked by decompressing it again before the plain file goes,
and `xz -dk FILE.xz` restores the plain file without specexp. Each file is replaced atomically.
"""
from __future__ import annotations

import argparse
import lzma
import os
import sys
from pathlib import Path

PRESET = 9 | lzma.PRESET_EXTREME


def _write_atomic(final: Path, data: bytes) -> None:
    tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)


def pack(directory: Path) -> list[tuple[str, int, int]]:
    done = []
    for f in sorted(directory.glob("*.safetensors")):
        raw = f.read_bytes()
        packed = lzma.compress(raw, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=PRESET)
        if lzma.decompress(packed) != raw:                  # never drop the plain file on a bad round trip
            raise SystemExit(f"pack_checkpoint: {f}: the compressed file does not decompress to the same bytes")
        _write_atomic(f.with_name(f.name + ".xz"), packed)
        f.unlink()
        done.append((f.name, len(raw), len(packed)))
    return done


def unpack(directory: Path) -> list[tuple[str, int, int]]:
    done = []
    for f in sorted(directory.glob("*.safetensors.xz")):
        packed = f.read_bytes()
        raw = lzma.decompress(packed)
        _write_atomic(f.with_name(f.name[: -len(".xz")]), raw)
        done.append((f.name, len(packed), len(raw)))
    return done


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+", type=Path, help="checkpoint directories")
    ap.add_argument("--unpack", action="store_true", help="restore the plain safetensors files (the .xz stay)")
    args = ap.parse_args(argv)
    for d in args.dirs:
        if not d.is_dir():
            print(f"pack_checkpoint: {d} is not a directory", file=sys.stderr)
            return 2
    for d in args.dirs:
        for name, a, b in (unpack if args.unpack else pack)(d):
            print(f"{d}/{name}: {a:,} -> {b:,} bytes ({b / a:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
