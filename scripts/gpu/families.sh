#!/usr/bin/env bash
# Each model family's 7B-class shape on one GPU (issue 30 item 5), in one device call: build
# (CUDA, the runner + the GPU tests), the GPU model tests (every family's fp32 parity on CUDA and
# the windowed flash path), then per family ciuic (bf16, zero2 on one rank, fused kernels where
# they apply, activation checkpointing) beside the FSDP2 peer with torch.compile
# (bench/peers/fsdp2_llama.py --model-type ...), same shape, batch and checkpointing. Target:
# ciuic >= 1.1x the compiled peer's tokens/s.
#   scripts/gpu/families.sh [build] [test] [mistral] [qwen2] [qwen3] [gemma3] [llama]
# MBS (micro-batch, default 4), STEPS (default 8) and SEQ (default 2048) apply to both sides.
# CKPT=auto runs ciuic with [model] checkpoint_layers = "auto" (the fewest checkpointed layers
# whose memory plan fits) instead of every layer, named <family>-ciuic-ckauto; CKPT="30 32" runs
# once per listed count of checkpointed layers (<family>-ciuic-ck30, ...); SKIP_PEER=1 skips
# the peer.
# Logs and metrics go to /tmp/families, packed into $OUT/families.tgz; scripts/gpu/summarize.py
# prints the runs' table.
set -u
source "$(dirname "$0")/lib.sh"  # gpu_env NAME; run NAME TIMEOUT CMD...; ciuic_run; fsdp2_peer
gpu_env families
RUN_TAIL=25
MBS=${MBS:-4}
STEPS=${STEPS:-8}
SEQ=${SEQ:-2048}
ciuic() {  # ciuic NAME TIMEOUT ARGS...: one run of configs/llama-1b-bench.toml with ARGS on top
  local name=$1 limit=$2; shift 2
  date +%s.%N > "$OUT/$name.window"
  ciuic_run "$name" "$limit" configs/llama-1b-bench.toml \
    --set model.activation_checkpointing=true --set train.micro_batch_size=$MBS --set train.seq_len=$SEQ \
    --set train.max_steps=$STEPS --set log.every_steps=1 "$@"
  date +%s.%N >> "$OUT/$name.window"
  grep -h "tokens/s" "$OUT/$name.log" | tail -2
}
peer() {  # peer NAME TIMEOUT ARGS...
  local name=$1 limit=$2; shift 2
  fsdp2_peer "$name" "$limit" --micro-batch $MBS --seq $SEQ --steps $STEPS --checkpointing --compile "$@"
}
# shape FAMILY: "ciuic --set args|peer args" of the family's released 7B-class model.
shape() {
  local m="--set model.config"
  case "$1" in
  mistral)  # mistralai/Mistral-7B-v0.1: window 4096 (longer than SEQ 2048: full attention)
    echo "$m.model_type=\"mistral\" $m.hidden_size=4096 $m.intermediate_size=14336 $m.num_hidden_layers=32 \
$m.num_attention_heads=32 $m.num_key_value_heads=8 $m.vocab_size=32000 --set data.vocab_size=32000 \
$m.max_position_embeddings=32768 $m.sliding_window=4096 $m.rms_norm_eps=1e-5|--model-type mistral --hidden 4096 \
--intermediate 14336 --layers 32 --heads 32 --kv-heads 8 --vocab 32000 --sliding-window 4096" ;;
  qwen2)  # Qwen/Qwen2.5-7B (DeepSeek-R1-Distill-Qwen-7B: the same shape)
    echo "$m.model_type=\"qwen2\" $m.hidden_size=3584 $m.intermediate_size=18944 $m.num_hidden_layers=28 \
$m.num_attention_heads=28 $m.num_key_value_heads=4 $m.vocab_size=152064 --set data.vocab_size=152064 \
$m.max_position_embeddings=32768 $m.rope_theta=1000000.0|--model-type qwen2 --hidden 3584 --intermediate 18944 \
--layers 28 --heads 28 --kv-heads 4 --vocab 152064" ;;
  qwen3)  # Qwen/Qwen3-8B
    echo "$m.model_type=\"qwen3\" $m.hidden_size=4096 $m.intermediate_size=12288 $m.num_hidden_layers=36 \
$m.num_attention_heads=32 $m.num_key_value_heads=8 $m.head_dim=128 $m.vocab_size=151936 --set data.vocab_size=151936 \
$m.max_position_embeddings=40960 $m.rope_theta=1000000.0|--model-type qwen3 --hidden 4096 --intermediate 12288 \
--layers 36 --heads 32 --kv-heads 8 --head-dim 128 --vocab 151936" ;;
  gemma3)  # google/gemma-3-4b's text model (gemma3_text): windows of 1024 < SEQ on 5 of 6 layers
    echo "$m.model_type=\"gemma3_text\" $m.hidden_size=2560 $m.intermediate_size=10240 $m.num_hidden_layers=34 \
$m.num_attention_heads=8 $m.num_key_value_heads=4 $m.head_dim=256 $m.vocab_size=262208 --set data.vocab_size=262208 \
$m.max_position_embeddings=131072 $m.sliding_window=1024 $m.tie_word_embeddings=true|--model-type gemma3_text \
--hidden 2560 --intermediate 10240 --layers 34 --heads 8 --kv-heads 4 --head-dim 256 --vocab 262208 \
--sliding-window 1024 --tie" ;;
  llama)  # DeepSeek-LLM-7B (the Llama reference of docs/performance.md, "Dense")
    echo "$m.hidden_size=4096 $m.intermediate_size=11008 $m.num_hidden_layers=30 $m.num_attention_heads=32 \
$m.num_key_value_heads=32 $m.vocab_size=102400 --set data.vocab_size=102400 $m.max_position_embeddings=4096|\
--hidden 4096 --intermediate 11008 --layers 30 --heads 32 --kv-heads 32 --vocab 102400" ;;
  esac
}
# The device's memory in use (nvidia-smi: what the caching allocator reserved plus the CUDA
# context and what bypasses the allocator), every 200 ms, for the auto-checkpointing headroom.
smi_pid=
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=timestamp,memory.used,memory.total --format=csv,noheader -lms 200 >> "$OUT/smi.csv" 2>&1 &
  smi_pid=$!
