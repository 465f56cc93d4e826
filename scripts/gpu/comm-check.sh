#!/usr/bin/env bash
# GPU checks of the nccl comm plugin, from an existing CUDA build (this script builds nothing):
#   1. tests/plugins/comm comm_nccl_test (label gpu): every collective vs a CPU reference on 2 GPUs, for
#      the transports auto, nvlink, pcie and shm, plus the timeout/abort path;
#   2. bench/comm bench_comm: bus bandwidth (nccl-tests' definition) of all_reduce,
#      reduce_scatter and all_gather through the plugin and through NCCL alone, for the transports
#      auto and pcie;
# then prints one table (markdown) with the results and the ratios measured side by side.
#
# Usage: scripts/gpu/comm-check.sh BUILD_DIR [OUT_DIR]
#   BUILD_DIR  a build configured with -DCIUIC_WITH_CUDA=ON, with the targets comm_nccl_test,
#              bench_comm, ciuic_test_launch and the plugin ciuic_comm_nccl built
#   OUT_DIR    logs and JSON results (default: BUILD_DIR/comm-check)
# Environment: NPROC (default 2), MAX_BYTES (default 1073741824), ITERS (default 20).
# Exit status: non-zero when a test failed or a benchmark did not run.
set -uo pipefail
build=${1:?usage: comm-check.sh BUILD_DIR [OUT_DIR]}
out=${2:-$build/comm-check}
nproc=${NPROC:-2}
max_bytes=${MAX_BYTES:-1073741824}
iters=${ITERS:-20}
mkdir -p "$out"
# NVLink multicast (NVLS) stays off on shared GPU hosts; the plugin never turns it on.
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}

for f in bin/comm_nccl_test bin/bench_comm bin/ciuic_test_launch lib/ciuic/plugins/libciuic_comm_nccl.so; do
  [[ -e $build/$f ]] || { echo "comm-check: $build/$f is missing (build it first)" >&2; exit 2; }
done

status=0
echo "== GPUs"
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader 2>/dev/null || echo "(nvidia-smi unavailable)"
nvidia-smi topo -m 2>/dev/null | head -n 4 || true

echo "== comm_nccl_test"
"$build/bin/comm_nccl_test" --gtest_color=no >"$out/comm_nccl_test.log" 2>&1
rc=$?
grep -E '^\[ +(OK|FAILED|SKIPPED) +\] ' "$out/comm_nccl_test.log" | sed 's/^/  /'
grep -E 'checks, [0-9]+ failures|timeout error after' "$out/comm_nccl_test.log" | sed 's/^/  /'
if [[ $rc -ne 0 ]]; then
  echo "  comm_nccl_test FAILED (exit $rc): see $out/comm_nccl_test.log"; status=1
  grep -E 'error|Failure' "$out/comm_nccl_test.log" | head -n 20 | sed 's/^/    /'
fi

for t in auto pcie; do
  echo "== bench_comm --transport $t"
  "$build/bin/bench_comm" --backend nccl --nproc "$nproc" --transport "$t" --min-bytes 1048576 \
    --max-bytes "$max_bytes" --iters "$iters" --warmup 5 --benchmark_format=console \
    --benchmark_out="$out/bench-$t.json" --benchmark_out_format=json >"$out/bench-$t.log" 2>&1
  rc=$?
  if [[ $rc -ne 0 ]]; then
    echo "  bench_comm ($t) FAILED (exit $rc): see $out/bench-$t.log"; status=1
    tail -n 20 "$out/bench-$t.log" | sed 's/^/    /'
  fi
done

echo "== bus bandwidth, GB/s (nccl-tests' busbw; ciuic = the plugin, nccl = NCCL alone in the same run)"
python3 - "$out" <<'EOF'
import json, os, sys
out = sys.argv[1]
res = {}  # (transport, op, impl, bytes) -> busbw GB/s
for t in ("auto", "pcie"):
    p = os.path.join(out, f"bench-{t}.json")
    if not os.path.exists(p):
        continue
    for b in json.load(open(p)).get("benchmarks", []):
        # name: nccl-<transport>/<op>/<impl>/<bytes>/iterations:N/manual_time
        parts = b["name"].split("/")
        if len(parts) < 4 or "busbw" not in b:
            continue
        res[(t, parts[1], parts[2], int(parts[3]))] = b["busbw"] / 1e9
def cell(v):
    return "-" if v is None else f"{v:.1f}"
def ratio(a, b):
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}"
print("| op | size | ciuic auto | nccl auto | ciuic/nccl | ciuic pcie | nccl pcie | pcie/auto (ciuic) |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
keys = sorted({(op, n) for (_, op, _, n) in res})
for op, n in keys:
    ca, na = res.get(("auto", op, "ciuic", n)), res.get(("auto", op, "nccl", n))
    cp, np_ = res.get(("pcie", op, "ciuic", n)), res.get(("pcie", op, "nccl", n))
    size = f"{n / 2**20:.0f} MiB"
    print(f"| {op} | {size} | {cell(ca)} | {cell(na)} | {ratio(ca, na)} | {cell(cp)} | {cell(np_)} | {ratio(cp, ca)} |")
if not res:
    print("(no benchmark results)")
EOF
exit $status
