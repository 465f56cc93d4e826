#!/usr/bin/env python3
"""Micro benchmark of a decoder layer's LoRA linears, the ATen op sequences of
core/src/model/llama_ops.cpp's lin() before and after issue 32's second session, forward + backward,
fp32 on the CPU (docs/performance.md, "LoRA"): the 100M shape's q, k, v (GQA) and gate, up, r 16.
  old               y = x W^T;  y + (x A^T) B^T * scaling              (three ops after the base GEMM)
  addmm_            y = x W^T;  y.addmm_(x A^T, B^T, alpha=scaling)    (one GEMM updates y)
  addmm_+shared A   the A products of q/k/v and gate/up as one GEMM each over the concatenated A
Usage: .venv/bin/python bench/lora/lora_micro.py [THREADS=2] [TOKENS=1024] [REPS=7]
Prints the largest relative difference of the outputs (new vs old) and each variant's median and best
step (the first repetition is a warm-up).
"""
import sys, time, torch
torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
N, H, M, r, s = int(sys.argv[2]) if len(sys.argv) > 2 else 1024, 768, 2048, 16, 2.0
def params(out):
    W = torch.randn(out, H) * 0.02
    A = (torch.randn(r, H) * 0.02).requires_grad_()
    B = (torch.randn(out, r) * 0.02).requires_grad_()
    return W, A, B
outs = [H, 256, 256, M, M]  # q, k, v (GQA), gate, up: two groups sharing x
groups = [(0, 1, 2), (3, 4)]
P = [params(o) for o in outs]
def old(x):
    ys = []
    for (W, A, B) in P:
        y = torch.nn.functional.linear(x, W)
        ys.append(y + torch.nn.functional.linear(torch.nn.functional.linear(x, A), B) * s)
    return ys
def new(x, shared=True):
    ys = []
    for g in groups:
        if shared:
            parts = torch.nn.functional.linear(x, torch.cat([P[i][1] for i in g], 0)).split([r] * len(g), -1)
        for k, i in enumerate(g):
            W, A, B = P[i]
            y = torch.nn.functional.linear(x, W)
            xa = parts[k] if shared else torch.nn.functional.linear(x, A)
            y.addmm_(xa, B.t(), beta=1.0, alpha=s)
            ys.append(y)
    return ys
def step(f, x):
    ys = f(x)
    sum((y * y).sum() for y in ys).backward()
    for (W, A, B) in P: A.grad = None; B.grad = None
    return x.grad
x0 = torch.randn(N, H)
# same math
x = x0.clone().requires_grad_(); a = [y.detach() for y in old(x)]
b = [y.detach() for y in new(x0.clone().requires_grad_())]
print("max rel diff new vs old", max(float((p - q).abs().max() / q.abs().max()) for p, q in zip(b, a)))
variants = {"old": old, "addmm_": lambda x: new(x, False), "addmm_+shared A": new}
times = {k: [] for k in variants}
for rep in range(int(sys.argv[3]) if len(sys.argv) > 3 else 7):
    for k, f in variants.items():
        x = x0.clone().requires_grad_()
        t = time.perf_counter(); step(f, x); times[k].append(time.perf_counter() - t)
for k, v in times.items():
    v = sorted(v[1:]); print(f"{k:18s} median {v[len(v)//2]*1e3:8.2f} ms  best {v[0]*1e3:8.2f} ms")