fi
for stage in ${*:-build test mistral qwen2 qwen3 gemma3}; do
  case "$stage" in
  build)
    CIUIC_HOST_TESTS=ON CIUIC_HOST_TARGETS="runtime model_gpu_test model_test" \
      run build 480 bash scripts/gpu/build-on-host.sh . build-gpu ||
      { tar czf "$RESULT/families.tgz" -C "$OUT" .; echo "build failed: nothing else runs"; exit 1; }
    tail -3 "$OUT/build.log" ;;
  test)
    run model_gpu_test 240 build-gpu/bin/model_gpu_test
    grep -E -A4 "Failure|^\[  (PASSED|FAILED) " "$OUT/model_gpu_test.log" | head -60 ;;
  mistral|qwen2|qwen3|gemma3|llama)
    s=$(shape "$stage")
    if [ "${CKPT:-all}" = auto ]; then
      ciuic "$stage-ciuic-ckauto" 400 ${s%%|*} --set 'model.checkpoint_layers="auto"'
    elif [ "${CKPT:-all}" != all ]; then  # a layer count, e.g. CKPT=30
      for n in $CKPT; do ciuic "$stage-ciuic-ck$n" 400 ${s%%|*} --set model.checkpoint_layers=$n; done
    else
      ciuic "$stage-ciuic" 400 ${s%%|*}
    fi
    [ "${SKIP_PEER:-0}" = 1 ] || peer "$stage-fsdp2-compiled" 500 ${s#*|} ;;
  *) echo "unknown stage $stage" ;;
  esac
  tar czf "$RESULT/families.tgz" -C "$OUT" .
done
[ -z "$smi_pid" ] || kill $smi_pid 2>/dev/null
tar czf "$RESULT/families.tgz" -C "$OUT" .
