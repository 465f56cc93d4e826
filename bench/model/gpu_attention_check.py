#!/usr/bin/env python3
"""Which SDPA kernel serves each attention form the model uses, and at what cost (GPU).

    python3 bench/model/gpu_attention_check.py

The model calls at::scaled_dot_product_attention in two forms: causal (is_causal, enable_gqa when
num_key_value_heads < num_attention_heads) and packed (a block-diagonal boolean mask). This
script times forward+backward of each form at DeepSeek-7B / Llama-3-8B attention shapes in bf16
and reports which backends accept it, to decide how packed GQA attention is issued on CUDA. It also
times flash varlen attention with sync-free cu_seqlens (one slot per token, empty sequences after
the last document): a dead end, the per-sequence bookkeeping of the empty slots costs 10x the
masked cuDNN kernel (results in docs/performance/model.md).
"""
import time
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def packed_mask(t, docs, device):
    pos = torch.cat([torch.arange(n) for n in docs]).to(device)[None]
    doc = (pos == 0).int().cumsum(1)
    same = doc[:, :, None] == doc[:, None, :]
    return (same & torch.ones(t, t, dtype=torch.bool, device=device).tril())[:, None]


def bench(fn, q, k, v, steps=10):
    for _ in range(3):
        fn(q, k, v).sum().backward()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(steps):
        fn(q, k, v).sum().backward()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps * 1e3, torch.cuda.max_memory_allocated() / 2**20


def main():
    warnings.filterwarnings("ignore")
    dev = "cuda"
    print(torch.__version__, torch.cuda.get_device_name())
    for (b, t, h, kv, d) in [(1, 4096, 32, 8, 128), (1, 4096, 32, 32, 128), (2, 2048, 32, 8, 128)]:
        torch.manual_seed(0)
        q = torch.randn(b, h, t, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(b, kv, t, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(b, kv, t, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
        m = packed_mask(t, [t // 4, t // 2, t - t // 4 - t // 2], dev).expand(b, 1, t, t)
        rep = h // kv
        forms = {
            "causal gqa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=rep > 1),
            "mask gqa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=rep > 1),
            "mask expanded kv": lambda q, k, v: F.scaled_dot_product_attention(
                q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), attn_mask=m),
        }
        # Flash varlen over the packed documents, cu_seqlens built without a host sync: one slot per
        # token, slots past the last document hold B*T (empty sequences), max length = T.
        pos = torch.cat([torch.arange(n) for n in [t // 4, t // 2, t - t // 4 - t // 2]]).to(dev).repeat(b)
        n_tok = b * t
        starts = pos == 0
        doc = starts.int().cumsum(0) - 1
        cu = torch.full((n_tok + 1,), n_tok, dtype=torch.int32, device=dev)
        cu.scatter_(0, torch.where(starts, doc, n_tok).long(), torch.arange(n_tok, dtype=torch.int32, device=dev))
        cu[n_tok] = n_tok

        def varlen(q, k, v):
            out, _, _, _, _ = torch.ops.aten._flash_attention_forward(
                q.transpose(1, 2).reshape(n_tok, h, d), k.transpose(1, 2).reshape(n_tok, kv, d),
                v.transpose(1, 2).reshape(n_tok, kv, d), cu, cu, t, t, 0.0, True, False)
            return out.view(b, t, h, d).transpose(1, 2)

        try:
            from torch.nn.attention.varlen import varlen_attn
            def varlen(q, k, v):  # noqa: F811 (the differentiable public wrapper, same kernel)
                out = varlen_attn(q.transpose(1, 2).reshape(n_tok, h, d), k.transpose(1, 2).reshape(n_tok, kv, d),
                                  v.transpose(1, 2).reshape(n_tok, kv, d), cu, cu, t, t, window_size=(-1, 0))
                return out.view(b, t, h, d).transpose(1, 2)
        except ImportError:
            pass
        # The same with the real boundaries (known on the host: the DataSource's CPU position_ids).
        docs = [t // 4, t // 2, t - t // 4 - t // 2] * b
        cu_host = torch.tensor([0] + list(torch.tensor(docs).cumsum(0)), dtype=torch.int32, device=dev)
        max_doc = max(docs)

        def varlen_host(q, k, v):
            out = varlen_attn(q.transpose(1, 2).reshape(n_tok, h, d), k.transpose(1, 2).reshape(n_tok, kv, d),
                              v.transpose(1, 2).reshape(n_tok, kv, d), cu_host, cu_host, max_doc, max_doc,
                              window_size=(-1, 0))
            return out.view(b, t, h, d).transpose(1, 2)

        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=rep > 1)
        got = varlen_host(q, k, v)
        ms, mib = bench(varlen_host, q, k, v)
        print(f"\n  flash varlen, host boundaries: {ms:.2f} ms fwd+bwd, peak {mib:.0f} MiB, "
              f"max abs diff vs mask {(got - ref).abs().max().item():.3e}")
        got = varlen(q, k, v)
        print(f"\nB={b} T={t} heads={h} kv={kv} D={d}   varlen vs mask max abs diff "
              f"{(got - ref).abs().max().item():.3e}")
        ms, mib = bench(varlen, q, k, v)
        print(f"  {'flash varlen':18s} {ms:8.2f} ms fwd+bwd  peak {mib:8.0f} MiB")
        for name, fn in forms.items():
            ok = []
            for be in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                       SDPBackend.MATH):
                try:
                    with sdpa_kernel([be]):
                        fn(q, k, v)
                    ok.append(be)
                except Exception:
                    pass
            ms, mib = bench(fn, q, k, v)
            print(f"  {name:18s} {ms:8.2f} ms fwd+bwd  peak {mib:8.0f} MiB  backends accepting: "
                  f"{[b.name for b in ok]}")
            for be in ok:
                if be == SDPBackend.MATH:
                    continue
                with sdpa_kernel([be]):
                    ms1, mib1 = bench(fn, q, k, v)
                print(f"  {'':18s}   forced {be.name}: {ms1:.2f} ms, peak {mib1:.0f} MiB")


if __name__ == "__main__":
    main()
