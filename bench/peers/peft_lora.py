#!/usr/bin/env python3
"""PEFT LoRA / QLoRA peer run: the model shape ciuic trains with an [adapter] section, trained the
way PEFT + transformers train it, for side-by-side tokens/s and peak memory in one call.

  python3 bench/peers/peft_lora.py --hidden 4096 --layers 30 ... --r 16 [--compile] [--qlora] --json out.json

Setup (what a PEFT user's script with the HF Trainer and bf16 does, without the Trainer):
HF transformers LlamaForCausalLM built from a config with random weights in --dtype (bf16 on CUDA,
fp32 on CPU), SDPA attention, frozen; peft.get_peft_model with LoraConfig(r, lora_alpha, dropout,
target_modules="all-linear") — PEFT keeps the adapters in fp32 beside a bf16 base
(autocast_adapter_dtype) and the forward runs under torch.autocast(bf16), as accelerate's
mixed_precision="bf16" does; AdamW (fused on CUDA) over the adapters only, gradient clipping at
--clip, random token ids, loss = transformers' mean token cross-entropy (labels = ids).
--compile: torch.compile on each decoder layer (as torchtitan does for blocks). --qlora: every
linear layer but lm_head replaced by bitsandbytes' Linear4bit as BitsAndBytesConfig(load_in_4bit,
nf4, double quantization, bf16 compute) makes it, then PEFT's LoRA over them (lora.Linear4bit).

Times steps after --warmup (CUDA: synchronised wall time per step; also the process's CPU time
per step, all threads: on a shared CPU machine the steadier figure); prints one JSON line (and writes
it to --json) with the median step, tokens/s, peak memory (CUDA: max_memory_allocated after the
warm-up; CPU: the process's peak RSS) and the losses. It fails (exit 3, a line starting with
"peer failed:") when a loss is not finite or when training left every lora_B at zero (PEFT starts
B at zero: a run whose adapters did not move trained nothing).
"""
import argparse
import json
import math
import os
import resource
import sys
import time

import torch


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--intermediate", type=int, default=2048)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--tie", action="store_true", help="tied embeddings")
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--steps", type=int, default=6, help="measured steps, after --warmup")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--r", type=int, default=16)
    p.add_argument("--alpha", type=float, default=32.0)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--target", default="all-linear", help='"all-linear" or a comma-separated module list')
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--clip", type=float, default=1.0, help="gradient clipping (0: off)")
    p.add_argument("--checkpointing", action="store_true")
    p.add_argument("--compile", action="store_true", help="torch.compile each decoder layer")
    p.add_argument("--qlora", action="store_true", help="nf4 base (bitsandbytes Linear4bit, double quant, bf16 compute)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--dtype", default="", choices=["", "bf16", "fp32"], help="default: bf16 on CUDA, fp32 on CPU")
    p.add_argument("--threads", type=int, default=0, help="torch threads on CPU (0: torch's default)")
    p.add_argument("--json", default="")
    return p.parse_args()


def fail(msg):
    print(f"peer failed: {msg}", flush=True)
    sys.exit(3)


def quantize_linears(model, device):
    """Every nn.Linear but lm_head -> bnb.nn.Linear4bit as transformers' BitsAndBytesConfig makes them."""
    import bitsandbytes as bnb
    from transformers import BitsAndBytesConfig
    q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                           bnb_4bit_compute_dtype=torch.bfloat16)
    n = 0
    for name, mod in list(model.named_modules()):
        for child_name, child in list(mod.named_children()):
            if not isinstance(child, torch.nn.Linear) or child_name == "lm_head":
                continue
            new = bnb.nn.Linear4bit(child.in_features, child.out_features, bias=child.bias is not None,
                                    compute_dtype=q.bnb_4bit_compute_dtype,
                                    compress_statistics=q.bnb_4bit_use_double_quant,
                                    quant_type=q.bnb_4bit_quant_type, quant_storage=q.bnb_4bit_quant_storage,
                                    device="meta")
            new.weight = bnb.nn.Params4bit(child.weight.data, requires_grad=False,
                                           compress_statistics=q.bnb_4bit_use_double_quant,
                                           quant_type=q.bnb_4bit_quant_type, quant_storage=q.bnb_4bit_quant_storage)
            if child.bias is not None:
                new.bias = torch.nn.Parameter(child.bias.data, requires_grad=False)
            setattr(mod, child_name, new)
            new.weight = new.weight.to(device)  # quantizes
            del child
            n += 1
    model.is_loaded_in_4bit = True
    model.config.quantization_config = q
    if device == "cuda":
        torch.cuda.empty_cache()
    return n


