#!/usr/bin/env bash
# Downloads (does not install) the Debian packages that the GPU build host lacks, so that they
# can travel with the working tree. Usage: fetch-deps.sh DIR   (DIR should be git-ignored).
# The GPU host image already has: LibTorch (python3's torch, CUDA 13.0), NCCL, CUDA, Boost 1.83
# headers (no compiled Boost libraries), fmt 9.1, GoogleTest 1.14, Google Benchmark 1.8, nlohmann-json,
# spdlog, CLI11. It lacks toml++ and Boost.Program_options, fetched here.
set -euo pipefail
dir=${1:?usage: fetch-deps.sh DIR}
mkdir -p "$dir" && cd "$dir"
pkgs=(libtomlplusplus-dev libtomlplusplus3 libgloo-dev libpcre2-dev libpcre2-8-0 libboost-program-options1.74-dev libboost-program-options1.74.0 libboost1.74-dev)
apt-get download "${pkgs[@]}" 2>&1 | grep -v "unsandboxed" || true
ls -la *.deb
