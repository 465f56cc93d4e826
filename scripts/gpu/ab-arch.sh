#!/usr/bin/env bash
# Before/after on the GPU host, side by side in one call: the tree at .gpu/base (the commit before
# a change, exported with `git archive`) against this working tree, both built here
# (scripts/gpu/build-on-host.sh). Carry .gpu (base sources + debs) to the device tool.
#   scripts/gpu/ab-arch.sh build     build both (Release, CUDA)
#   scripts/gpu/ab-arch.sh parity    GPU parity of the new build (scripts/gpu/parity.py)
#   scripts/gpu/ab-arch.sh one       1B ZeRO-2 at 2 ranks over NVLink: base, then new
#   scripts/gpu/ab-arch.sh seven     the 3x4090 recipe's 7B shape at 2 ranks (pcie, 24 GiB cap):
#                                    base, new (and more variants of the new build when given)
#   scripts/gpu/ab-arch.sh seven-reversed   the same, new first
# Every run's log and metrics go to $OUT; scripts/gpu/summarize.py prints the table.
set -u
what=${1:-build}
OUT=${OUT:-/tmp/ciuic-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
ngpu=$(nvidia-smi -L | wc -l)
RUN_TAIL=20
source "$(dirname "$0")/lib.sh"  # run NAME TIMEOUT CMD...
ciuic() {  # ciuic NAME TIMEOUT BUILD RECIPE ARGS...  (the base build reads the base tree's recipe)
  local name=$1 limit=$2 build=$3 recipe=$4; shift 4
  [ "$build" = build-base ] && recipe=.gpu/base/$recipe
  rm -rf "/tmp/runs/$name"
  run "$name" "$limit" "$build/bin/ciuic-run" "$recipe" --set "run.output_dir=\"/tmp/runs/$name\"" "$@"
  cp "/tmp/runs/$name/metrics.jsonl" "$OUT/$name.metrics.jsonl" 2>/dev/null
}
one_b="configs/llama-1b-bench.toml --nproc $ngpu --set train.max_steps=20 --set log.every_steps=5"
seven="configs/bench/deepseek-7b-3x4090.toml --nproc $ngpu --set train.max_steps=3 --set scheduler.warmup_num_steps=2 --set log.every_steps=1 --set checkpoint.every_steps=0 --set checkpoint.save_final=false"
case "$what" in
build)
  run build-new 420 bash scripts/gpu/build-on-host.sh . build-gpu
  run build-base 420 bash scripts/gpu/build-on-host.sh .gpu/base build-base
  ls build-gpu/lib/ciuic/plugins build-base/lib/ciuic/plugins
  ;;
parity)
  run parity 200 python3 scripts/gpu/parity.py build-gpu/bin/ciuic-run /tmp/parity
  cp /tmp/parity/parity.json "$OUT/" 2>/dev/null
  ;;
one)
  ciuic base-1b 100 build-base $one_b
  ciuic new-1b 100 build-gpu $one_b
  ;;
cpuadam)  # 1B ZeRO-2 + cpu_adam under a 24 GiB cap (the host optimizer path), base/new twice
  for i in 1 2; do
    ciuic base-1b-cpuadam-$i 90 build-base $one_b --set offload.plugin=cpu_adam --set cluster.memory_per_device_gib=24.0 --set train.max_steps=8 --set log.every_steps=1
    ciuic new-1b-cpuadam-$i 90 build-gpu $one_b --set optimizer.plugin=cpu_adam --set cluster.memory_per_device_gib=24.0 --set train.max_steps=8 --set log.every_steps=1
  done
  ;;
seven)
  ciuic base-7b 240 build-base $seven
  ciuic new-7b 240 build-gpu $seven
  shift
  n=0
  for extra in "$@"; do  # more variants of the new build: "--set a=b --set c=d"
    n=$((n + 1))
    ciuic new-7b-v$n 240 build-gpu $seven $extra
  done
  ;;
seven-reversed)  # the new build first (the base ran first in the earlier call)
  ciuic new-7b 240 build-gpu $seven
  ciuic base-7b 240 build-base $seven
  shift
  n=0
  for extra in "$@"; do
    n=$((n + 1))
    ciuic new-7b-v$n 240 build-gpu $seven $extra
  done
  ;;
esac
python3 scripts/gpu/summarize.py "$OUT" | tee "$OUT/summary-$what.md"
