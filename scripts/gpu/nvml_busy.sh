#!/usr/bin/env bash
# The per-rank records' device busy fraction (NVML through dlopen, core/src/train/nvml.cpp) on a
# GPU host, against a known busy/idle pattern (scripts/gpu/nvml_busy.cu). Needs nvcc and the
# driver only, no ciuic build: one device call, seconds.
#   bash scripts/gpu/nvml_busy.sh        -> prints each window's busy fraction, PASS or FAIL
set -eu
cd "$(dirname "$0")/../.."
out=${TMPDIR:-/tmp}/ciuic-nvml-busy
nvcc -O2 -std=c++17 -Icore/src -Icore/include -o "$out" scripts/gpu/nvml_busy.cu core/src/train/nvml.cpp -ldl
"$out"
