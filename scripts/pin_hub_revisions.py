"""Pin every hub repo the defaults download to its current commit: writes src/specexp/hub_pins.json.

    python scripts/pin_hub_revisions.py            # needs the hub; prints repo, old pin, new pin
    python scripts/pin_hub_revisions.py --list     # the repos only (offline)

The repos: the hub targets (`conf/target/*.yaml`), every drafter's default checkpoints and heads
(`registry.DRAFTERS`), the released checkpoints the README names as `drafter.checkpoint` values (DSpark block-7,
Domino), the DeLS-Spec training corpora (`conf/data/*.yaml`) and the benchmark datasets of both editions
(`benchmarks.BENCHMARKS`). A revision set in a config still wins over a pin (src/specexp/pins.py). Commit the
file it writes: from then on the defaults download exactly those commits.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from specexp import benchmarks, pins, registry  # noqa: E402

RELEASED = ["deepseek-ai/dflash_qwen3_4b_block7", "deepseek-ai/dflash_qwen3_8b_block7",
            "Huang2020/Qwen3-4B-Domino-b16", "Huang2020/Qwen3-8B-Domino-b16"]


def _hub_repo(value) -> str | None:
    """`owner/name` of a hub id (`owner/name` or `owner/name/subfolder`); None for a local path."""
    if not isinstance(value, str) or value.startswith((".", "/", "~", "checkpoints/")) or (ROOT / value).exists():
        return None
    parts = value.split("/")
    return "/".join(parts[:2]) if len(parts) in (2, 3) else None


def repos() -> dict[str, list[str]]:
    """{"model": [...], "dataset": [...]}: every hub repo a default names, sorted."""
    models, datasets = set(RELEASED), set()
    for f in sorted((ROOT / "conf/target").glob("*.yaml")):
        t = yaml.safe_load(f.read_text())
        if t.get("loader") in ("hub", "smollm2") and t.get("hub_id"):
            models.add(t["hub_id"])
    for entry in registry.DRAFTERS.values():
        for keys in (entry.checkpoints or {}).values():
            models |= {r for r in map(_hub_repo, keys.values()) if r}
    for f in sorted((ROOT / "conf/data").glob("*.yaml")):
        hub = (yaml.safe_load(f.read_text()) or {}).get("hub") or {}
        if hub.get("id"):
            datasets.add(hub["id"])
    for spec in benchmarks.BENCHMARKS.values():
        for ed in (spec.staged, spec.reference):
            if ed is not None and ed.hub is not None:
                datasets.add(ed.hub.files_repo or ed.hub.dataset)
    return {"model": sorted(models), "dataset": sorted(datasets)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", action="store_true", help="print the repos and stop (no hub needed)")
    ap.add_argument("--out", type=Path, default=pins.PINS_FILE)
    args = ap.parse_args()
    wanted = repos()
    if args.list:
        for kind, ids in wanted.items():
            print("\n".join(f"{kind}\t{i}" for i in ids))
        return
    from huggingface_hub import HfApi

    api = HfApi()
    old = json.loads(args.out.read_text()) if args.out.exists() else {}
    new = {k: {} for k in pins.KINDS}
    print("| kind | repo | pinned before | pinned now |\n|---|---|---|---|")
    for kind, ids in wanted.items():
        info = api.model_info if kind == "model" else api.dataset_info
        for repo in ids:
            try:
                sha = info(repo).sha
            except Exception as e:       # one unreachable repo does not lose the others' pins
                print(f"{kind} {repo}: not readable ({type(e).__name__}); left unpinned", file=sys.stderr)
                continue
            new[kind][repo] = sha
            print(f"| {kind} | {repo} | {(old.get(kind) or {}).get(repo) or '–'} | {sha} |")
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(new, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, args.out)
    print(f"wrote {args.out}: {sum(map(len, new.values()))} of {sum(map(len, wanted.values()))} repos pinned")


if __name__ == "__main__":
    main()
