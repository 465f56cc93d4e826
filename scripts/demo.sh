#!/usr/bin/env bash
# `make demo`: trains the default tiny recipe on CPU (grows with the engine).
set -euo pipefail
build=${1:-build}
cd "$(dirname "$0")/.."
exec "$build/bin/ciuic-run" configs/tiny-cpu.toml
