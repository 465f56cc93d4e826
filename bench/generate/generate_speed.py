#!/usr/bin/env python3
"""Generation tokens/s: ciuic-run --generate vs transformers' generate(), same model, same run.

    .venv/bin/python bench/generate/generate_speed.py build/bin/ciuic-run [--threads N] [--new 32]
                     [--hidden 768 --layers 12 --vocab 32000] [--batches 1,8] [--dtype fp32] [--floor]

Builds a random Llama of about 100M parameters (hidden 768, 12 layers, 12 heads / 4 KV heads,
vocab 32000) in a temporary folder with the tokenizer of tests/fixtures/chat_templates/qwen2,
then for each batch size generates --new tokens greedily from the same prompts with both (no
EOS: every row produces --new tokens), OMP/torch threads set to --threads for both. Times exclude
loading and warm-up: ciuic-run generates the prompts twice over (--batch b, 2 b prompts) and its
time is the second batch's "seconds" of its JSONL output (prefill + decode; the first batch is
the warm-up: allocator, oneDNN/cuBLAS set-up, CUDA's lazy kernel loading, printed as "cold"),
transformers' the generate() call after one warm-up call. Prints one line per batch size and
the ratio.

--variants runs ciuic-run once per variant (each with its own warm-up), named by how its decode
steps run (docs/generate.md, "Decode step"): default (static + CUDA graph on CUDA, dynamic on the
CPU), nograph (CIUIC_CUDA_GRAPH=0), static (CIUIC_DECODE_STEP=static), dynamic
(CIUIC_DECODE_STEP=dynamic), mklhead (CIUIC_ONEDNN_HEAD=0), noskinny (CIUIC_SKINNY_GEMM=0: the CPU
decode's products through at::linear, not the skinny GEMM); e.g. --variants default,nograph,dynamic
for the graph's A/B, --variants noskinny,default for the skinny GEMM's.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOK = os.path.join(ROOT, "tests", "fixtures", "chat_templates", "qwen2")
PROMPTS = ["The quick brown fox jumps over the lazy dog", "Hello there", "Once upon a time in a land far away",
           "def fib(n):", "Translate to French: good morning", "1 2 3 4 5 6 7 8", "Why is the sky blue?",
           "Write a haiku about autumn leaves falling"]


# ciuic-run's environment per --variants name (docs/generate.md, "Decode step").
VARIANTS = {"default": {}, "nograph": {"CIUIC_CUDA_GRAPH": "0"}, "static": {"CIUIC_DECODE_STEP": "static"},
            "dynamic": {"CIUIC_DECODE_STEP": "dynamic"}, "mklhead": {"CIUIC_ONEDNN_HEAD": "0"},
            "noskinny": {"CIUIC_SKINNY_GEMM": "0"}}


def measure_floor() -> dict:
    """This machine's rates on the current torch thread count: the best of 5 runs each."""
    def best(f, n=5):
        ts = []
        for _ in range(n):
            t0 = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t0)
        return min(ts)
    n = 192 * 1024 * 1024  # 768 MB of fp32: far beyond any cache
    x, y = torch.ones(n), torch.empty(n)
    read = n * 4 / best(lambda: x.sum()) / 1e9
    copy = 2 * n * 4 / best(lambda: y.copy_(x)) / 1e9
    del x, y
    m = torch.randn(2048, 2048)
    gflops = 2 * 2048 ** 3 / best(lambda: torch.mm(m, m), 3) / 1e9
    return {"read_gbs": read, "copy_gbs": copy, "gflops": gflops}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("ciuic_run")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--device", default="cpu", help="cpu or cuda (transformers then uses its static cache)")
    ap.add_argument("--variants", default="default", help="comma list of " + ",".join(VARIANTS))
    ap.add_argument("--floor", action="store_true",
                    help="CPU: also measure this machine's read bandwidth and sgemm rate on --threads threads "
                         "and print each batch's floor per decode step beside both sides' step times")
    a = ap.parse_args()
    variants = a.variants.split(",")
    for v in variants:
        if v not in VARIANTS:
            ap.error(f"unknown variant {v}; known: {', '.join(VARIANTS)}")
    torch.set_num_threads(a.threads)
    dtype = torch.float32 if a.dtype == "fp32" else torch.bfloat16
    tmp = tempfile.mkdtemp(prefix="ciuic-gen-bench-")
    try:
        cfg = LlamaConfig(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.hidden * 8 // 3 // 64 * 64,
                          num_hidden_layers=a.layers, num_attention_heads=a.hidden // 64,
                          num_key_value_heads=max(1, a.hidden // 64 // (3 if a.hidden < 4096 else 4)),
                          max_position_embeddings=2048,
                          tie_word_embeddings=True, bos_token_id=None, eos_token_id=None)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg).eval().to(dtype)
        model.save_pretrained(tmp, safe_serialization=True)
        with open(os.path.join(tmp, "generation_config.json"), "w") as f:
            json.dump({"do_sample": False}, f)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(TOK, name), os.path.join(tmp, name))
        tok = AutoTokenizer.from_pretrained(tmp)
        model = model.to(a.device)
        params = sum(p.numel() for p in model.parameters())
        print(f"model: llama {params / 1e6:.0f}M parameters, {a.dtype}, {a.threads} threads, {a.new} new tokens/row")
        env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
        floor = measure_floor() if a.floor else None
        if floor:
            print(f"floor inputs ({a.threads} threads): read {floor['read_gbs']:.1f} GB/s (sum of a 768 MB tensor), "
                  f"memcpy {floor['copy_gbs']:.1f} GB/s (read + write), sgemm {floor['gflops']:.1f} GFLOP/s (2048^3)")
        for b in [int(x) for x in a.batches.split(",")]:
            prompts = [PROMPTS[i % len(PROMPTS)] for i in range(b)]
            pf = os.path.join(tmp, f"prompts{b}.jsonl")
            with open(pf, "w") as f:
                for p in prompts + prompts:  # the first batch warms up
                    f.write(json.dumps({"prompt": p}) + "\n")
            ciuic = {}  # variant -> (tokens, seconds, cold seconds)
            for v in variants:
                out = os.path.join(tmp, f"out{b}.jsonl")
                subprocess.run([a.ciuic_run, "--generate", tmp, "--prompts", pf, "--out", out, "--batch", str(b),
                                "--max-new-tokens", str(a.new), "--dtype", {"fp32": "float32", "bf16": "bfloat16"}[a.dtype], "--device", a.device], check=True,
                               env=dict(env, **VARIANTS[v]), stderr=subprocess.DEVNULL)
                rows = [json.loads(l) for l in open(out)]
                ciuic[v] = (sum(r["new_tokens"] for r in rows[b:]), rows[b]["seconds"], rows[0]["seconds"])
            enc = tok(prompts, return_tensors="pt", padding=True, padding_side="left").to(a.device)
            kw = dict(max_new_tokens=a.new, min_new_tokens=a.new, do_sample=False, pad_token_id=tok.pad_token_id)
            if a.device != "cpu":
                kw["cache_implementation"] = "static"
            with torch.no_grad():
                model.generate(**enc, **kw)  # warm-up
                t0 = time.perf_counter()
                hf = model.generate(**enc, **kw)
                if a.device != "cpu":
                    torch.cuda.synchronize()
                h_s = time.perf_counter() - t0
            h_tokens = (hf.shape[1] - enc.input_ids.shape[1]) * b
            h_tps = h_tokens / h_s
            for v, (c_tokens, c_s, cold_s) in ciuic.items():
                c_tps = c_tokens / c_s
                name = "ciuic" if v == "default" else f"ciuic[{v}]"
                print(f"batch {b}: {name} {c_tps:8.1f} tokens/s ({c_tokens} in {c_s:.2f} s)   "
                      f"transformers {h_tps:8.1f} tokens/s ({h_tokens} in {h_s:.2f} s)   ratio {c_tps / h_tps:.2f}x"
                      f"   (ciuic cold: {cold_s:.2f} s)")
            if floor:
                # A decode step reads every weight once (the tied embedding as lm_head) and does
                # 2 * params FLOPs per row (attention over a few dozen positions is negligible).
                weight_bytes = params * torch.finfo(dtype).bits // 8
                mem_ms = weight_bytes / (floor["read_gbs"] * 1e9) * 1e3
                flop_ms = 2 * params * b / (floor["gflops"] * 1e9) * 1e3
                c_ms = {v: c_s / a.new * 1e3 for v, (c_tokens, c_s, cold_s) in ciuic.items()}
                print(f"batch {b} per step: floor max({mem_ms:.1f} ms weights read, {flop_ms:.1f} ms FLOPs) = "
                      f"{max(mem_ms, flop_ms):.1f} ms; measured (prefill included) transformers "
                      f"{h_s / a.new * 1e3:.1f} ms, " + ", ".join(f"{'ciuic' if v == 'default' else v} {ms:.1f} ms"
                                                              for v, ms in c_ms.items()))
            sys.stdout.flush()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
