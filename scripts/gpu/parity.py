#!/usr/bin/env python3
"""GPU parity check (scripts/gpu/run-suite.sh part1): trains a tiny fp32 Llama on CUDA with
ciuic-run as one process, then ZeRO-2 and DDP over NCCL on 2 GPUs with the same global batch,
and compares the exported fp32 weights: ||a - b|| / ||b|| over all parameters (the CPU suite's
tests/train/train_e2e_test.cpp measure, here with NCCL's reduction order), and the logged
gradient norms step by step (clipping at 1.0 is active: a wrong norm changes the weights too).
Exit 1 above 1e-5 (weights) or 1e-4 (norms).

usage: parity.py CIUIC_RUN OUT_DIR [--cpu]
  --cpu: the same cases on CPU workers over gloo (a check of this script)
"""
import json
import os
import shutil
import subprocess
import sys

import torch
from safetensors.torch import load_file

RECIPE = """
[run]
name = "gpu-parity"
output_dir = "{out}"
seed = 7
[cluster]
device = "{device}"
nproc_per_node = {world}
timeout_s = 120.0
[model.config]
hidden_size = 256
intermediate_size = 704
num_hidden_layers = 2
num_attention_heads = 4
num_key_value_heads = 2
vocab_size = 512
max_position_embeddings = 256
[train]
micro_batch_size = {micro}
gradient_accumulation_steps = {accum}
seq_len = 128
max_steps = 5
gradient_clipping = 1.0
[optimizer]
plugin = "{optimizer}"
lr = 1e-3
weight_decay = 0.1
[precision]
plugin = "fp32"
[comm]
plugin = "{comm}"
{comm_extra}
[sharding]
plugin = "{sharding}"
reduce_bucket_size = 100000
{extra}
[data]
plugin = "synthetic"
vocab_size = 512
documents_per_row = 3
[checkpoint]
export_hf = true
export_dtype = "fp32"
[log]
progress = "off"
every_steps = 1
"""


def run(ciuic, root, name, **kw):
    d = os.path.join(root, name)
    os.makedirs(d, exist_ok=True)
    shutil.rmtree(os.path.join(d, "out"), ignore_errors=True)  # ciuic-run refuses another run's files
    kw.setdefault("extra", "")
    kw.setdefault("comm_extra", "")
    kw.setdefault("accum", 1)
    kw.setdefault("optimizer", "adamw")
    kw["device"] = "cpu" if CPU else "cuda"
    if CPU:
        kw["comm"] = "gloo"
    with open(os.path.join(d, "recipe.toml"), "w") as f:
        f.write(RECIPE.format(out=os.path.join(d, "out"), **kw))
    p = subprocess.run([ciuic, os.path.join(d, "recipe.toml")], capture_output=True, text=True,
                       timeout=240)
    with open(os.path.join(d, "log.txt"), "w") as f:
        f.write(p.stdout + p.stderr)
    if p.returncode != 0:
        print(f"{name}: exit {p.returncode}\n{p.stderr[-3000:]}")
        return None
    norms = [json.loads(l)["grad_norm"] for l in open(os.path.join(d, "out", "metrics.jsonl"))
             if '"grad_norm"' in l]
    return load_file(os.path.join(d, "out", "hf", "model.safetensors")), norms


def rel(a, b):
    num = sum(((a[k].double() - b[k].double()) ** 2).sum().item() for k in b)
    den = sum((b[k].double() ** 2).sum().item() for k in b)
    return (num / den) ** 0.5


CPU = "--cpu" in sys.argv
LOCAL50 = 'grad_accumulation = "reduce_each"\nlocal_accumulation_percent = 50'


def main():
    ciuic, root = sys.argv[1], sys.argv[2]
    ngpu = 4 if CPU else torch.cuda.device_count()
    limit = 1e-5
    ref = run(ciuic, root, "single", world=1, micro=8, comm="nccl", sharding="ddp")
    cases = [("zero2-nccl-w2", dict(world=2, micro=4, comm="nccl", sharding="zero2")),
             ("ddp-nccl-w2", dict(world=2, micro=4, comm="nccl", sharding="ddp")),
             ("zero2-nccl-w2-pcie", dict(world=2, micro=4, comm="nccl", sharding="zero2",
                                         comm_extra='transport = "pcie"')),
             ("zero2-cpuadam-w2", dict(world=2, micro=4, comm="nccl", sharding="zero2",
                                       optimizer="cpu_adam")),
             # 2 micro-batches, each reduced: the host staging path of a host optimizer
             ("zero2-cpuadam-w2-acc2", dict(world=2, micro=2, accum=2, comm="nccl",
                                            sharding="zero2", optimizer="cpu_adam")),
             # 4 micro-batches on one rank: reduced each, half the buckets kept on the device
             # (local_accumulation_percent), all kept (no_sync); the device update and cpu_adam
             ("zero2-w1-acc4", dict(world=1, micro=2, accum=4, comm="nccl", sharding="zero2",
                                    extra='grad_accumulation = "reduce_each"')),
             ("zero2-w1-acc4-local50", dict(world=1, micro=2, accum=4, comm="nccl", sharding="zero2",
                                            extra=LOCAL50)),
             ("zero2-w1-acc4-nosync", dict(world=1, micro=2, accum=4, comm="nccl", sharding="zero2",
                                           extra='grad_accumulation = "no_sync"')),
             ("zero2-cpuadam-w1-acc4-local50", dict(world=1, micro=2, accum=4, comm="nccl", sharding="zero2",
                                                    optimizer="cpu_adam", extra=LOCAL50)),
             ("zero2-cpuadam-w2-acc2-local50", dict(world=2, micro=2, accum=2, comm="nccl", sharding="zero2",
                                                    optimizer="cpu_adam", extra=LOCAL50))]
    results, ok = {}, ref is not None
    if ref is not None:
        ref, ref_norms = ref
        print("one process: gradient norms " + ", ".join(f"{n:.4f}" for n in ref_norms))
    for name, kw in cases:
        if CPU and "comm_extra" in kw:
            continue  # a transport is an nccl option
        if kw["world"] > ngpu:
            print(f"{name}: skipped ({ngpu} GPU)")
            continue
        w = run(ciuic, root, name, **kw)
        if w is None or ref is None:
            ok = False
            continue
        w, norms = w
        r = rel(w, ref)
        dn = max(abs(a - b) / b for a, b in zip(norms, ref_norms)) if len(norms) == len(ref_norms) else float("inf")
        results[name] = r
        results[name + ":grad_norm"] = dn
        good = r < limit and dn < 1e-4
        ok &= good
        print(f"{name:22s} rel. difference to one process: weights {r:.2e}, gradient norms {dn:.2e}"
              f"  {'ok' if good else 'FAIL'}")
    json.dump(results, open(os.path.join(root, "parity.json"), "w"), indent=1)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
