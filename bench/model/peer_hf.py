#!/usr/bin/env python3
"""PyTorch peer for bench/model: transformers' LlamaForCausalLM, same shape as model_bench.

    /work/main/.venv/bin/python bench/model/peer_hf.py [--threads N] [--steps N]

Forward + summed fp32 cross-entropy + backward per step, fp32, SDPA attention, the same shape as
model_bench (hidden 256, 4 layers, 4 heads of 64, 2 KV heads, intermediate 688, vocab 2048,
batch 2 x seq 256); prints tokens/s with and without gradient checkpointing (alternating steps,
as BM_CheckpointingRatio does).
"""
import argparse
import time

import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--steps", type=int, default=10)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    cfg = LlamaConfig(vocab_size=2048, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64, tie_word_embeddings=False,
                      attn_implementation="sdpa")
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).float().train()
    ids = torch.randint(0, 2048, (2, 256))
    labels = ids.roll(-1, 1)

    def step():
        for p in model.parameters():
            p.grad = None
        logits = model(input_ids=ids).logits
        F.cross_entropy(logits.float().view(-1, 2048), labels.view(-1), reduction="sum").backward()

    times = {False: 0.0, True: 0.0}
    cpu = {False: 0.0, True: 0.0}
    for ckpt in (False, True):  # warm-up both
        model.gradient_checkpointing_enable() if ckpt else model.gradient_checkpointing_disable()
        step()
    for _ in range(a.steps):
        for ckpt in (False, True):
            if ckpt:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            else:
                model.gradient_checkpointing_disable()
            t0, c0 = time.perf_counter(), time.process_time()
            step()
            times[ckpt] += time.perf_counter() - t0
            cpu[ckpt] += time.process_time() - c0
    tokens = ids.numel() * a.steps
    off, on = tokens / times[False], tokens / times[True]
    print(f"torch {torch.__version__}, threads {a.threads}")
    print(f"transformers fwd+bwd, checkpointing off: {off:.0f} tokens/s, {tokens / cpu[False]:.0f} tokens per CPU-second")
    print(f"transformers fwd+bwd, checkpointing on:  {on:.0f} tokens/s, {tokens / cpu[True]:.0f} tokens per CPU-second"
          f"  (on/off {on / off:.3f})")


if __name__ == "__main__":
    main()
