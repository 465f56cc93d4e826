# Shared by the GPU-host scripts (dense.sh, families.sh, hostmem.sh, run-suite.sh, ab-arch.sh, zero3.sh);
# sourced, not run.
# gpu_env NAME: RESULT = the device tool's $OUT (what comes back), OUT = /tmp/NAME (logs, packed
# into RESULT at the end), and the GPU host's environment (NVLink multicast off, the carried
# Debian libraries).
gpu_env() {
  RESULT=${OUT:-/tmp/ciuic-out}
  OUT=/tmp/$1
  mkdir -p "$OUT" "$RESULT"
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
  export LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
}
# run NAME TIMEOUT CMD...: one measured program, its output in $OUT/NAME.log; prints its exit
# status and wall time, and the log's tail when it failed.
run() {
  local name=$1 limit=$2; shift 2
  echo "=== $name: $*"
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "=== $name: exit $rc after $((SECONDS - t0)) s"
  [ $rc -eq 0 ] || tail -"${RUN_TAIL:-20}" "$OUT/$name.log"
  return $rc
}
# ciuic_run NAME TIMEOUT RECIPE ARGS...: one run of build-gpu/bin/ciuic-run with its output_dir
# /tmp/runs/NAME (emptied first), its metrics copied to $OUT/NAME.metrics.jsonl; returns run's status.
ciuic_run() {
  local name=$1 limit=$2 recipe=$3; shift 3
  rm -rf "/tmp/runs/$name"
  run "$name" "$limit" build-gpu/bin/ciuic-run "$recipe" --set "run.output_dir=\"/tmp/runs/$name\"" "$@"
  local rc=$?
  cp "/tmp/runs/$name/metrics.jsonl" "$OUT/$name.metrics.jsonl" 2>/dev/null
  return $rc
}
# fsdp2_peer NAME TIMEOUT ARGS...: the FSDP2 peer (bench/peers/fsdp2_llama.py) on one GPU, its
# figures in $OUT/NAME.json; prints the log's last line.
fsdp2_peer() {
  local name=$1 limit=$2; shift 2
  run "$name" "$limit" torchrun --standalone --nproc-per-node 1 bench/peers/fsdp2_llama.py --json "$OUT/$name.json" "$@"
  tail -1 "$OUT/$name.log"
}
