#!/usr/bin/env bash
# Builds ciuic's runner and plugins (CUDA, Release; no tests, no benchmarks) ON the GPU host, from
# a source folder, with the Debian packages that host lacks carried in .gpu/debs
# (scripts/gpu/fetch-debs.sh fetches them here). On the 2-GPU host's 32 cores this is quicker than
# building here and shipping binaries.
# Usage: scripts/gpu/build-on-host.sh [SRC [BUILD]]     (defaults: . build-gpu)
# CIUIC_HOST_TESTS=ON also builds the tests and benchmarks (then `ctest` runs there too);
# CIUIC_HOST_TARGETS="t1 t2" builds only those targets;
# CIUIC_HOST_CUDA=OFF builds as CI does (no CUDA targets; the tests then run as on CI).
set -euo pipefail
src=${1:-.} build=${2:-build-gpu}
prefix=/tmp/deps
mkdir -p "$prefix"
# Unpacked once (two builds started together must not unpack over each other).
[ -e "$prefix/.unpacked" ] || { for f in .gpu/debs/*.deb; do dpkg -x "$f" "$prefix"; done; touch "$prefix/.unpacked"; }
export PKG_CONFIG_PATH=$prefix/usr/lib/x86_64-linux-gnu/pkgconfig:${PKG_CONFIG_PATH:-}
torch=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
cmake -S "$src" -B "$build" -G Ninja -DCIUIC_WITH_CUDA=${CIUIC_HOST_CUDA:-ON} -DCMAKE_BUILD_TYPE=${CIUIC_HOST_BUILD_TYPE:-Release} \
  -DCIUIC_BUILD_TESTS=${CIUIC_HOST_TESTS:-OFF} -DCIUIC_BUILD_BENCH=${CIUIC_HOST_TESTS:-OFF} \
  "-DCMAKE_PREFIX_PATH=$prefix/usr;$torch" -DBoost_ROOT=$prefix/usr -DBoost_NO_SYSTEM_PATHS=ON \
  -DBoost_INCLUDE_DIR=$prefix/usr/include > "$build.configure.log" 2>&1 || { tail -30 "$build.configure.log"; exit 1; }
set -o pipefail
# CIUIC_HOST_TARGETS: build only these targets (e.g. "runtime model_gpu_test model_bench").
targets=()
for t in ${CIUIC_HOST_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$build" -j "${CIUIC_HOST_JOBS:-$(nproc)}" "${targets[@]}" -- -k 0 > "$build.build.log" 2>&1 || {
  grep -E "error|FAILED|undefined reference" "$build.build.log" | head -60; exit 1; }
tail -2 "$build.build.log"
