#!/usr/bin/env bash
# cpu_adam's host memory, start-up and shutdown on one GPU (issue 14; docs/performance.md,
# "Host memory"), in one or two device calls: build (CUDA: the runner, the optimizer tests, and
# the cpu_adam of main@937a413 as the plugin "cpu_adam_old" when .gpu/old_cpu_adam holds its
# sources), the optimizer tests, then the 3x4090 bench recipe on one rank timed from outside
# (scripts/gpu/timeline.py: launch -> first step, last step -> exit, host memory used):
#   ab     12 layers (3.3B): old vs new cpu_adam, 8 micro-batches a step; new with one a step
#   seven  the whole DeepSeek-7B shape, new cpu_adam: one micro-batch of 8 a step, then 1 x 8
#   ds     DeepSpeed (bench/peers/deepspeed_zero2.py, the seed's JSON, bf16, CPU offload) vs ciuic,
#          12 layers, 1 x 8 and 8 x 1; needs the wheels in .whl (the peer's docstring)
#   nosync 12 layers, 1 x 8, with sharding.grad_accumulation = "no_sync" and without
#   auto   sharding.grad_accumulation = "auto": 12 layers (no_sync fits the cap) beside an explicit
#          reduce_each, and the whole 7B shape (it does not: reduce_each); the ds stage adds a
#          ciuic run with "auto" beside DeepSpeed
#   local  the whole 7B shape, 1 x 8: reduce_each, then with sharding.local_accumulation_percent =
#          "auto" (the share of the buckets accumulated on the device that fits the cap)
#   pcie2ds, pcie2  (need nvidia-h200-x2; not yet run) issue 14's headline: the 3x4090 recipe at
#          2 ranks over PCIe (transport = "pcie": NCCL without peer-to-peer), 24 GiB cap, 1 x 8:
#          pcie2ds = DeepSpeed with the seed's JSON (bf16, CPU offload, checkpointing) and ciuic's
#          default in one call; pcie2 = ciuic with local_accumulation_percent = "auto", and with
#          micro_batch_size = "auto" over the same global batch of 16
#   scripts/gpu/hostmem.sh [build] [test] [ab] [seven]
# Old sources: mkdir -p .gpu/old_cpu_adam && for f in $(git ls-tree --name-only 937a413
#   plugins/optim/cpu_adam/); do git show 937a413:$f > .gpu/old_cpu_adam/${f##*/}; done, then
#   rename the plugin (CIUIC_DEFINE_PLUGIN_PLANNED and CMakeLists NAME) to cpu_adam_old.
# Logs go to /tmp/hostmem, packed into $OUT/hostmem.tgz.
set -u
source "$(dirname "$0")/lib.sh"  # gpu_env NAME; run NAME TIMEOUT CMD...
gpu_env hostmem
RUN_TAIL=30
pack() { tar czf "$RESULT/hostmem.tgz" -C "$OUT" . ; }
recipe=configs/bench/deepseek-7b-3x4090.toml
common="--nproc 1 --set train.max_steps=5 --set log.every_steps=1 --set checkpoint.every_steps=1000 --set checkpoint.save_final=false"
timed() {  # timed NAME LIMIT ARGS...: one run of the recipe, timed
  local name=$1 limit=$2; shift 2
  rm -rf "/tmp/runs/$name"
  run "$name" "$limit" python3 scripts/gpu/timeline.py --name "$name" --json "$OUT/$name.json" -- \
    build-gpu/bin/ciuic-run $recipe $common --set "run.output_dir=\"/tmp/runs/$name\"" "$@"
  cp "/tmp/runs/$name/metrics.jsonl" "$OUT/$name.metrics.jsonl" 2>/dev/null
  grep -h "optimizer cpu_adam: [0-9]* elements\|info: set up in\|went through page-locked" "$OUT/$name.log" | head -3
  grep -h "tok/s" "$OUT/$name.log" | tail -1
  tail -1 "$OUT/$name.log"
  free -g | head -2
}
for stage in ${*:-build test ab}; do
  case "$stage" in
  build)
    if [ -d .gpu/old_cpu_adam ]; then rm -rf plugins/optim/cpu_adam_old; cp -r .gpu/old_cpu_adam plugins/optim/cpu_adam_old; fi
    CIUIC_HOST_TESTS=ON CIUIC_HOST_TARGETS="runtime optimizer_adamw_test flat_buckets_cuda_test" \
      run build 480 bash scripts/gpu/build-on-host.sh . build-gpu || { pack; echo "build failed"; exit 1; }
    tail -3 "$OUT/build.log" ;;
  test)
    for t in optimizer_adamw_test flat_buckets_cuda_test; do
      run $t 240 build-gpu/bin/$t
      grep -E -A6 "Failure|^\[  (PASSED|FAILED) " "$OUT/$t.log" | head -60
    done ;;
  ab)
    l12="--set model.config.num_hidden_layers=12"
    timed ab-old 240 $l12 --set 'optimizer.plugin="cpu_adam_old"'
    timed ab-new 240 $l12
    timed ab-new-one 240 $l12 --set train.micro_batch_size=8 --set train.gradient_accumulation_steps=1 ;;
  ds)
    # DeepSpeed (bench/peers/deepspeed_zero2.py: the seed's JSON, bf16, CPU offload) and ciuic on
    # the same 12-layer shape and batches, one rank, 24 GiB cap; wheels carried in .whl.
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:${PYTHONPATH:-} TORCH_EXTENSIONS_DIR=/tmp/tex NCCL_P2P_DISABLE=1
    l12="--set model.config.num_hidden_layers=12"
    for shape in "acc 1 8" "one 8 1"; do
      set -- $shape
      rm -f "$OUT/ds-$1.json"
      run ds-$1 300 python3 scripts/gpu/timeline.py --name ds-$1 --json "$OUT/ds-$1.timeline.json" -- \
        torchrun --standalone --nproc-per-node 1 bench/peers/deepspeed_zero2.py \
        --ds-config tests/fixtures/deepspeed/ds_config_4xa100_seed.json --dtype bf16 --offload --checkpointing \
        --cap-gib 24 --layers 12 --micro-batch $2 --accumulation $3 --steps 4 --json "$OUT/ds-$1.json"
      tail -1 "$OUT/ds-$1.log" | cut -c1-400
      cat "$OUT/ds-$1.json" 2>/dev/null | python3 -c "import json,sys; d=json.load(sys.stdin); d.pop('ds_config'); print(d)"
      timed ciuic-$1 240 $l12 --set train.micro_batch_size=$2 --set train.gradient_accumulation_steps=$3
    done
    timed ciuic-acc-auto 240 $l12 --set 'sharding.grad_accumulation="auto"' ;;
  auto)
    l12="--set model.config.num_hidden_layers=12"
    timed auto-12 240 $l12 --set 'sharding.grad_accumulation="auto"'
    timed each-12 240 $l12 --set 'sharding.grad_accumulation="reduce_each"'
    timed auto-7b 420 --set 'sharding.grad_accumulation="auto"'
    grep -h 'grad_accumulation = "auto"' "$OUT"/auto-*.log "$OUT"/ciuic-acc-auto.log 2>/dev/null ;;
  nosync)
    # One rank, 1 x 8: the gradient accumulated on the device (one chunk a step to cpu_adam) vs
    # folded on the host after every micro-batch.
    l12="--set model.config.num_hidden_layers=12"
    timed ciuic-acc-nosync 240 $l12 --set 'sharding.grad_accumulation="no_sync"'
    timed ciuic-acc-again 240 $l12 ;;
  local)
    timed seven-each 420
    timed seven-local 420 --set 'sharding.local_accumulation_percent="auto"'
    grep -h 'local_accumulation_percent = "auto"' "$OUT"/seven-local.log ;;
  pcie2ds)
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:${PYTHONPATH:-} TORCH_EXTENSIONS_DIR=/tmp/tex NCCL_P2P_DISABLE=1
    run ds2 420 python3 scripts/gpu/timeline.py --name ds2 --json "$OUT/ds2.timeline.json" -- \
      torchrun --standalone --nproc-per-node 2 bench/peers/deepspeed_zero2.py \
      --ds-config tests/fixtures/deepspeed/ds_config_4xa100_seed.json --dtype bf16 --offload --checkpointing \
      --cap-gib 24 --layers 30 --micro-batch 1 --accumulation 8 --steps 4 --json "$OUT/ds2.json"
    tail -1 "$OUT/ds2.log" | cut -c1-400
    common="${common/--nproc 1/--nproc 2}"
    timed pcie2-each 300 ;;
  pcie2)
    common="${common/--nproc 1/--nproc 2}"
    timed pcie2-local 300 --set 'sharding.local_accumulation_percent="auto"'
    timed pcie2-micro 300 --set 'train.micro_batch_size="auto"' --set train.global_batch_size=16
    grep -h '"auto"' "$OUT"/pcie2-*.log ;;
  seven)
    timed seven-one 420 --set train.micro_batch_size=8 --set train.gradient_accumulation_steps=1
    timed seven-acc 420 ;;
  esac
done
pack
for f in "$OUT"/*.json; do [ -f "$f" ] && cat "$f"; done
