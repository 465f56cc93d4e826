#!/usr/bin/env bash
# The per-rank records' device busy fraction on a GPU host, both sources (docs/metrics.md,
# device_busy and busy_source):
#   bash scripts/gpu/nvml_busy.sh          NVML through dlopen (core/src/train/nvml.cpp) against a
#                                          known busy/idle pattern (scripts/gpu/nvml_busy.cu): nvcc
#                                          and the driver only, no ciuic build; seconds
#   bash scripts/gpu/nvml_busy.sh events   the CUDA-event fallback (core/src/train/event_busy.cpp):
#                                          builds ciuic with CUDA and its tests (build-gpu), runs
#                                          nvml_test (its CUDA case: matmuls then idle read ~1/2),
#                                          then trains a tiny model on the GPU twice, with NVML
#                                          and with CIUIC_BUSY_SOURCE=cuda_events, and checks each
#                                          run's rank records name their source and give a
#                                          device_busy in (0, 1]; minutes (the build)
# Prints each check, then PASS or FAIL (exit 0 / 1).
set -eu
cd "$(dirname "$0")/../.."
case "${1:-nvml}" in
nvml)
  out=${TMPDIR:-/tmp}/ciuic-nvml-busy
  nvcc -O2 -std=c++17 -Icore/src -Icore/include -o "$out" scripts/gpu/nvml_busy.cu core/src/train/nvml.cpp -ldl
  "$out"
  ;;
events)
  OUT=${OUT:-/tmp/ciuic-out}
  mkdir -p "$OUT"
  export LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
  if [ -d .gpu/debs ] && [ ! -e /tmp/deps/.unpacked ]; then
    mkdir -p /tmp/deps && for f in .gpu/debs/*.deb; do dpkg -x "$f" /tmp/deps; done && touch /tmp/deps/.unpacked
  fi
  CIUIC_HOST_TESTS=ON bash scripts/gpu/build-on-host.sh . build-gpu > "$OUT/build-gpu.txt" 2>&1 ||
    { tail -n 30 "$OUT/build-gpu.txt"; echo FAIL; exit 1; }
  ok=1
  build-gpu/bin/nvml_test --gtest_filter='EventBusyMeter.*' 2>&1 | tee "$OUT/nvml_test.log" | grep -E "OK|FAILED|SKIPPED|Failure|busy" || true
  grep -q "\[  PASSED  \] 2 tests" "$OUT/nvml_test.log" && ! grep -q SKIPPED "$OUT/nvml_test.log" || ok=0
  recipe=$OUT/busy.toml
  cat > "$recipe" <<'TOML'
[cluster]
nproc_per_node = 1
device = "cuda"
[model.config]
hidden_size = 1024
intermediate_size = 2816
num_hidden_layers = 4
num_attention_heads = 8
num_key_value_heads = 8
vocab_size = 4096
max_position_embeddings = 512
[train]
max_steps = 40
seq_len = 512
micro_batch_size = 16
[data]
plugin = "synthetic"
vocab_size = 4096
[log]
every_steps = 10
[checkpoint]
save_final = false
TOML
  for source in nvml cuda_events; do
    dir=/tmp/runs/busy-$source
    rm -rf "$dir"
    env $([ "$source" = cuda_events ] && echo CIUIC_BUSY_SOURCE=cuda_events) \
      build-gpu/bin/ciuic-run "$recipe" --set "run.output_dir=\"$dir\"" > "$OUT/busy-$source.log" 2>&1 ||
      { tail -n 20 "$OUT/busy-$source.log"; ok=0; continue; }
    cp "$dir/metrics.jsonl" "$OUT/busy-$source.metrics.jsonl"
    python3 - "$dir/metrics.jsonl" "$source" <<'PY' || ok=0
import json, sys
recs = [r for r in map(json.loads, open(sys.argv[1])) if r.get("event") == "rank"]
# Every record has a figure in (0, 1]; with CIUIC_BUSY_SOURCE=cuda_events every one is from the
# events, with NVML at least one from NVML (an interval without a new NVML sample falls back).
bad = [r for r in recs if not 0 < r.get("device_busy", -1) <= 1]
if sys.argv[2] == "cuda_events":
    bad += [r for r in recs if r.get("busy_source") != "cuda_events"]
elif not any(r.get("busy_source") == "nvml" for r in recs):
    bad += recs
for r in recs:
    print(f"{sys.argv[2]}: step {r['step']} busy_source {r.get('busy_source')} device_busy {r.get('device_busy')} compute_busy {r.get('compute_busy')}")
sys.exit(1 if bad or not recs else 0)
PY
  done
  [ $ok = 1 ] && echo PASS || { echo FAIL; exit 1; }
  ;;
*) echo "usage: scripts/gpu/nvml_busy.sh [nvml|events]" >&2; exit 2 ;;
esac
