#!/usr/bin/env bash
# Fetches (here, where PyPI is reachable) the Python packages the LoRA peer needs
# (bench/peers/peft_lora.py: peft, bitsandbytes, accelerate, psutil; transformers and torch are on
# the GPU host) and unpacks them into .gpu/site (git-ignored), slimmed to fit the device tool's
# carry limit: bitsandbytes keeps only its CPU and CUDA 13.0 libraries (the host's torch is
# cu130; the wheel is 43 MB with every CUDA/ROCm/XPU build, 11 MB unpacked and slimmed). Carry .gpu; on the host
# scripts/gpu/lora.sh appends .gpu/site to the peer's sys.path (PEER_SITE), after the host's own
# packages. Versions: those scripts/setup-deps.sh pins for the fixtures.
#   bash scripts/gpu/fetch-peft.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
py=${PYTHON:-.venv/bin/python}
rm -rf .gpu/site && mkdir -p .gpu/site
"$py" -m pip install -q --no-compile --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_28_x86_64 \
  --target .gpu/site peft==0.21.2 bitsandbytes==0.50.2 accelerate==1.16.0 psutil==7.2.2
find .gpu/site/bitsandbytes -maxdepth 1 -name 'libbitsandbytes_*.so' ! -name libbitsandbytes_cpu.so \
  ! -name libbitsandbytes_cuda130.so -delete
rm -rf .gpu/site/bin
du -sh .gpu/site
