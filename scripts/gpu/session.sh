#!/usr/bin/env bash
# One device call of this session (docs/performance.md says which): builds this tree with its
# tests and the base tree (.gpu/base) without, in parallel; then backtraces of the given crashing
# tests (cuda-gdb) and the given ctest entries, then scripts/gpu/ab-arch.sh one.
# Usage: scripts/gpu/session.sh "TEST1 TEST2" "CTEST_REGEX"
set -u
OUT=${OUT:-/tmp/ciuic-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
t0=$SECONDS
(CIUIC_HOST_TESTS=ON bash scripts/gpu/build-on-host.sh . build-gpu > "$OUT/build-new.txt" 2>&1; echo "new rc=$?" >> "$OUT/build-new.txt") &
(bash scripts/gpu/build-on-host.sh .gpu/base build-base > "$OUT/build-base.txt" 2>&1; echo "base rc=$?" >> "$OUT/build-base.txt") &
wait
echo "builds: $((SECONDS - t0)) s"; tail -3 "$OUT/build-new.txt" "$OUT/build-base.txt"
for t in $1; do
  (cd build-gpu && timeout 90 cuda-gdb -batch -ex run -ex bt --args bin/$t > "$OUT/gdb-$t.txt" 2>&1)
  grep -A20 "received signal" "$OUT/gdb-$t.txt" | head -24
done
if [ -n "$2" ]; then  # in the background: the caller runs GPU work meanwhile and waits
  (cd build-gpu && timeout 240 ctest -j 12 -R "$2" --output-on-failure > "$OUT/ctest.log" 2>&1; echo "ctest rc=$?" >> "$OUT/ctest.log") &
  echo $! > /tmp/ctest.pid
fi
