#!/usr/bin/env bash
# LoRA and QLoRA on one H200 (issue 32 item 5), in one device call: build (CUDA, the runner), then
# bench/lora/lora_speed.py at the DeepSeek-LLM-7B shape (random weights, synthetic tokens, bf16,
# micro-batch MBS × SEQ, no activation checkpointing, r 16 / alpha 32 on every linear layer):
#   lora     ciuic LoRA, PEFT + transformers eager (bench/peers/peft_lora.py), ciuic's full fine-tune
#            of the same model (its forward+backward: what the LoRA step wraps)
#   qlora    ciuic with [adapter] base_quantization = "nf4" beside PEFT + bitsandbytes (nf4, double
#            quantization, bf16 compute); ciuic quantizes the base on the GPU (quant/cuda) at start
#   compile  PEFT + transformers with each decoder layer torch.compile'd
#   cpu      (not in the default list; ~3 min) the CPU comparison on the host's quiet cores: the 100M
#            shape, fp32, 2 threads on both sides, ciuic LoRA / PEFT eager / ciuic full, 2 repetitions
#            alternating ($OUT/lora-cpu-summary.md)
# Targets: ciuic LoRA >= 1.5x PEFT's tokens/s at <= its peak memory; the LoRA step not slower than
# the full model's forward+backward by more than the adapters' share of the FLOPs.
#   scripts/gpu/lora.sh [build] [lora] [qlora] [compile]        (default: all four, in this order)
# Before the call, here: bash scripts/gpu/fetch-debs.sh && bash scripts/gpu/fetch-peft.sh (peft,
# bitsandbytes, accelerate into .gpu/site; the host has torch and transformers only); carry .gpu.
# MBS (default 2), SEQ (2048), STEPS (6 measured) and WARMUP (2) apply to every run; RUN_S (per
# run, default 100 s; the compiled peer 1.5x). Every stage adds its runs to one table:
# $OUT/lora-summary.md (copied after each stage), logs and metrics in $OUT/lora.tgz.
set -u
source "$(dirname "$0")/lib.sh"  # gpu_env NAME; run NAME TIMEOUT CMD...
gpu_env lora
RUN_TAIL=25
MBS=${MBS:-2}
SEQ=${SEQ:-2048}
STEPS=${STEPS:-6}
WARMUP=${WARMUP:-2}
RUN_S=${RUN_S:-100}
# The peer's missing packages come from .gpu/site, after the host's own (bench/peers/peft_lora.py).
[ -d .gpu/site ] && export PEER_SITE=$PWD/.gpu/site
python3 -c "import os, sys; sys.path.append(os.environ.get('PEER_SITE', '')); import torch, transformers, peft, bitsandbytes
print('peer packages: torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__,
      'bitsandbytes', bitsandbytes.__version__)" 2>&1 | tail -1
speed() {  # speed NAME RUNS: one lora_speed.py call adding RUNS to the table
  local limit=$(( ($(echo "$2" | tr ',' '\n' | wc -l) + 1) * RUN_S * 3 / 2 ))
  run "$1" "$limit" python3 bench/lora/lora_speed.py --ciuic-run build-gpu/bin/ciuic-run --device cuda --shape 7b \
    --micro-batch "$MBS" --seq "$SEQ" --steps "$STEPS" --warmup "$WARMUP" --timeout "$RUN_S" --python python3 \
    --runs "$2" --out "$OUT/speed" --append
  grep -E "tokens/s|FAILED" "$OUT/$1.log" | grep -v "^|" | head -8
  cp "$OUT/speed/summary.md" "$RESULT/lora-summary.md" 2>/dev/null
}
for stage in ${*:-build lora qlora compile}; do
  case "$stage" in
  build)
    CIUIC_HOST_TARGETS="runtime" run build 420 bash scripts/gpu/build-on-host.sh . build-gpu ||
      { tar czf "$RESULT/lora.tgz" -C "$OUT" .; echo "build failed: nothing else runs"; exit 1; }
    tail -2 "$OUT/build.log" ;;
  lora) speed lora ciuic-lora,peft,ciuic-full ;;
  qlora) speed qlora ciuic-qlora,peft-qlora ;;
  compile) speed compile peft-compile ;;
  cpu)
    run cpu 480 python3 bench/lora/lora_speed.py --ciuic-run build-gpu/bin/ciuic-run --device cpu --shape 100m \
      --micro-batch 2 --seq 256 --steps 6 --warmup 2 --reps 2 --threads 2 --timeout 150 --python python3 \
      --runs ciuic-lora,peft,ciuic-full --out "$OUT/cpu"
    cp "$OUT/cpu/summary.md" "$RESULT/lora-cpu-summary.md" 2>/dev/null && cat "$RESULT/lora-cpu-summary.md" ;;
  *) echo "unknown stage $stage" ;;
  esac
  # After every stage: what a call cut off at its limit still returns (ciuic's report.html left out).
  tar czf "$RESULT/lora.tgz" -C "$OUT" --exclude='report.html' .
done
cat "$RESULT/lora-summary.md" 2>/dev/null