def main():
    a = parse()
    # Packages the GPU host lacks come from a carried folder (scripts/gpu/fetch-peft.sh), after the
    # host's own: PEER_SITE is appended to sys.path, so what the host has wins.
    if os.environ.get("PEER_SITE"):
        sys.path.append(os.environ["PEER_SITE"])
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, LlamaConfig

    if a.threads:
        torch.set_num_threads(a.threads)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[a.dtype or ("bf16" if a.device == "cuda" else "fp32")]
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=a.hidden, intermediate_size=a.intermediate, num_hidden_layers=a.layers,
                      num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, vocab_size=a.vocab,
                      max_position_embeddings=max(a.seq, 2048), tie_word_embeddings=a.tie)
    cfg._attn_implementation = "sdpa"
    t0 = time.perf_counter()
    torch.set_default_dtype(dtype)  # built in --dtype (from_config's dtype keyword differs across versions)
    with torch.device(a.device):
        model = AutoModelForCausalLM.from_config(cfg)
    torch.set_default_dtype(torch.float32)  # PEFT's adapters: fp32 beside a bf16 base
    model.requires_grad_(False)
    n_base = sum(p.numel() for p in model.parameters())
    n_quant = quantize_linears(model, a.device) if a.qlora else 0
    targets = a.target if a.target == "all-linear" else a.target.split(",")
    lcfg = LoraConfig(r=a.r, lora_alpha=a.alpha, lora_dropout=a.dropout, target_modules=targets, bias="none",
                      task_type="CAUSAL_LM")
    model = get_peft_model(model, lcfg)
    if a.checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    layers = model.base_model.model.model.layers
    if a.compile:
        for layer in layers:
            layer.compile()
    params = [p for p in model.parameters() if p.requires_grad]
    n_adapter = sum(p.numel() for p in params)
    if n_adapter == 0:
        fail("no trainable parameter after get_peft_model")
    adapter_dtypes = sorted({str(p.dtype).replace("torch.", "") for p in params})
    opt = torch.optim.AdamW(params, lr=a.lr, weight_decay=a.weight_decay, fused=a.device == "cuda")
    setup_s = time.perf_counter() - t0
    cuda = a.device == "cuda"
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda and dtype == torch.bfloat16)
    g = torch.Generator(device=a.device).manual_seed(1234)
    times, cpu_times, losses = [], [], []
    for step in range(a.warmup + a.steps):
        ids = torch.randint(0, a.vocab, (a.micro_batch, a.seq), device=a.device, generator=g)
        if cuda:
            torch.cuda.synchronize()
        t, c = time.perf_counter(), time.process_time()
        with autocast:
            out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        if a.clip > 0:
            torch.nn.utils.clip_grad_norm_(params, a.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        dt, dc = time.perf_counter() - t, time.process_time() - c
        losses.append(float(out.loss.detach()))
        if cuda and step == a.warmup - 1:
            torch.cuda.reset_peak_memory_stats()
        if step >= a.warmup:
            times.append(dt)
            cpu_times.append(dc)
    bad = [i for i, l in enumerate(losses) if not math.isfinite(l)]
    if bad:
        fail(f"loss not finite at step {bad[0] + 1}: {losses}")
    if all(float(p.detach().abs().max()) == 0.0 for n, p in model.named_parameters() if "lora_B" in n):
        fail("every lora_B is still zero after training: the adapters did not learn")
    cpu_mean = sum(cpu_times) / len(cpu_times)
    times.sort()
    med = times[len(times) // 2]
    tokens = a.micro_batch * a.seq
    if cuda:
        peak = torch.cuda.max_memory_allocated() / 2**30
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
    res = {"peer": "peft", "qlora": a.qlora, "compile": a.compile, "checkpointing": a.checkpointing,
           "device": a.device, "dtype": str(dtype).replace("torch.", ""), "threads": torch.get_num_threads(),
           "base_params": n_base, "adapter_params": n_adapter, "adapter_dtypes": adapter_dtypes,
           "base_dtype": str(model.get_input_embeddings().weight.dtype).replace("torch.", ""),
           "quantized_linears": n_quant, "hidden": a.hidden, "layers": a.layers, "seq": a.seq,
           "micro_batch": a.micro_batch, "r": a.r, "setup_s": setup_s, "step_s_median": med,
           "step_s_min": times[0], "step_s_max": times[-1], "step_cpu_s_mean": cpu_mean, "tokens_per_s": tokens / med,
           "peak_mem_gib": peak, "mem_kind": "cuda max_memory_allocated" if cuda else "peak RSS",
           "losses": losses}
    print(json.dumps(res), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f)


if __name__ == "__main__":
    main()
