#!/usr/bin/env python3
"""PyTorch peer for bench/model: transformers' LlamaForCausalLM, same shape as model_bench.

    /work/main/.venv/bin/python bench/model/peer_hf.py [--threads N] [--steps N]

Forward + summed fp32 cross-entropy + backward per step, SDPA attention, the same shape, device
and dtype as model_bench (the same CIUIC_BENCH_* environment variables; default hidden 256,
4 layers, heads of 64, half as many KV heads, intermediate 8/3 hidden, vocab 2048, batch 2 x seq
256, CPU fp32); prints tokens/s with and without gradient checkpointing (alternating steps, as
BM_CheckpointingRatio does).
"""
import argparse
import os
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
    env = lambda k, d: int(os.environ.get("CIUIC_BENCH_" + k, d))
    hidden, layers, vocab = env("HIDDEN", 256), env("LAYERS", 4), env("VOCAB", 2048)
    head_dim = env("HEAD_DIM", 64)
    heads = hidden // head_dim
    device = os.environ.get("CIUIC_BENCH_DEVICE", "cpu")
    dtype = torch.bfloat16 if os.environ.get("CIUIC_BENCH_DTYPE") == "bf16" else torch.float32
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden,
                      intermediate_size=env("INTERMEDIATE", (hidden * 8 // 3 + 15) // 16 * 16),
                      num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=env("KV_HEADS", max(1, heads // 2)),
                      head_dim=head_dim, tie_word_embeddings=False, attn_implementation="sdpa")
    torch.manual_seed(0)
    torch.set_default_device(device)  # initialise on the device, in the benchmark dtype (fast for 7B)
    torch.set_default_dtype(dtype)
    model = LlamaForCausalLM(cfg).train()
    torch.set_default_dtype(torch.float32)
    ids = torch.randint(0, vocab, (env("BATCH", 2), env("SEQ", 256)), device=device)
    labels = ids.roll(-1, 1)

    def step():
        for p in model.parameters():
            p.grad = None
        logits = model(input_ids=ids).logits
        F.cross_entropy(logits.float().view(-1, vocab), labels.view(-1), reduction="sum").backward()
        if device != "cpu":
            torch.cuda.synchronize()

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
    print(f"torch {torch.__version__}, threads {a.threads}, {device} {dtype}, batch {tuple(ids.shape)}, "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters")
    print(f"transformers fwd+bwd, checkpointing off: {off:.0f} tokens/s, {tokens / cpu[False]:.0f} tokens per CPU-second")
    print(f"transformers fwd+bwd, checkpointing on:  {on:.0f} tokens/s, {tokens / cpu[True]:.0f} tokens per CPU-second"
          f"  (on/off {on / off:.3f})")


if __name__ == "__main__":
    main()
