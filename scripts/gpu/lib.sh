# Shared by the GPU-host scripts (dense.sh, run-suite.sh, ab-arch.sh); sourced, not run.
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
