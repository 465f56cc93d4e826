# Shared by the GPU-host scripts (dense.sh, hostmem.sh, run-suite.sh, ab-arch.sh); sourced, not run.
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
