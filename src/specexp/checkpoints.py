"""Checkpoint I/O for every drafter and head: one directory = `config.json` + `model.safetensors` (or files
named by `model.safetensors.index.json`), plus whatever files a drafter keeps beside them (prior, card).

- Any safetensors file may instead be stored xz-compressed beside its name (`model.safetensors.xz`): the exact
  bytes of the safetensors file, compressed losslessly (the committed mini checkpoints are, to keep the repository
  small; `scripts/pack_checkpoint.py` writes them, `xz -dk` restores the plain file). The plain file wins when
  both exist. Nothing but the safetensors format is ever parsed from the decompressed bytes.
- A checkpoint whose weights were left out of the repository names the command that rebuilds them: its
  `card.json` key `rebuild`.

- Loads are strict: a missing, unexpected or misshapen tensor, an unreadable file or a config that is not a
  JSON object is one `UserError` line naming the directory (`where`) and the fault. This project writes
  safetensors only. The one pickle format it reads is a PyTorch file of foreign weights (EAGLE's released
  `pytorch_model.bin`, the DeLS-Spec release's `.pt` files), and only through `read_torch` here:
  `torch.load(weights_only=True)`, whose unpickler builds tensors, dicts, lists and plain scalars and refuses
  every other global (any class or function a crafted file names), so no code in the file runs.
- `resolve` finds a checkpoint: a local directory (committed ones relative to the repository, from any working
  directory) or a hub id, downloaded at its pinned revision (pins.py).
- Saves are atomic per file (write a temporary file in the same directory, then `os.replace`), weights first,
  config last, so a reader never sees a config whose weights are not complete.
"""
from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path

import torch

from . import pins
from .errors import UserError, check, one_of
from .files import read_bytes, replace_atomic, stored
from .paths import REPO_ROOT

CONFIG_FILE, WEIGHTS_FILE, INDEX_FILE = "config.json", "model.safetensors", "model.safetensors.index.json"
TORCH_WEIGHTS_FILE = "pytorch_model.bin"        # EAGLE's released drafters (torch.save of a state dict)
XZ = ".xz"


def read_tensors(file: str | os.PathLike, where: str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors, metadata) of one safetensors file, plain or `.xz`; unreadable or absent: one `UserError` line."""
    from safetensors.torch import load, load_file

    file = Path(file)
    on_disk = stored(file)
    check(on_disk is not None, f"{where}: no {file.name} (nor {file.name}{XZ})")
    data = None if on_disk == file else read_bytes(on_disk, f"{where}:")      # unpacked by its suffix
    try:
        if data is None:
            with file.open("rb") as fh:
                header = json.loads(fh.read(struct.unpack("<Q", fh.read(8))[0]))
            return load_file(file), header.get("__metadata__") or {}
        header = json.loads(data[8: 8 + struct.unpack("<Q", data[:8])[0]])
        return load(data), header.get("__metadata__") or {}
    except Exception as e:                             # a torn or foreign file: safetensors raises many types
        raise UserError(f"{where}: cannot read {on_disk.name} ({type(e).__name__}: {e})") from None


def read_torch(file: str | os.PathLike, where: str, allowed=()):
    """A PyTorch file (`torch.save`) read on the CPU with `weights_only=True`: tensors, dicts, lists and plain
    scalars only. `allowed`: further classes the caller accepts as data (`torch.serialization.safe_globals`,
    e.g. `argparse.Namespace`). A file that needs any other global, a torn file or one that is not a PyTorch file
    is one `UserError` line naming it and what was refused; nothing in it is executed."""
    file = Path(file)
    check(file.is_file(), f"{where}: no {file.name} in {file.parent}")
    try:
        with torch.serialization.safe_globals(list(allowed)):
            return torch.load(file, map_location="cpu", weights_only=True)
    except Exception as e:                # UnpicklingError, RuntimeError, EOFError, ... for a foreign or torn file
        raise UserError(f"{where}: {file.name} is not a weights-only PyTorch file ({_refusal(e)}); only tensors, "
                        f"dicts, lists and plain scalars are loaded, never code") from None


def _refusal(e: Exception) -> str:
    """What torch.load refused, whole: the global it would have had to import (`GLOBAL os.system`), else the first
    line of the error. torch's own message is a paragraph of advice; cutting it at a length cut the name in half."""
    text = str(e)
    found = re.search(r"GLOBAL (\S+?)(?= was| whose|\s|$)", text)
    if found:
        return f"it needs the global {found.group(1)}, which is refused"
    advice = ("Weights only load failed", "Please file an issue", "Check the documentation")
    lines = [ln.strip().removeprefix("WeightsUnpickler error:").strip() for ln in text.splitlines()]
    why = next((ln for ln in lines if ln and not ln.startswith(advice)), "")
    return f"{type(e).__name__}: {why}" if why else type(e).__name__


