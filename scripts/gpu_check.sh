#!/usr/bin/env bash
# First contact with a GPU, offline, in under 10 minutes: every check of scripts/gpu_check.py (its docstring lists
# them), one JSON report. Uses the Python of the environment that holds the machine's torch ($PYTHON, default python3);
# install specexp's pure-Python dependencies into it first (README, Environment: an offline GPU machine).
#   bash scripts/gpu_check.sh                      # -> gpu_check.json; exit status 1 when a part failed
#   bash scripts/gpu_check.sh --out /tmp/r.json --layers 18 --parts qwen3_8b_shape
#   bash scripts/gpu_check.sh --dry-run            # on a CPU: what can run there (a few minutes)
set -uo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false
PY="${PYTHON:-python3}"
"$PY" -c "import torch" 2>/dev/null || {
  echo "gpu_check.sh: $PY cannot import torch; set PYTHON=/path/to/python of the environment that holds it" >&2; exit 2; }
exec "$PY" scripts/gpu_check.py "$@"
