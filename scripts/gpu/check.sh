#!/usr/bin/env bash
# One device call that checks a tree before it lands (docs/performance.md names the calls):
#   scripts/gpu/check.sh tests    build this tree as CI does (no CUDA, RelWithDebInfo, tests) and
#                                 with CUDA (Release), run the whole ctest suite of the CPU build
#                                 with no GPU visible, and GPU parity (scripts/gpu/parity.py)
#   scripts/gpu/check.sh cpu      the CI build and suite only
#   scripts/gpu/check.sh cuda     build this tree with CUDA and its tests (Release) and run, with the
#                                 GPU visible, every test that has a CUDA case (ctest -R below), then
#                                 GPU parity (scripts/gpu/parity.py): a change to the slots' ABI
#                                 compiles and holds on the device
#   scripts/gpu/check.sh seven    build this tree and .gpu/base (CUDA, Release) and run the
#                                 3x4090 recipe's 7B shape at 2 ranks: this tree first, then base
# Everything lands in $OUT (logs, metrics, ctest.log, summary-*.md). Carry .gpu.
set -u
what=${1:-tests}
OUT=${OUT:-/tmp/ciuic-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
t0=$SECONDS
ncpu=$(nproc)
mkdir -p /tmp/deps && [ -e /tmp/deps/.unpacked ] || { for f in .gpu/debs/*.deb; do dpkg -x "$f" /tmp/deps; done; touch /tmp/deps/.unpacked; }
case "$what" in
tests)
  (CIUIC_HOST_CUDA=OFF CIUIC_HOST_TESTS=ON CIUIC_HOST_BUILD_TYPE=RelWithDebInfo CIUIC_HOST_JOBS=$((ncpu / 2)) \
     bash scripts/gpu/build-on-host.sh . build-cpu > "$OUT/build-cpu.txt" 2>&1; echo "cpu rc=$?" >> "$OUT/build-cpu.txt") &
  (CIUIC_HOST_JOBS=$((ncpu / 2)) bash scripts/gpu/build-on-host.sh . build-gpu > "$OUT/build-gpu.txt" 2>&1; echo "gpu rc=$?" >> "$OUT/build-gpu.txt") &
  wait
  echo "builds: $((SECONDS - t0)) s"; tail -n 4 "$OUT/build-cpu.txt" "$OUT/build-gpu.txt"
  grep -E "error|FAILED" build-cpu.build.log build-gpu.build.log | head -40
  (cd build-cpu && CUDA_VISIBLE_DEVICES= timeout 360 ctest -j 12 --output-on-failure > "$OUT/ctest.log" 2>&1; echo "ctest rc=$?" >> "$OUT/ctest.log") &
  ct=$!
  timeout 200 python3 scripts/gpu/parity.py build-gpu/bin/ciuic-run /tmp/parity > "$OUT/parity.log" 2>&1
  echo "parity rc=$? after $((SECONDS - t0)) s"; tail -15 "$OUT/parity.log"
  cp /tmp/parity/parity.json "$OUT/" 2>/dev/null
  wait $ct
  grep -E "tests passed|Total Test|\*\*\*|Test +#|ctest rc" "$OUT/ctest.log"
  grep -E "^\[  FAILED|Failure" "$OUT/ctest.log" | head -30
  ;;
cpu)  # the CI build and suite only (no CUDA build, no parity)
  CIUIC_HOST_CUDA=OFF CIUIC_HOST_TESTS=ON CIUIC_HOST_BUILD_TYPE=RelWithDebInfo \
    bash scripts/gpu/build-on-host.sh . build-cpu > "$OUT/build-cpu.txt" 2>&1
  echo "build rc=$? after $((SECONDS - t0)) s"; tail -n 3 "$OUT/build-cpu.txt"
  (cd build-cpu && CUDA_VISIBLE_DEVICES= timeout 360 ctest -j 14 --output-on-failure > "$OUT/ctest.log" 2>&1; echo "ctest rc=$?" >> "$OUT/ctest.log")
  grep -E "tests passed|Total Test|\*\*\*|Test +#|ctest rc" "$OUT/ctest.log"
  grep -E "^\[  FAILED|Failure" "$OUT/ctest.log" | head -30
  ;;
cuda)  # the CUDA build with tests; the tests that have CUDA cases, then parity
  CIUIC_HOST_TESTS=ON bash scripts/gpu/build-on-host.sh . build-gpu > "$OUT/build-gpu.txt" 2>&1
  echo "build rc=$? after $((SECONDS - t0)) s"; tail -n 3 "$OUT/build-gpu.txt"
  (cd build-gpu && timeout 300 ctest -j 4 --output-on-failure \
     -R 'nvml_test|model_gpu|model_test|comm_nccl|flat_buckets|optimizer_|sharding_|train_early|train_lora_e2e|quant_test|qlora_test|generate_test|conformance_(adamw|cpu_adam|bf16|fp16|fp32)' \
     > "$OUT/ctest.log" 2>&1; echo "ctest rc=$?" >> "$OUT/ctest.log")
  grep -E "tests passed|Total Test|\*\*\*|Test +#|ctest rc" "$OUT/ctest.log"
  grep -E "^\[  FAILED|Failure|SKIPPED" "$OUT/ctest.log" | head -30
  timeout 200 python3 scripts/gpu/parity.py build-gpu/bin/ciuic-run /tmp/parity > "$OUT/parity.log" 2>&1
  echo "parity rc=$? after $((SECONDS - t0)) s"; tail -15 "$OUT/parity.log"
  ;;
seven)
  (CIUIC_HOST_JOBS=$((ncpu / 2)) bash scripts/gpu/build-on-host.sh . build-gpu > "$OUT/build-gpu.txt" 2>&1; echo "gpu rc=$?" >> "$OUT/build-gpu.txt") &
  (CIUIC_HOST_JOBS=$((ncpu / 2)) bash scripts/gpu/build-on-host.sh .gpu/base build-base > "$OUT/build-base.txt" 2>&1; echo "base rc=$?" >> "$OUT/build-base.txt") &
  wait
  echo "builds: $((SECONDS - t0)) s"; tail -n 2 "$OUT/build-gpu.txt" "$OUT/build-base.txt"
  OUT=$OUT bash scripts/gpu/ab-arch.sh seven-reversed "${@:2}"
  ;;
esac
echo "total: $((SECONDS - t0)) s"
