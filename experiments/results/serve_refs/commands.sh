#!/usr/bin/env bash
# Issue 60 item 4: replay τ on specexp's references vs vLLM's, mini target, eval split, fp32 (then bf16 counts).
# Run from the repository root: bash experiments/results/serve_refs/commands.sh OUT_DIR
set -euo pipefail
OUT=${1:?usage: commands.sh OUT_DIR}
PY=${PY:-.venv/bin/python}
VLLM_PY=${VLLM_PY:-.venv-serve/bin/python}
SIZE="eval.num_samples=2 eval.max_new_tokens=64"          # 2 prompts of each of the 8 benchmarks (MT-Bench: 2 turns)
CACHE="replay.cache_dir=$OUT/refs replay.tap_cache_dir=$OUT/taps"   # fresh caches: every reference is decoded
FP32="target.dtype=float32 target.prepack=false"
t() { local s=$SECONDS; "$@"; echo "TIME $(( SECONDS - s )) s: ${*: -1}" | tee -a "$OUT/times.txt"; }
mkdir -p "$OUT"
grep -o -E 'avx512_bf16|amx_bf16|avx512f|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ' > "$OUT/cpu_flags.txt"
uptime > "$OUT/uptime_start.txt"
t $PY -m specexp task=replay drafter=dflash $SIZE $FP32 $CACHE hydra.run.dir=$OUT/replay_specexp
t $PY -m specexp task=replay drafter=dflash $SIZE $FP32 $CACHE replay.reference_engine=vllm \
    replay.vllm_python=$VLLM_PY hydra.run.dir=$OUT/replay_vllm
t $PY -m specexp task=compare compare.a=$OUT/replay_vllm compare.b=$OUT/replay_specexp hydra.run.dir=$OUT/compare
t $PY experiments/serve_refs.py $OUT/replay_specexp $OUT/replay_vllm $OUT/equal_fp32.json
uptime > "$OUT/uptime_fp32.txt"
if [ "${BF16:-1}" = 1 ]; then     # bf16: the references alone, both engines, then the same count
  BF="target.dtype=bfloat16 target.prepack=false"
  t $PY -m specexp task=replay drafter=dflash $SIZE $BF $CACHE hydra.run.dir=$OUT/replay_specexp_bf16
  t $PY -m specexp task=replay drafter=dflash $SIZE $BF $CACHE replay.reference_engine=vllm \
      replay.vllm_python=$VLLM_PY hydra.run.dir=$OUT/replay_vllm_bf16
  t $PY experiments/serve_refs.py $OUT/replay_specexp_bf16 $OUT/replay_vllm_bf16 $OUT/equal_bf16.json
  uptime > "$OUT/uptime_end.txt"
fi
