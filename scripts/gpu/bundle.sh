#!/usr/bin/env bash
# Builds the CUDA configuration HERE (a machine with the CUDA toolkit and NCCL; no GPU needed) and
# packs what the GPU host needs into .gpu/ (git-ignored; pass it to the device tool as carry):
#   .gpu/bundle.tgz  the build tree's programs, libraries, plugins and ctest files (stripped)
#   .gpu/debs/       runtime packages the GPU host lacks (Boost.Program_options 1.74, toml++,
#                    Google Benchmark 1.7 as Debian builds it)
# On the GPU host, scripts/gpu/run-suite.sh unpacks and uses them.
# Usage: scripts/gpu/bundle.sh [BUILD_DIR]   (default build-gpu)
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-gpu}
cmake -S . -B "$build" -G Ninja -DCIUIC_WITH_CUDA=ON -DCMAKE_BUILD_TYPE=Release >/dev/null
# What the GPU suite runs (scripts/gpu/run-suite.sh): the runner, every plugin, the GPU tests and
# the benchmarks it calls. (CPU-only tests are left out: they take long to build on small hosts.)
targets="ciuic-run ciuic_comm_gloo ciuic_comm_nccl ciuic_data_cached_ssd ciuic_data_synthetic
  ciuic_optimizer_cpu_adam ciuic_optimizer_adamw ciuic_precision_bf16 ciuic_precision_fp16 ciuic_precision_fp32
  ciuic_sharding_ddp ciuic_sharding_zero2 model_gpu_test comm_nccl_test ciuic_test_launch
  ciuic_test_worker bench_comm model_bench optim_bench"
cmake --build "$build" -j "$(nproc)" --target $targets
rm -rf .gpu && mkdir -p .gpu/debs
stage=$(mktemp -d)
(cd "$build" && find bin lib test-plugins -type f 2>/dev/null; find . -name CTestTestfile.cmake) |
  while read -r f; do
    mkdir -p "$stage/$(dirname "$f")"
    cp -a "$build/$f" "$stage/$f"
    case "$f" in *.so|*.so.*|bin/*) strip --strip-debug "$stage/$f" 2>/dev/null || true ;; esac
  done
(cd "$build" && find bin lib -type l) | while read -r l; do cp -a "$build/$l" "$stage/$l"; done
tar czf .gpu/bundle.tgz -C "$stage" .
rm -rf "$stage"
(cd .gpu/debs && apt-get download libboost-program-options1.74.0 libtomlplusplus3 libbenchmark1debian 2>&1 | grep -v unsandboxed || true)
du -sh .gpu/*
