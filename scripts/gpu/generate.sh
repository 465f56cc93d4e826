#!/usr/bin/env bash
# Generation on one GPU (issue 33 item 4), in one device call: build (CUDA, the runner and the
# generation tests), generate_test on the host (the CPU parity suite, built with CUDA), then decode
# tokens/s of a random 7B Llama shape (hidden 4096, 32 layers, 32 heads / 8 KV heads, vocab 32000,
# bf16) through ciuic-run --generate --device cuda beside transformers' generate() with its static
# cache, same prompts, batch 1 and 8, same call (bench/generate/generate_speed.py).
#   scripts/gpu/generate.sh [build] [test] [bench] [cpu] [ab]
# ab: the same bench with ciuic-run three ways (docs/generate.md, "Decode step"): the default
# (static step replayed as a CUDA graph), nograph (CIUIC_CUDA_GRAPH=0: the static step eager),
# dynamic (CIUIC_DECODE_STEP=dynamic: the step before the graph work), each beside transformers.
# test runs generate_test, whose GenerateStep.CudaGraphReplayEqualsNoGraph checks the graph's
# tokens and logits against the eager static step and the dynamic one on the GPU.
# NEW (new tokens per row, default 128) and BATCHES (default 1,8) apply to both sides. Both are
# timed warm: ciuic-run generates each batch twice and the second is its figure (the first is
# printed as "cold"), transformers after one warm-up call.
# Logs go to $OUT, packed into $RESULT/generate.tgz. Not yet run on a GPU.
set -u
source "$(dirname "$0")/lib.sh"  # gpu_env NAME; run NAME TIMEOUT CMD...
gpu_env generate
RUN_TAIL=25
NEW=${NEW:-128}
BATCHES=${BATCHES:-1,8}
for stage in ${*:-build test bench}; do
  case "$stage" in
  build)
    CIUIC_HOST_TESTS=ON CIUIC_HOST_TARGETS="runtime generate_test" \
      run build 480 bash scripts/gpu/build-on-host.sh . build-gpu ||
      { tar czf "$RESULT/generate.tgz" -C "$OUT" .; echo "build failed: nothing else runs"; exit 1; }
    tail -3 "$OUT/build.log" ;;
  test)
    run generate_test 240 build-gpu/bin/generate_test
    grep -E -A4 "Failure|^\[  (PASSED|FAILED|SKIPPED) " "$OUT/generate_test.log" | head -40 ;;
  bench)
    run generate-7b 580 python bench/generate/generate_speed.py build-gpu/bin/ciuic-run --device cuda --dtype bf16 \
      --hidden 4096 --layers 32 --vocab 32000 --new "$NEW" --batches "$BATCHES"
    grep -E "^(model|batch)" "$OUT/generate-7b.log" ;;
  ab)
    run generate-7b-ab 580 python bench/generate/generate_speed.py build-gpu/bin/ciuic-run --device cuda --dtype bf16 \
      --hidden 4096 --layers 32 --vocab 32000 --new "$NEW" --batches "$BATCHES" --variants default,nograph,dynamic
    grep -E "^(model|batch)" "$OUT/generate-7b-ab.log" ;;
  cpu)
    # CPU figures on the host's idle cores (needs the build stage's build-gpu): pinned to 1, then 2
    # cores (taskset on this shell, inherited), decode tokens/s against transformers with the
    # floor per step (generate_speed.py --floor), ciuic with the oneDNN head and without it
    # (mklhead: CIUIC_ONEDNN_HEAD=0); then, on 2 cores, the demo's held-out evaluation
    # (200 questions before and after 21 steps; metrics.jsonl's eval_s) one question at a time
    # as before this change (CIUIC_SERIAL_SMALL_STEPS=0) and now, and batched by 16 and 64,
    # alternating, three rounds.
    all=0-$(($(nproc --all) - 1))
    python3 examples/demo/gen_demo_data.py runs/demo-data > /dev/null
    for n in 1 2; do
      taskset -cp "0-$((n - 1))" $$ > /dev/null
      run cpu-generate-$n 500 python bench/generate/generate_speed.py build-gpu/bin/ciuic-run \
        --threads "$n" --new 32 --floor --variants default,mklhead
      grep -E "^(model|floor|batch)" "$OUT/cpu-generate-$n.log"
    done
    for round in 1 2 3; do
      for v in 1:0 1:1 16:1 64:1; do
        b=${v%:*} serial=${v#*:} name=cpu-eval-b${v%:*}-s${v#*:}-$round
        CIUIC_SERIAL_SMALL_STEPS=$serial OMP_NUM_THREADS=2 ciuic_run "$name" 300 configs/tiny-cpu.toml \
          --set cluster.nproc_per_node=1 --set train.max_steps=21 --set train.eval_every_steps=0 \
          --set train.exact_match_batch_size="$b"
        python3 -c "import json,sys; print(sys.argv[1], *[f\"{r['when']} eval_s {r['eval_s']:.3f} acc {r['accuracy']:.3f}\" for r in map(json.loads, open(sys.argv[2])) if r.get('event') == 'exact_match'])" \
          "$name" "$OUT/$name.metrics.jsonl"
      done
    done
    taskset -cp "$all" $$ > /dev/null ;;
  *) echo "unknown stage $stage" ;;
  esac
done
tar czf "$RESULT/generate.tgz" -C "$OUT" .
