#!/usr/bin/env bash
# Dense single-GPU throughput on the GPU host (issue 15; docs/performance.md, "Dense"), in one
# device call: build (CUDA, the runner + the GPU tests + model_bench), the fused-kernel tests, then
# ciuic before/after the fused kernels and the in-forward loss gradient, side by side with the
# FSDP2 peer eager and compiled (bench/peers/fsdp2_llama.py), with a profile of each ciuic side.
#   scripts/gpu/dense.sh [build] [test] [one] [seven] ...    (any of the stages, in order)
# Logs, metrics and profiles go to /tmp/dense, packed at the end into $OUT/dense.tgz (the device
# tool returns few files); scripts/gpu/summarize.py prints the runs' table.
set -u
source "$(dirname "$0")/lib.sh"  # gpu_env NAME; run NAME TIMEOUT CMD...; ciuic_run; fsdp2_peer
gpu_env dense
RUN_TAIL=25
# ciuic NAME TIMEOUT RECIPE ARGS...: one run, its metrics and profile table copied to $OUT.
ciuic() {
  local name=$1
  ciuic_run "$@"
  cp "/tmp/runs/$name/profile/rank0.txt" "$OUT/$name.profile.txt" 2>/dev/null && cat "$OUT/$name.profile.txt" | head -30
  # Who launched the copies and the other elementwise kernels (the trace itself is too large to return).
  local trace="/tmp/runs/$name/profile/rank0.trace.json"
  if [ -f "$trace" ]; then
    python3 scripts/gpu/trace_ops.py "$trace" --steps 3 --top 30 > "$OUT/$name.copies.txt" 2>&1
    python3 scripts/gpu/trace_ops.py "$trace" --steps 3 --top 40 --kernels . > "$OUT/$name.ops.txt" 2>&1
    head -20 "$OUT/$name.copies.txt"
  fi
  grep -h "tokens/s" "$OUT/$name.log" | tail -2
}
old="--set model.fused_kernels=\"off\" --set model.loss_backward=\"recompute\""
fused="--set model.fused_kernels=\"on\" --set model.loss_backward=\"recompute\""
infwd="--set model.fused_kernels=\"off\" --set model.loss_backward=\"in_forward\""
new="--set model.fused_kernels=\"on\" --set model.loss_backward=\"in_forward\""
common="--set train.max_steps=16 --set log.every_steps=1"
s7base="--set model.config.hidden_size=4096 --set model.config.intermediate_size=11008 --set model.config.num_hidden_layers=30 --set model.config.num_attention_heads=32 --set model.config.num_key_value_heads=32 --set model.config.vocab_size=102400 --set data.vocab_size=102400 --set model.config.max_position_embeddings=4096 --set train.max_steps=8 --set log.every_steps=1"
peer() { fsdp2_peer "$@"; }  # peer NAME TIMEOUT ARGS...
for stage in ${*:-build test one}; do
  case "$stage" in
  build)
    CIUIC_HOST_TESTS=ON CIUIC_HOST_TARGETS="runtime model_gpu_test model_bench optimizer_adamw_test" \
      run build 480 bash scripts/gpu/build-on-host.sh . build-gpu ||
      { tar czf "$RESULT/dense.tgz" -C "$OUT" .; echo "build failed: nothing else runs"; exit 1; }
    tail -3 "$OUT/build.log" ;;
  test)
    run model_gpu_test 240 build-gpu/bin/model_gpu_test
    grep -E -A4 "Failure|^\[  (PASSED|FAILED) " "$OUT/model_gpu_test.log" | head -60 ;;
  one)
    # Alternating old/new twice (drift hits both), then the two levers alone, each profiled once.
    for rep in 1 2; do
      ciuic 1b-old-$rep 200 configs/llama-1b-bench.toml $common $old $([ $rep = 1 ] && echo --set log.profile_start_step=8)
      ciuic 1b-new-$rep 200 configs/llama-1b-bench.toml $common $new $([ $rep = 1 ] && echo --set log.profile_start_step=8)
    done
    ciuic 1b-fused 200 configs/llama-1b-bench.toml $common $fused
    ciuic 1b-infwd 200 configs/llama-1b-bench.toml $common $infwd
    peer 1b-fsdp2-eager 300
    peer 1b-fsdp2-compiled 400 --compile ;;
  seven)
    s7="$s7base"
    # DeepSeek-LLM-7B's shape, activation checkpointing on both sides (the peer needs it to fit).
    s7="$s7 --set model.activation_checkpointing=true --set train.micro_batch_size=${MBS7:-4}"
    [ "${SKIP_OLD:-0}" = 1 ] || ciuic 7b-old 300 configs/llama-1b-bench.toml $s7 $old
    ciuic 7b-new 300 configs/llama-1b-bench.toml $s7 $new --set log.profile_start_step=5
    # What the memory left over buys: fewer layers recomputed.
    for c in ${CKPT7:-}; do ciuic 7b-new-ckpt$c 300 configs/llama-1b-bench.toml $s7 $new --set model.checkpoint_layers=$c; done
    [ "${SKIP_PEER:-0}" = 1 ] || peer 7b-fsdp2-compiled 400 --hidden 4096 --intermediate 11008 --layers 30 --heads 32 --kv-heads 32 --vocab 102400 \
      --micro-batch ${MBS7:-4} --steps 8 --checkpointing --compile ${PEER7_ARGS:-} ;;
  adamw)
    # The optim kit's one-launch AdamW (kernel "auto": bf16 gradient shard with one rank, scaling
    # and rounding fused) against ATen's multi-tensor AdamW on an fp32 gradient shard ("aten", the
    # path before), its GPU tests, then what the freed memory buys at the 7B shape: fewer layers
    # checkpointed (CKPTS), side by side with the compiled peer; then the 1B both ways + peer.
    run optimizer_adamw_test 120 build-gpu/bin/optimizer_adamw_test
    grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure" "$OUT/optimizer_adamw_test.log" | head -20
    s7="$s7base --set model.activation_checkpointing=true --set train.micro_batch_size=${MBS7:-4}"
    aten="--set optimizer.kernel=\"aten\""
    ciuic 7b-aten 300 configs/llama-1b-bench.toml $s7 $aten
    ciuic 7b-fused 300 configs/llama-1b-bench.toml $s7
    for c in ${CKPTS:-16 8}; do ciuic 7b-fused-ckpt$c 300 configs/llama-1b-bench.toml $s7 --set model.checkpoint_layers=$c; done
    tar czf "$RESULT/dense.tgz" -C "$OUT" .
    [ "${SKIP_PEER:-0}" = 1 ] || peer 7b-fsdp2-compiled 400 --hidden 4096 --intermediate 11008 --layers 30 --heads 32 \
      --kv-heads 32 --vocab 102400 --micro-batch ${MBS7:-4} --steps 8 --checkpointing --compile
    tar czf "$RESULT/dense.tgz" -C "$OUT" .
    ciuic 1b-fused 200 configs/llama-1b-bench.toml $common
    ciuic 1b-aten 200 configs/llama-1b-bench.toml $common $aten
    [ "${SKIP_PEER:-0}" = 1 ] || peer 1b-fsdp2-compiled 300 --compile ;;
  final)
    # After the one-launch AdamW: the GPU tests, then every dense figure of docs/performance.md
    # ("Dense") again in one call: 7B shape at several checkpointing depths (profiled once) and the
    # compiled peer, 1B both kernels and the peer, vocab-102400 capacity both sides.
    run optimizer_adamw_test 120 build-gpu/bin/optimizer_adamw_test
    grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure" "$OUT/optimizer_adamw_test.log" | head -20
    run model_gpu_test 240 build-gpu/bin/model_gpu_test
    grep -E "^\[  (PASSED|FAILED) |Failure" "$OUT/model_gpu_test.log" | head -20
    tar czf "$RESULT/dense.tgz" -C "$OUT" .
    s7="$s7base --set model.activation_checkpointing=true --set train.micro_batch_size=4"
    ciuic 7b-final 300 configs/llama-1b-bench.toml $s7
    for c in 16 8 4; do ciuic 7b-final-ckpt$c 300 configs/llama-1b-bench.toml $s7 --set model.checkpoint_layers=$c; done
    ciuic 7b-final-nockpt 300 configs/llama-1b-bench.toml $s7base --set train.micro_batch_size=4
    ciuic 7b-prof-ckpt8 300 configs/llama-1b-bench.toml $s7 --set model.checkpoint_layers=8 --set log.profile_start_step=5
    tar czf "$RESULT/dense.tgz" -C "$OUT" .
    peer 7b-fsdp2-compiled 400 --hidden 4096 --intermediate 11008 --layers 30 --heads 32 --kv-heads 32 \
      --vocab 102400 --micro-batch 4 --steps 8 --checkpointing --compile
    tar czf "$RESULT/dense.tgz" -C "$OUT" .
    ciuic 1b-final-1 200 configs/llama-1b-bench.toml $common
    ciuic 1b-aten 200 configs/llama-1b-bench.toml $common --set optimizer.kernel=\"aten\"
    ciuic 1b-final-2 200 configs/llama-1b-bench.toml $common
    ciuic 1b-prof 200 configs/llama-1b-bench.toml $common --set log.profile_start_step=8
    peer 1b-fsdp2-compiled 300 --compile
    tar czf "$RESULT/dense.tgz" -C "$OUT" .
    v="--set model.config.vocab_size=102400 --set data.vocab_size=102400 --set train.max_steps=6 --set log.every_steps=1"
    for m in 8 32; do
      ciuic 1bv-mbs$m 200 configs/llama-1b-bench.toml $v --set train.micro_batch_size=$m --set cluster.memory_per_device_gib=80.0
    done
    for m in 8 12; do peer 1bv-fsdp2-compiled-mbs$m 200 --vocab 102400 --micro-batch $m --steps 6 --compile; done ;;
  auto)
    # [model] checkpoint_layers = "auto" at the 7B shape (the worker asks the planner for the fewest
    # checkpointed layers that fit 92% of the device), beside the compiled peer.
    s7="$s7base --set model.activation_checkpointing=true --set train.micro_batch_size=4"
    ciuic 7b-auto 300 configs/llama-1b-bench.toml $s7 --set model.checkpoint_layers=\"auto\"
    grep -h "checkpoint_layers = \"auto\"" "$OUT/7b-auto.log"
    ciuic 7b-all 300 configs/llama-1b-bench.toml $s7
    peer 7b-fsdp2-compiled 400 --hidden 4096 --intermediate 11008 --layers 30 --heads 32 --kv-heads 32 \
      --vocab 102400 --micro-batch 4 --steps 8 --checkpointing --compile ;;
  automb)
    # [train] micro_batch_size = "auto" (global batch kept, the planner picks the largest micro-batch
    # that fits): the 1B under a 24 GiB cap against the explicit micro-batch of 1; the 7B shape with
    # both "auto" settings and a global batch of 8 sequences.
    ciuic 1b-mb1 200 configs/llama-1b-bench.toml $common --set train.micro_batch_size=1 \
      --set train.gradient_accumulation_steps=16 --set cluster.memory_per_device_gib=24.0
    ciuic 1b-mbauto 200 configs/llama-1b-bench.toml $common --set train.micro_batch_size=\"auto\" \
      --set train.global_batch_size=16 --set cluster.memory_per_device_gib=24.0
    grep -h "\"auto\"" "$OUT/1b-mbauto.log"
    ciuic 7b-autoauto 300 configs/llama-1b-bench.toml $s7base --set model.activation_checkpointing=true \
      --set model.checkpoint_layers=\"auto\" --set train.micro_batch_size=\"auto\" --set train.global_batch_size=8
    grep -h "\"auto\"" "$OUT/7b-autoauto.log" ;;
  profile)
    # One profiled run each of the 1B and the 7B shape with the defaults.
    ciuic 1b-prof 200 configs/llama-1b-bench.toml $common $new --set log.profile_start_step=8
    ciuic 7b-prof 300 configs/llama-1b-bench.toml $s7base --set model.activation_checkpointing=true \
      --set train.micro_batch_size=4 $new --set log.profile_start_step=5 ;;
  early)
    # cpu_adam's early update (issue 14) on one GPU: the same run with overlap_update auto and off,
    # alternating (bench/ab.py), clipping off (the early path needs it), at the 1B shape and at a
    # 10-layer cut of the 7B shape (2.6B parameters: the host holds the whole optimizer state).
    # Its own device call: on 2026-12-01 build + test + this stage with reps 2 ran past the call's
    # 600 s and returned nothing.
    ab="python3 bench/ab.py --ciuic-run build-gpu/bin/ciuic-run --reps 1 --steps 6 --names off,early"
    cpu="--set optimizer.plugin=cpu_adam --set train.gradient_clipping=0 --set cluster.memory_per_device_gib=24.0"
    run early-1b 240 $ab configs/llama-1b-bench.toml $cpu --set train.micro_batch_size=4 \
      --a-set optimizer.overlap_update=\"off\" --b-set optimizer.overlap_update=\"auto\" --out "$OUT/ab-early-1b"
    tail -14 "$OUT/early-1b.log"
    run early-3b 240 $ab configs/llama-1b-bench.toml $cpu $s7base --set model.config.num_hidden_layers=10 \
      --set train.micro_batch_size=1 --set train.gradient_accumulation_steps=4 --set model.activation_checkpointing=true \
      --a-set optimizer.overlap_update=\"off\" --b-set optimizer.overlap_update=\"auto\" --out "$OUT/ab-early-3b"
    tail -14 "$OUT/early-3b.log" ;;
  confirm)
    # After the last model change: the defaults against the compiled peer once more, and the
    # micro-batch capacity at vocab 102400.
    ciuic 1b-final 200 configs/llama-1b-bench.toml $common
    peer 1b-fsdp2-compiled-final 300 --compile
    v="--set model.config.vocab_size=102400 --set data.vocab_size=102400 --set train.max_steps=6 --set log.every_steps=1"
    for m in 8 16 32; do
      ciuic 1bv-final-mbs$m 200 configs/llama-1b-bench.toml $v --set train.micro_batch_size=$m --set cluster.memory_per_device_gib=80.0
    done ;;
  mbs)
    # The largest micro-batch that fits 80 GiB at the 1B shape with DeepSeek's vocabulary (102400):
    # ciuic under a cap of 80 GiB (the caching allocator refuses more), the peer's peak as reported.
    v="--set model.config.vocab_size=102400 --set data.vocab_size=102400 --set train.max_steps=6 --set log.every_steps=1"
    for m in ${MBS_CIUIC:-16 24 32}; do
      ciuic 1bv-mbs$m 200 configs/llama-1b-bench.toml $v --set train.micro_batch_size=$m --set cluster.memory_per_device_gib=80.0
    done
    for m in ${MBS_PEER:-8 12 16}; do peer 1bv-fsdp2-compiled-mbs$m 200 --vocab 102400 --micro-batch $m --steps 6 --compile; done ;;
  esac
  # After every stage: what a call cut off at its limit still returns.
  tar czf "$RESULT/dense.tgz" -C "$OUT" .
done
python3 scripts/gpu/summarize.py "$OUT" 2>/dev/null | tee "$OUT/summary.md" | tail -30
tar czf "$RESULT/dense.tgz" -C "$OUT" .
