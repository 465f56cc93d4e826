#!/usr/bin/env python3
"""DeepSpeed peer run: a seed's DeepSpeed config, as written, on the Llama shape a ciuic recipe
trains, for side-by-side step time, tokens/s and peak memory in one device call (issue 14).

  torchrun --nproc-per-node N bench/peers/deepspeed_zero2.py --ds-config ../shared/seeds/ds_config_4xa100_seed.json \\
      --dtype bf16 --offload --hidden 4096 --intermediate 11008 --layers 30 --heads 32 --kv-heads 32 \\
      --vocab 102400 --micro-batch 1 --accumulation 8 --checkpointing --cap-gib 24 --json out.json

What it runs: HF transformers LlamaForCausalLM built from a config (random weights) in the
training dtype, SDPA attention, `gradient_checkpointing_enable()` with --checkpointing, random
token ids (labels = inputs), `deepspeed.initialize` with the seed's JSON unchanged except for what
the recipe decides and the seed cannot say:
  - the precision block: the seed's `fp16`/`bf16` block is replaced by `{"<dtype>": {"enabled": true}}`
    for --dtype (the 3x4090 setup trains in bf16, the seed's file says fp16);
  - `train_micro_batch_size_per_gpu` and `gradient_accumulation_steps` from the recipe's batch;
  - with --offload, `zero_optimization.offload_optimizer = {"device": "cpu", "pin_memory": true}`
    (the recipes' cpu_adam);
  - with --stage3, `stage = 3` and `offload_param = {"device": "cpu", "pin_memory": true}`, the model
    built under `deepspeed.zero.Init` (ciuic's zero3 with offload_params).
Everything else (ZeRO stage and buckets, overlap_comm, optimizer, scheduler, clipping or its
absence) is the seed's. The config used is in the JSON output.

Timing: wall time of each optimizer step (all micro-batches, a device synchronisation at each end)
after --warmup steps; the process's time to deepspeed.initialize's return and to the end of the
first step; peak memory allocated on the device. --cap-gib caps this process's caching
allocator as ciuic's [cluster] memory_per_device_gib does (an out-of-memory error then is a
result: the JSON says so). Prints one JSON line and writes it to --json (rank 0).

DeepSpeed is not on the GPU host: build its wheel where a registry is reachable
(`DS_BUILD_OPS=0 pip wheel --no-deps --no-build-isolation deepspeed==0.19.8 -w .whl`, with torch
installed; and `pip download` its pure-Python dependencies), carry `.whl`, and there
`pip install --no-index --no-deps --target DIR .whl/*.whl` with DIR on PYTHONPATH; its CPU Adam
is compiled on first use (set TORCH_EXTENSIONS_DIR). scripts/gpu/hostmem.sh does all of it.
"""
import argparse
import json
import os
import time

T_START = time.monotonic()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ds-config", required=True, help="the seed's DeepSpeed JSON")
    p.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    p.add_argument("--offload", action="store_true", help="optimizer state in host memory (cpu_adam)")
    p.add_argument("--stage3", action="store_true",
                   help="ZeRO stage 3 with offload_param to the CPU, the model built under deepspeed.zero.Init")
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--intermediate", type=int, default=11008)
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=32)
    p.add_argument("--vocab", type=int, default=102400)
    p.add_argument("--rope-theta", type=float, default=10000.0)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--accumulation", type=int, default=8)
    p.add_argument("--checkpointing", action="store_true")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--cap-gib", type=float, default=0.0)
    p.add_argument("--json", default="")
    return p.parse_args()


def ds_config(a):
    with open(a.ds_config) as f:
        cfg = json.load(f)
    for k in ("fp16", "bf16", "bfloat16"):
        cfg.pop(k, None)
    cfg[a.dtype] = {"enabled": True}
    cfg["train_micro_batch_size_per_gpu"] = a.micro_batch
    cfg["gradient_accumulation_steps"] = a.accumulation
    cfg.pop("train_batch_size", None)  # DeepSpeed derives it from the two above and the world size
    if a.offload:
        cfg.setdefault("zero_optimization", {})["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if a.stage3:
        z = cfg.setdefault("zero_optimization", {})
        z["stage"] = 3
        z["offload_param"] = {"device": "cpu", "pin_memory": True}
    cfg.setdefault("steps_per_print", 10**9)
    return cfg


def main():
    a = parse()
    import deepspeed
    from transformers import LlamaConfig, LlamaForCausalLM

    deepspeed.init_distributed("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local)
    if a.cap_gib > 0:
        total = torch.cuda.get_device_properties(local).total_memory
        torch.cuda.set_per_process_memory_fraction(a.cap_gib * 2**30 / total, local)
    mc = LlamaConfig(hidden_size=a.hidden, intermediate_size=a.intermediate, num_hidden_layers=a.layers,
                     num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, vocab_size=a.vocab,
                     max_position_embeddings=max(4096, a.seq), rope_theta=a.rope_theta, tie_word_embeddings=False)
    mc._attn_implementation = "sdpa"
    torch.manual_seed(1234)
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    if a.stage3:  # partitioned as it is built: the whole model never sits on one GPU
        with deepspeed.zero.Init(config_dict_or_path=ds_config(a), dtype=dtype):
            model = LlamaForCausalLM(mc)
    else:
        model = LlamaForCausalLM(mc).to(dtype)
    model.config.use_cache = False
    if a.checkpointing:
        model.gradient_checkpointing_enable()
    cfg = ds_config(a)
    out = {"peer": "deepspeed", "version": deepspeed.__version__, "world": world, "dtype": a.dtype,
           "offload": a.offload, "layers": a.layers, "micro_batch": a.micro_batch, "accumulation": a.accumulation,
           "seq": a.seq, "cap_gib": a.cap_gib, "params": sum(p.numel() for p in model.parameters()),
           "ds_config": cfg}
    try:
        t0 = time.monotonic()
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
        out["initialize_s"] = round(time.monotonic() - t0, 2)
        out["ready_s"] = round(time.monotonic() - T_START, 2)
        gen = torch.Generator(device="cuda").manual_seed(rank)
        times = []
        for step in range(a.steps):
            torch.cuda.synchronize()
            t = time.monotonic()
            for _ in range(a.accumulation):
                ids = torch.randint(0, a.vocab, (a.micro_batch, a.seq), device="cuda", generator=gen)
                loss = engine(input_ids=ids, labels=ids).loss
                engine.backward(loss)
                engine.step()
            torch.cuda.synchronize()
            times.append(time.monotonic() - t)
            if step == 0:
                out["first_step_s"] = round(time.monotonic() - T_START, 2)
            if rank == 0:
                print(f"step {step + 1}/{a.steps} | {times[-1]:.2f} s | loss {loss.item():.4f}", flush=True)
        timed = times[a.warmup:] or times
        step_s = sorted(timed)[len(timed) // 2]
        out.update(step_s=round(step_s, 3), steps_s=[round(t, 3) for t in times],
                   tokens_per_s_per_gpu=round(a.micro_batch * a.accumulation * a.seq / step_s, 1))
    except torch.OutOfMemoryError as e:
        out["error"] = "out of memory: " + str(e).split("\n")[0][:300]
    out["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    if rank == 0:
        line = json.dumps(out)
        print(line, flush=True)
        if a.json:
            with open(a.json, "w") as f:
                f.write(line + "\n")


if __name__ == "__main__":
    main()