def read_torch_state(file: str | os.PathLike, where: str) -> dict[str, torch.Tensor]:
    """A state dict saved by `torch.save` (EAGLE's `pytorch_model.bin`), read by `read_torch`: it must be a flat
    mapping of tensor name -> tensor, else one line naming the first thing that is not."""
    file = Path(file)
    raw = read_torch(file, where)
    check(isinstance(raw, dict), f"{where}: {file.name} holds a {type(raw).__name__}, not a state dict (a mapping "
                                 "of tensor name -> tensor)")
    for k, v in raw.items():
        check(isinstance(k, str) and isinstance(v, torch.Tensor),
              f"{where}: {file.name}: entry {k!r} is a {type(v).__name__}, not a tensor; a state dict maps tensor "
              "names to tensors")
    return dict(raw)


def _missing_weights(path: Path, where: str) -> str:
    """The one line for a directory without weights; names the rebuild command when the card has one."""
    card = path / "card.json"
    try:
        rebuild = json.loads(card.read_text()).get("rebuild") if card.is_file() else None
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        rebuild = None
    if rebuild:
        return (f"{where}: its weights are not in this checkout (kept out of the repository for size); "
                f"build them with `{rebuild}`")
    return f"{where}: no {WEIGHTS_FILE} (nor {INDEX_FILE})"


INITS = ("auto", "random", "checkpoint")
RANDOM_ADVICE = "(or a hub id); use drafter.init=random for a random-init drafter"


def resolve_init(init: str, checkpoint, key: str = "drafter", advice: str = RANDOM_ADVICE) -> str:
    """What `KEY.init` means for this config, `random` or `checkpoint`: `auto` is the checkpoint when `KEY.checkpoint`
    is set, else random; `checkpoint` with none set, or a value not in INITS, is one line (`advice` ends it). Every
    drafter and head decides its init here (DFlash and its family, EAGLE-3, the sequential heads, training)."""
    if init == "auto":
        return "checkpoint" if checkpoint else "random"
    one_of(f"{key}.init", init, INITS)
    check(init == "random" or bool(checkpoint), f"{key}.init=checkpoint needs {key}.checkpoint=DIR {advice}")
    return init


def resolve(path_or_id: str, revision: str | None = None, extra: tuple[str, ...] = ()) -> Path:
    """Where a `checkpoint` key's checkpoint is, for every drafter and head: a local directory (a relative path that
    does not exist where the command runs is taken relative to the repository, where the committed mini checkpoints
    are), or a hub repo id downloaded (config + safetensors only, never code) at `revision`
    (`drafter.revision`: a branch, tag or commit; None = the default branch). The returned snapshot directory
    ends in the commit it holds, which training records as the backbone it started from. `extra`: more file
    names to download, for a loader that reads them safely (EAGLE-3: `pytorch_model.bin`, weights_only)."""
    p = Path(os.path.expanduser(path_or_id))
    in_repo = REPO_ROOT / path_or_id                 # committed mini checkpoints, from any working directory
    local = p if p.exists() or path_or_id.startswith((".", "/", "~")) or path_or_id.count("/") != 1 else None
    if not p.exists() and not p.is_absolute() and in_repo.exists():
        local = in_repo
    if local is not None:
        check(revision is None, f"drafter.revision={revision!r} pins a hub checkpoint, but drafter.checkpoint="
                                f"{path_or_id!r} is a local directory; set drafter.revision=null")
        return local
    from huggingface_hub import snapshot_download

    revision = pins.revision(path_or_id, revision)
    try:
        return Path(snapshot_download(path_or_id, revision=revision,
                                      allow_patterns=["config.json", "*.safetensors", "model.safetensors.index.json",
                                                      *extra]))
    except Exception as e:
        at = f" at revision {revision!r}" if revision is not None else ""
        raise UserError(f"drafter.checkpoint={path_or_id!r}: not a local directory and not downloadable from the "
                        f"hub{at} ({type(e).__name__}); download it and pass the directory") from None


