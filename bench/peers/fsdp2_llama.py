#!/usr/bin/env python3
"""PyTorch FSDP2 peer run: the same model shape ciuic trains, for side-by-side tokens/s, MFU and
peak memory in one device call. --model-type picks the family (llama, mistral, qwen2, qwen3,
gemma3_text: transformers' own class for it, e.g. Qwen2ForCausalLM with its q/k/v biases).

  torchrun --nproc-per-node N bench/peers/fsdp2_llama.py --hidden 2048 --layers 16 ... --json out.json

Setup (what torchtitan does for a plain run): HF transformers LlamaForCausalLM built from a config
with random weights (fp32 master parameters), every decoder layer and then the root wrapped with
fully_shard(reshard_after_forward=False) — ZeRO-2-like: parameters stay gathered between forward
and backward; --reshard-after-forward: True, ZeRO-3 — MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), fused AdamW, SDPA
attention, optional activation checkpointing per layer, random token ids, loss = mean token
cross-entropy. Times steps after warm-up with CUDA events around each step; prints one JSON line
(and writes it to --json) with tokens/s per GPU, MFU against --peak-tflops, and peak memory.
"""
import argparse
import json
import math
import os
import time

import torch
import torch.distributed as dist


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--intermediate", type=int, default=5632)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=16)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--model-type", default="llama", choices=["llama", "mistral", "qwen2", "qwen3", "gemma3_text"])
    p.add_argument("--head-dim", type=int, default=0, help="0: hidden / heads")
    p.add_argument("--sliding-window", type=int, default=0, help="mistral, qwen2/3 (all layers), gemma3_text; 0: none")
    p.add_argument("--tie", action="store_true", help="tied embeddings")
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--checkpointing", action="store_true")
    p.add_argument("--compile", action="store_true", help="torch.compile each block")
    p.add_argument("--reshard-after-forward", action="store_true",
                   help="fully_shard(reshard_after_forward=True): ZeRO-3, parameters gathered again for backward")
    p.add_argument("--peak-tflops", type=float, default=989.0)
    p.add_argument("--json", default="")
    return p.parse_args()


def main():
    a = parse()
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import AutoConfig, AutoModelForCausalLM

    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local)
    torch.manual_seed(0)
    extra = {}
    if a.head_dim:
        extra["head_dim"] = a.head_dim
    if a.model_type in ("mistral", "gemma3_text"):
        extra["sliding_window"] = a.sliding_window or None
    if a.model_type in ("qwen2", "qwen3") and a.sliding_window:
        extra.update(use_sliding_window=True, sliding_window=a.sliding_window, max_window_layers=0)
    cfg = AutoConfig.for_model(a.model_type, hidden_size=a.hidden, intermediate_size=a.intermediate,
                               num_hidden_layers=a.layers, num_attention_heads=a.heads,
                               num_key_value_heads=a.kv_heads, vocab_size=a.vocab,
                               max_position_embeddings=a.seq, tie_word_embeddings=a.tie, **extra)
    cfg._attn_implementation = "sdpa"
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg)
    if a.checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        if a.compile:
            layer.compile()
        fully_shard(layer, mp_policy=mp, reshard_after_forward=a.reshard_after_forward)
    fully_shard(model, mp_policy=mp, reshard_after_forward=a.reshard_after_forward)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    n_params = sum(p.numel() for p in model.parameters())  # a tied embedding once
    n_embed = cfg.vocab_size * cfg.hidden_size
    # PaLM appendix B: 6 N (weights used in matmuls: all but the input embedding) + 12 L H T.
    heads_width = a.heads * (a.head_dim or a.hidden // a.heads)
    flops_per_token = 6 * (n_params - n_embed + (n_embed if a.tie else 0)) + 12 * a.layers * heads_width * a.seq
    g = torch.Generator(device="cuda").manual_seed(1234 + rank)
    times = []
    for step in range(a.warmup + a.steps):
        ids = torch.randint(0, a.vocab, (a.micro_batch, a.seq), device="cuda", generator=g)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        end.record()
        torch.cuda.synchronize()
        if step == a.warmup - 1:
            torch.cuda.reset_peak_memory_stats()
        if step >= a.warmup:
            times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    med = times[len(times) // 2]
    tps = a.micro_batch * a.seq / med
    res = {"peer": "fsdp2", "model_type": a.model_type, "world": world, "params": n_params, "hidden": a.hidden,
           "layers": a.layers, "seq": a.seq, "micro_batch": a.micro_batch,
           "checkpointing": a.checkpointing, "compile": a.compile,
           "reshard_after_forward": a.reshard_after_forward,
           "step_s_median": med, "step_s_min": times[0], "step_s_max": times[-1],
           "tokens_per_s_per_gpu": tps, "mfu": flops_per_token * tps / (a.peak_tflops * 1e12),
           "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30,
           "loss": float(out.loss)}
    if rank == 0:
        print(json.dumps(res), flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
