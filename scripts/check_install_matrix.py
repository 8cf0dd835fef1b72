"""Does `pip install specexp` resolve on every supported Python, and inside a typical GPU image?

For each case `uv pip compile` resolves the package's declared dependencies (pyproject.toml, with the `test`
extra) for the given interpreter version on manylinux x86_64 against the package index: nothing is installed,
only the resolution is checked (from the wheels' metadata). pip cannot do this for another interpreter version
here: `pip --python-version` needs `--only-binary=:all:`, and omegaconf's antlr4 runtime is an sdist only.
uv is a development tool, not a dependency: `pip install uv` anywhere, or pass `--uv PATH`. Cases:
  - Python 3.11, 3.12, 3.13 on manylinux x86_64, no constraint (what a fresh `pip install -e .` would pick);
  - the GPU image the project is first run on: Python 3.12 with torch 2.11, Triton 3.6 and transformers 5.17
    already installed (passed as constraints, so a resolution that needs another torch fails here).
It also checks `requires-python` admits each version. The interpreter actually on this machine is covered by
`bash scripts/install.sh test` itself (the CPU wheel of constraints/cpu.txt); other versions are checked by
resolution only, because no CPU torch wheel for them is at hand here.

    python scripts/check_install_matrix.py [--out results.json]
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[1]
CASES = [  # (name, python version, constraints)
    ("py3.11", "3.11", []),
    ("py3.12", "3.12", []),
    ("py3.13", "3.13", []),
    ("gpu-image py3.12 torch2.11 triton3.6 tf5.17", "3.12", ["torch==2.11.0", "triton==3.6.0", "transformers==5.17.0"]),
]
SHOW = ("torch", "triton", "transformers", "lightning", "hydra-core", "huggingface-hub", "datasets", "wandb")


def requirements() -> list[str]:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return meta["dependencies"] + meta["optional-dependencies"]["test"]


def resolve(uv: str, version: str, constraints: list[str], tmp: Path) -> dict:
    req = tmp / "requirements.in"
    req.write_text("\n".join(requirements()) + "\n")
    con = tmp / f"constraints-{version}-{len(constraints)}.txt"
    con.write_text("\n".join(constraints) + "\n")
    out = tmp / f"resolved-{version}-{len(constraints)}.txt"
    cmd = [uv, "pip", "compile", str(req), "-c", str(con), "--python-version", version,
           "--python-platform", "x86_64-manylinux_2_28", "--quiet", "--no-header", "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        return {"ok": False, "error": " | ".join(lines[-4:])}
    pins = [ln.split("==") for ln in out.read_text().splitlines() if "==" in ln and not ln.startswith(" ")]
    versions = {name.strip().lower(): ver.split(";")[0].strip() for name, ver in pins}
    return {"ok": True, "packages": len(versions), "versions": {k: versions.get(k) for k in SHOW}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="also write the results as JSON here")
    ap.add_argument("--uv", default=shutil.which("uv"), help="the uv executable (default: uv on PATH)")
    args = ap.parse_args()
    if not args.uv:
        sys.exit("check_install_matrix: uv not found; install it (pip install uv) or pass --uv PATH")
    spec = SpecifierSet(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"])
    results = {}
    with tempfile.TemporaryDirectory() as d:
        for name, version, constraints in CASES:
            row = {"python": version, "requires_python_ok": spec.contains(version + ".0"), "constraints": constraints}
            row.update(resolve(args.uv, version, constraints, Path(d)))
            results[name] = row
            shown = ", ".join(f"{k} {v}" for k, v in row.get("versions", {}).items()) or row.get("error", "")
            print(f"{name:46s} {'ok' if row['ok'] and row['requires_python_ok'] else 'FAIL':4s} {shown}", flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    sys.exit(0 if all(r["ok"] and r["requires_python_ok"] for r in results.values()) else 1)


if __name__ == "__main__":
    main()
