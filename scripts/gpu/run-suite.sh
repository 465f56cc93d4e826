#!/usr/bin/env bash
# Runs on the GPU host (device tool), from the repository root, with .gpu/ (scripts/gpu/bundle.sh)
# carried along. One call = one part, so that each fits a 10-minute command:
#   scripts/gpu/run-suite.sh check    the bundle loads; GPU tests (ctest -L gpu)
#   scripts/gpu/run-suite.sh part1    GPU model tests, ZeRO-2/DDP/cpu_adam parity over NCCL
#                                     (scripts/gpu/parity.py), 1B ZeRO-2 vs the FSDP2 peer (NVLink)
#   scripts/gpu/run-suite.sh part2    nccl plugin tests + bus bandwidth (comm-check.sh), 1B with
#                                     P2P disabled vs the peer, 1B with cpu_adam under a 24 GiB cap
#   scripts/gpu/run-suite.sh part3    part2's 1B pair, comm-check and cpu_adam again (after fixes)
#   scripts/gpu/run-suite.sh part4    the seed setups' 7B shapes at 2 ranks (24 / 40 GiB caps)
#   scripts/gpu/run-suite.sh part5    part4's 7B runs only
#   scripts/gpu/run-suite.sh part6    parity, then zero2+cpu_adam+bf16 at 1B and at the 3x4090
#                                     recipe's 7B shape (2 ranks, 24 GiB cap) with the step breakdown
#   scripts/gpu/run-suite.sh part7    both seed recipes' 7B shapes at 2 ranks, step breakdown
#   scripts/gpu/run-suite.sh part8    parity, 1B with and without cpu_adam, both 7B shapes
#   scripts/gpu/run-suite.sh part9    1B cpu_adam and 3 steps of the 3x4090 7B shape
# Every run's log, metrics and peer JSON go to $OUT; scripts/gpu/summarize.py prints the table.
set -u
part=${1:-check}
OUT=${OUT:-/tmp/ciuic-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1

# The build was made in /work/main: make that path lead here so its absolute paths resolve.
if [ ! -e /work/main/.gpu ]; then mkdir -p /work && rm -rf /work/main && ln -s "$PWD" /work/main; fi
cd /work/main
mkdir -p /tmp/gpudeps && for f in .gpu/debs/*.deb; do dpkg -x "$f" /tmp/gpudeps; done
TORCH_LIB=$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
export LD_LIBRARY_PATH=/tmp/gpudeps/usr/lib/x86_64-linux-gnu:$TORCH_LIB:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
rm -rf build-gpu && mkdir -p build-gpu && tar xzf .gpu/bundle.tgz -C build-gpu
B=build-gpu/bin
one_b="configs/llama-1b-bench.toml --set train.max_steps=20 --set log.every_steps=5"
ngpu=$(nvidia-smi -L | wc -l)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpus.txt"
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
"$B/ciuic-run" --version > "$OUT/version.txt" 2>&1 || { cat "$OUT/version.txt"; echo "bundle does not load"; exit 3; }
"$B/ciuic-run" --list-plugins | tee "$OUT/plugins.txt"

RUN_TAIL=15
source "$(dirname "$0")/lib.sh"  # run NAME TIMEOUT CMD...
# ciuic NAME TIMEOUT RECIPE ARGS...: a ciuic-run training run; keeps its metrics.jsonl
ciuic() {
  local name=$1 limit=$2 recipe=$3; shift 3
  rm -rf "/tmp/runs/$name"  # a fresh run each time (ciuic-run refuses a folder with another run's files)
  run "$name" "$limit" "$B/ciuic-run" "$recipe" --set "run.output_dir=\"/tmp/runs/$name\"" "$@"
  cp "/tmp/runs/$name/metrics.jsonl" "$OUT/$name.metrics.jsonl" 2>/dev/null
}
peer() {  # peer NAME TIMEOUT NPROC ARGS...
  local name=$1 limit=$2 n=$3; shift 3
  run "$name" "$limit" torchrun --standalone --nproc-per-node "$n" bench/peers/fsdp2_llama.py --json "$OUT/$name.json" "$@"
}

case "$part" in
check)
  (cd build-gpu && run gpu-tests 300 ctest -L gpu --output-on-failure)
  ;;
part1)  # correctness on the GPUs, then the 1B shape against the FSDP2 peer over NVLink
  (cd build-gpu && run gpu-tests 150 ctest -L gpu -E comm --output-on-failure)
  run parity 200 python3 scripts/gpu/parity.py "$B/ciuic-run" /tmp/parity
  cp /tmp/parity/parity.json "$OUT/" 2>/dev/null
  ciuic z2-1b-nvlink 100 $one_b --nproc "$ngpu"
  peer fsdp2-1b-nvlink 100 "$ngpu"
  ;;
part2)  # NCCL through the plugin (tests + bus bandwidth), 1B vs the peer (NVLink, P2P disabled), cpu_adam
  ciuic z2-1b-nvlink 100 $one_b --nproc "$ngpu"
  peer fsdp2-1b-nvlink 100 "$ngpu"
  [ -x scripts/gpu/comm-check.sh ] && MAX_BYTES=268435456 run comm-check 150 scripts/gpu/comm-check.sh build-gpu "$OUT/comm"
  ciuic z2-1b-pcie 90 $one_b --nproc "$ngpu" --set comm.transport=pcie
  NCCL_P2P_DISABLE=1 peer fsdp2-1b-nop2p 90 "$ngpu"
  ciuic z2-1b-cpuadam 150 $one_b --nproc "$ngpu" --set optimizer.plugin=cpu_adam \
        --set cluster.memory_per_device_gib=24.0 --set train.max_steps=8 --set log.every_steps=2
  ;;
part3)  # part2 again after the bounded in-flight reductions and the nccl enqueue fix, plus cpu_adam
  ciuic z2-1b-nvlink 100 $one_b --nproc "$ngpu"
  peer fsdp2-1b-nvlink 100 "$ngpu"
  [ -x scripts/gpu/comm-check.sh ] && MAX_BYTES=268435456 run comm-check 150 scripts/gpu/comm-check.sh build-gpu "$OUT/comm"
  ciuic z2-1b-cpuadam 150 $one_b --nproc "$ngpu" --set optimizer.plugin=cpu_adam \
        --set cluster.memory_per_device_gib=24.0 --set train.max_steps=8 --set log.every_steps=2
  ;;
part5)  # part4's 7B runs only (after the set-up and accumulation fixes)
  seven="--nproc $ngpu --set train.max_steps=2 --set log.every_steps=1 --set checkpoint.every_steps=0 --set checkpoint.save_final=false"
  ciuic ds7b-4090-2rank 150 configs/bench/deepseek-7b-3x4090.toml $seven
  ciuic ds67b-a100-2rank 150 configs/bench/deepseek-6.7b-4xa100.toml $seven
  ;;
part6)  # parity again (the host-gradient paths changed after part1), then zero2+cpu_adam+bf16 with
        # the step breakdown: the 1B shape and the 3x4090 recipe's 7B shape at 2 ranks, 24 GiB cap
  run parity 180 python3 scripts/gpu/parity.py "$B/ciuic-run" /tmp/parity
  cp /tmp/parity/parity.json "$OUT/" 2>/dev/null
  ciuic z2-1b-cpuadam 120 $one_b --nproc "$ngpu" --set optimizer.plugin=cpu_adam \
        --set cluster.memory_per_device_gib=24.0 --set train.max_steps=8 --set log.every_steps=1
  ciuic ds7b-4090-2rank 220 configs/bench/deepseek-7b-3x4090.toml --nproc "$ngpu" --set train.max_steps=6 \
        --set scheduler.warmup_num_steps=2 --set log.every_steps=1 --set checkpoint.every_steps=0 \
        --set checkpoint.save_final=false
  ;;
part7)  # the seed setups' 7B shapes at 2 ranks with expandable segments, step breakdown
  seven="--nproc $ngpu --set train.max_steps=6 --set scheduler.warmup_num_steps=2 --set log.every_steps=1 --set checkpoint.every_steps=0 --set checkpoint.save_final=false"
  ciuic ds7b-4090-2rank 250 configs/bench/deepseek-7b-3x4090.toml $seven
  ciuic ds67b-a100-2rank 250 configs/bench/deepseek-6.7b-4xa100.toml $seven
  ;;
part8)  # after the host gradient fold: parity, 1B (device update and cpu_adam), both 7B shapes
  run parity 150 python3 scripts/gpu/parity.py "$B/ciuic-run" /tmp/parity
  cp /tmp/parity/parity.json "$OUT/" 2>/dev/null
  ciuic z2-1b-nvlink 80 $one_b --nproc "$ngpu"
  ciuic z2-1b-cpuadam 90 $one_b --nproc "$ngpu" --set optimizer.plugin=cpu_adam \
        --set cluster.memory_per_device_gib=24.0 --set train.max_steps=8 --set log.every_steps=1
  seven="--nproc $ngpu --set train.max_steps=6 --set scheduler.warmup_num_steps=2 --set log.every_steps=1 --set checkpoint.every_steps=0 --set checkpoint.save_final=false"
  ciuic ds7b-4090-2rank 200 configs/bench/deepseek-7b-3x4090.toml $seven
  ciuic ds67b-a100-2rank 150 configs/bench/deepseek-6.7b-4xa100.toml $seven
  ;;
part9)  # the host fold on its own thread team: 1B cpu_adam, then 3 steps of the 3x4090 7B shape
  ciuic z2-1b-cpuadam 70 $one_b --nproc "$ngpu" --set optimizer.plugin=cpu_adam \
        --set cluster.memory_per_device_gib=24.0 --set train.max_steps=8 --set log.every_steps=1
  ciuic ds7b-4090-2rank 160 configs/bench/deepseek-7b-3x4090.toml --nproc "$ngpu" --set train.max_steps=3 \
        --set scheduler.warmup_num_steps=2 --set log.every_steps=1 --set checkpoint.every_steps=0 \
        --set checkpoint.save_final=false
  ;;
part4)  # cpu_adam at 1B again (asynchronous gradient copies), then the seed setups' 7B shapes at
        # 2 ranks (cpu_adam; 24 / 40 GiB caps), their own batches
  ciuic z2-1b-cpuadam 120 $one_b --nproc "$ngpu" --set optimizer.plugin=cpu_adam \
        --set cluster.memory_per_device_gib=24.0 --set train.max_steps=8 --set log.every_steps=2
  seven="--nproc $ngpu --set train.max_steps=2 --set log.every_steps=1 --set checkpoint.every_steps=0 --set checkpoint.save_final=false"
  ciuic ds7b-4090-2rank 160 configs/bench/deepseek-7b-3x4090.toml $seven
  ciuic ds67b-a100-2rank 160 configs/bench/deepseek-6.7b-4xa100.toml $seven
  ;;
esac
python3 scripts/gpu/summarize.py "$OUT" | tee "$OUT/summary.md"
# The device tool brings back a few files only: everything goes back as one archive.
tar czf /tmp/suite-$part.tgz -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv /tmp/suite-$part.tgz "$OUT/"