def read_config(path: str | os.PathLike, where: str) -> dict:
    """`path/config.json` as a dict; absent, not JSON, or not an object: one line."""
    f = Path(path) / CONFIG_FILE
    check(not Path(path).is_file(), f"{where} is a file; expected a checkpoint directory (holding {CONFIG_FILE} and "
                                    f"the weights)")
    check(Path(path).is_dir(), f"{where}: no such directory")
    check(f.exists(), f"{where}: no {CONFIG_FILE}")
    return read_object(f, where)


def read_object(f: Path, where: str) -> dict:
    """A JSON file of a checkpoint (config.json, card.json) that must hold an object: otherwise one line."""
    try:
        raw = json.loads(f.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{where}: {f.name} is not valid JSON ({e})") from None
    check(isinstance(raw, dict), f"{where}: {f.name} must hold a JSON object, found {type(raw).__name__}")
    return raw


def weight_files(path: Path, where: str) -> list[str]:
    """The weight files of a checkpoint directory: the single file, or the files its index names (validated).
    (Not "shards": in this project a shard is a part of a run's prompts, eval/shards.py.)"""
    index = path / INDEX_FILE
    if not index.exists():
        check(stored(path / WEIGHTS_FILE) is not None, _missing_weights(path, where))
        return [WEIGHTS_FILE]
    try:
        raw = json.loads(index.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{where}: {INDEX_FILE} is not valid JSON ({e})") from None
    wmap = raw.get("weight_map") if isinstance(raw, dict) else None
    check(isinstance(wmap, dict) and bool(wmap) and all(isinstance(v, str) for v in wmap.values()),
          f"{where}: {INDEX_FILE} needs a non-empty 'weight_map' object of tensor name -> weight file")
    files = sorted(set(wmap.values()))
    for f in files:
        check(Path(f).name == f and stored(path / f) is not None,
              f"{where}: {INDEX_FILE} names weight file {f!r}, which is absent")
    return files


def load_state(path: str | os.PathLike, expected: dict[str, torch.Tensor], where: str) -> dict[str, torch.Tensor]:
    """Tensors of the checkpoint at `path`, strictly matched against `expected` (a state dict, possibly on the
    meta device): every key present, none unexpected, every shape equal. Dtypes are the file's."""
    path = Path(path)
    state: dict[str, torch.Tensor] = {}
    for f in weight_files(path, where):
        state.update(read_tensors(path / f, where)[0])
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    for kind, keys in (("missing", missing), ("unexpected", unexpected)):
        more = f" (and {len(keys) - 1} more)" if len(keys) > 1 else ""
        check(not keys, f"{where}: {kind} tensor {keys[0] if keys else ''}{more}")
    for k, t in state.items():
        check(t.shape == expected[k].shape,
              f"{where}: {k} has shape {list(t.shape)}, config.json implies {list(expected[k].shape)}")
    return state


def load_module(module: torch.nn.Module, path: str | os.PathLike, where: str) -> torch.nn.Module:
    """Fill `module` (built from the checkpoint's config, on the meta device or not) from `path`, strictly.
    On the meta device the file's tensors are assigned as they are (they keep the file's dtype)."""
    state = load_state(path, module.state_dict(), where)
    meta = any(p.is_meta for p in module.parameters())
    module.load_state_dict(state, strict=True, assign=meta)
    return module


def save(path: str | os.PathLike, state: dict[str, torch.Tensor], config: dict,
         dtype: torch.dtype | None = None) -> Path:
    """Write `model.safetensors` (tensors cast to `dtype` if given) and `config.json` into directory `path`; a cast
    also rewrites the config's `dtype` / `torch_dtype` fields where it has them, so the file says what it holds."""
    from safetensors.torch import save_file

    if dtype is not None:
        name = str(dtype).removeprefix("torch.")
        config = {**config, **{k: name for k in ("dtype", "torch_dtype") if k in config}}
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to(dtype or v.dtype).contiguous().cpu() for k, v in state.items()}
    replace_atomic(path / WEIGHTS_FILE, lambda tmp: save_file(tensors, tmp, metadata={"format": "pt"}))
    replace_atomic(path / CONFIG_FILE, lambda tmp: tmp.write_text(json.dumps(config, indent=2) + "\n"))
    return path


def save_module(module: torch.nn.Module, path: str | os.PathLike, config: dict,
                dtype: torch.dtype | None = None) -> Path:
    return save(path, module.state_dict(), config, dtype)
