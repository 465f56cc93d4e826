#!/usr/bin/env python3
"""LoRA / QLoRA step: ciuic-run with an [adapter] section vs PEFT + transformers, same shape, same run.

    bench/lora/lora_speed.py --ciuic-run build/bin/ciuic-run [--device cpu|cuda] [--shape 100m|7b]
        [--runs ciuic-lora,peft,peft-compile,ciuic-full,ciuic-qlora,peft-qlora] [--reps N]
        [--micro-batch B --seq S --steps M --warmup W --threads T --r 16 --alpha 32]
        [--out DIR] [--append] [--timeout S] [--python python3] [--set K=V]...

Shapes (random weights, synthetic tokens): 100m = Llama hidden 768, 12 layers, 12 heads / 4 KV heads,
intermediate 2048, vocab 32000, tied embeddings (≈100M parameters; as bench/generate/generate_speed.py);
7b = DeepSeek-LLM-7B (hidden 4096, 30 layers, 32 heads, intermediate 11008, vocab 102400).
Every run is its own process:
  ciuic-lora   configs/llama-1b-bench.toml cut to the shape, [adapter] type "lora", r, alpha, all-linear
  ciuic-qlora  the same with [adapter] base_quantization = "nf4"
  ciuic-full   the same model without adapter (full fine-tune): its forward+backward is what a LoRA
               step wraps
  peft, peft-compile, peft-qlora   bench/peers/peft_lora.py (eager; decoder layers compiled; nf4 base)
On CPU: fp32, gloo, OMP_NUM_THREADS = torch threads = --threads on both sides; on CUDA: bf16 (the
peer: bf16 base, fp32 adapters under autocast, as PEFT + accelerate train). Activation
checkpointing off on both sides (--checkpointing: on both). The repetitions alternate the order
of the runs (forward, backward, ...), so that drift of the machine hits every run.

Figures: ciuic's are the medians over the steps after --warmup of its metrics.jsonl (step_s,
fwd_bwd_s; tokens/s = tokens per step / median step), memory the largest mem_gib (CUDA: the caching
allocator's peak allocation) or host_rss_peak_gib (CPU); the peer's from its JSON line (the same
measures). A run that fails, times out or logs a non-finite loss is reported as failed with its log,
and the others still run. Writes DIR/summary.md (the table and the ratios: ciuic LoRA tokens/s over
each peer's, peak memory ciuic / peer, the LoRA step over the full model's forward+backward against
the adapters' share of the FLOPs), DIR/summary.json, every run's log and JSON. Exit status 0 when
every run passed, 1 otherwise (the summary is written either way), 2 on a usage error.
"""
import argparse
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PEER = os.path.join(ROOT, "bench", "peers", "peft_lora.py")
SHAPES = {
    "100m": dict(hidden=768, intermediate=2048, layers=12, heads=12, kv_heads=4, vocab=32000, tie=True),
    "tiny": dict(hidden=128, intermediate=256, layers=2, heads=2, kv_heads=1, vocab=512, tie=True),  # tests
    "7b": dict(hidden=4096, intermediate=11008, layers=30, heads=32, kv_heads=32, vocab=102400, tie=False),
}
ALL_RUNS = ["ciuic-lora", "peft", "peft-compile", "ciuic-full", "ciuic-qlora", "peft-qlora"]


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ciuic-run", required=True)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--shape", default="100m", choices=sorted(SHAPES))
    p.add_argument("--runs", default="ciuic-lora,peft,ciuic-full")
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--steps", type=int, default=6, help="measured steps, after --warmup")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=2, help="CPU threads of both sides")
    p.add_argument("--r", type=int, default=16)
    p.add_argument("--alpha", type=float, default=32.0)
    p.add_argument("--checkpointing", action="store_true")
    p.add_argument("--out", default="runs/lora-speed")
    p.add_argument("--timeout", type=int, default=600, help="seconds per run (peft-compile: 1.5x)")
    p.add_argument("--python", default=sys.executable, help="the peer's interpreter")
    p.add_argument("--recipe", default=os.path.join(ROOT, "configs", "llama-1b-bench.toml"))
    p.add_argument("--set", action="append", default=[], help="extra ciuic-run override (every ciuic run)")
    p.add_argument("--append", action="store_true",
                   help="keep the runs of other names from DIR/summary.json (a later call adds to the table)")
    a = p.parse_args(argv)
    runs = [r for r in a.runs.split(",") if r]
    bad = [r for r in runs if r not in ALL_RUNS]
    if bad or not runs:
        p.error(f"--runs: unknown {bad or 'empty'}; known: {','.join(ALL_RUNS)}")
    if a.warmup < 1 or a.steps < 1 or a.reps < 1:
        p.error("--warmup, --steps and --reps must be >= 1")
    a.runs = runs
    return a


def adapter_params(s, r):
    """LoRA parameters on every linear layer of the decoder (all-linear: lm_head excluded)."""
    h, i, kv = s["hidden"], s["intermediate"], s["kv_heads"] * (s["hidden"] // s["heads"])
    per_layer = r * ((h + h) * 2 + (h + kv) * 2 + (h + i) * 2 + (i + h))  # q o, k v, gate up, down
    return per_layer * s["layers"]


def model_flops_per_token(s, seq):
    """Forward+backward of the full model: 6 x matmul weights (lm_head included) + 12 L H T (PaLM)."""
    h, i, kv = s["hidden"], s["intermediate"], s["kv_heads"] * (s["hidden"] // s["heads"])
    linear = s["layers"] * (2 * h * h + 2 * h * kv + 3 * h * i) + s["vocab"] * h
    return 6 * linear + 12 * s["layers"] * h * seq


def ciuic_cmd(a, s, kind, out_dir):
    m = "model.config"
    sets = [f"{m}.hidden_size={s['hidden']}", f"{m}.intermediate_size={s['intermediate']}",
            f"{m}.num_hidden_layers={s['layers']}", f"{m}.num_attention_heads={s['heads']}",
            f"{m}.num_key_value_heads={s['kv_heads']}", f"{m}.vocab_size={s['vocab']}",
            f"data.vocab_size={s['vocab']}", f"{m}.max_position_embeddings={max(a.seq, 2048)}",
            f"{m}.tie_word_embeddings={'true' if s['tie'] else 'false'}",
            f"train.micro_batch_size={a.micro_batch}", "train.gradient_accumulation_steps=1",
            f"train.seq_len={a.seq}", f"train.max_steps={a.warmup + a.steps}", "log.every_steps=1",
            f"model.activation_checkpointing={'true' if a.checkpointing else 'false'}",
            "checkpoint.save_final=false", f'run.output_dir="{out_dir}"']
    if a.device == "cpu":
        sets += ['cluster.device="cpu"', 'comm.plugin="gloo"', 'precision.plugin="fp32"']
    if kind != "full":
        sets += ['adapter.type="lora"', f"adapter.r={a.r}", f"adapter.alpha={a.alpha}",
                 "adapter.dropout=0.0", 'adapter.target_modules=["all-linear"]']
    if kind == "qlora":
        sets.append('adapter.base_quantization="nf4"')
    cmd = [a.ciuic_run, a.recipe]
    for kv in sets + a.set:
        cmd += ["--set", kv]
    return cmd


def peer_cmd(a, s, kind, json_path):
    cmd = [a.python, PEER, "--device", a.device, "--hidden", str(s["hidden"]), "--intermediate",
           str(s["intermediate"]), "--layers", str(s["layers"]), "--heads", str(s["heads"]), "--kv-heads",
           str(s["kv_heads"]), "--vocab", str(s["vocab"]), "--seq", str(a.seq), "--micro-batch",
           str(a.micro_batch), "--steps", str(a.steps), "--warmup", str(a.warmup), "--r", str(a.r),
           "--alpha", str(a.alpha), "--threads", str(a.threads), "--json", json_path]
    if s["tie"]:
        cmd.append("--tie")
    if a.checkpointing:
        cmd.append("--checkpointing")
    if kind == "compile":
        cmd.append("--compile")
    if kind == "qlora":
        cmd.append("--qlora")
    return cmd


def read_ciuic(out_dir, warmup, tokens):
    steps, rss = [], []
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("event") == "rank":
                rss.append(rec.get("host_rss_peak_gib", 0.0))
            elif "event" not in rec and "step_s" in rec:
                steps.append(rec)
    losses = [r["loss"] for r in steps]
    meas = [r for r in steps if r["step"] > warmup]
    if not meas:
        raise RuntimeError(f"{len(steps)} logged steps, none after the {warmup} warm-up steps")
    step_s = statistics.median(r["step_s"] for r in meas)
    mems = [r["mem_gib"] for r in steps if "mem_gib" in r]
    return {"step_s": step_s, "step_s_min": min(r["step_s"] for r in meas),
            "fwd_bwd_s": statistics.median(r["fwd_bwd_s"] for r in meas),
            "fwd_bwd_s_min": min(r["fwd_bwd_s"] for r in meas),
            "tokens_per_s": tokens / step_s, "losses": losses,
            "peak_mem_gib": max(mems) if mems else max(rss or [0.0]),
            "mem_kind": "mem_gib (peak allocated)" if mems else "host_rss_peak_gib"}


def run_one(a, s, name, rep, env):
    tag = f"{name}-{rep}"
    log = os.path.join(a.out, tag + ".log")
    res = {"run": name, "rep": rep, "log": log}
    side, _, kind = name.partition("-")
    kind = kind or "lora"
    if side == "ciuic":
        out_dir = os.path.join(a.out, tag)
        shutil.rmtree(out_dir, ignore_errors=True)  # a fresh run (ciuic-run refuses a used folder)
        cmd = ciuic_cmd(a, s, kind, out_dir)
    else:
        json_path = os.path.join(a.out, tag + ".json")
        cmd = peer_cmd(a, s, kind, json_path)
    limit = a.timeout * (1.5 if kind == "compile" else 1)
    t0 = time.perf_counter()

    def child(cmd, mode):  # (exit status, CPU seconds of the process and its children)
        c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        with open(log, mode) as f:
            f.write(" ".join(cmd) + "\n")
            f.flush()
            try:
                rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=limit).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        return rc, (c1.ru_utime + c1.ru_stime) - (c0.ru_utime + c0.ru_stime)

    rc, cpu = child(cmd, "w")
    if rc == 0 and side == "ciuic" and a.device == "cpu":
        # ciuic's CPU time per measured step: this run's CPU time less that of the same run cut to
        # its warm-up steps (start-up, set-up and warm-up cancel out).
        setup_dir = out_dir + "-warmup"
        shutil.rmtree(setup_dir, ignore_errors=True)
        rc, cpu0 = child(cmd + ["--set", f"train.max_steps={a.warmup}", "--set", f'run.output_dir="{setup_dir}"'], "a")
        res["step_cpu_s_mean"] = (cpu - cpu0) / a.steps
        res["cpu_s"], res["cpu_warmup_s"] = cpu, cpu0  # at tiny shapes the difference is noise
    res["wall_s"] = time.perf_counter() - t0
    try:
        if rc != 0:
            raise RuntimeError(f"exit {rc}")
        res.update(read_ciuic(out_dir, a.warmup, a.micro_batch * a.seq) if side == "ciuic" else json.load(open(json_path)))
        res.setdefault("step_s", res.get("step_s_median"))
        bad = [l for l in res["losses"] if not math.isfinite(l)]
        if bad:
            raise RuntimeError(f"non-finite loss {bad[0]}")
        res["ok"] = True
    except Exception as e:  # noqa: BLE001 — every failure is reported, the other runs go on
        tail = open(log, errors="replace").read().strip().splitlines()[1:][-2:]  # line 0: the command
        res.update(ok=False, error=f"{e}: " + " | ".join(t[:300] for t in tail))
    print(f"{tag}: " + (f"{res['tokens_per_s']:,.0f} tokens/s, {res['peak_mem_gib']:.2f} GiB" if res["ok"]
                        else f"FAILED ({res['error']})") + f"  [{res['wall_s']:.0f} s]", flush=True)
    return res


def combine(results):
    """Per run over the repetitions: median tokens/s, step and fwd+bwd, largest memory."""
    out = {}
    for name in dict.fromkeys(r["run"] for r in results):
        rs = [r for r in results if r["run"] == name]
        ok = [r for r in rs if r["ok"]]
        if not ok:
            out[name] = {"ok": False, "error": rs[-1]["error"], "log": rs[-1]["log"]}
            continue
        c = {"ok": len(ok) == len(rs), "reps": len(ok),
             "tokens_per_s": statistics.median(r["tokens_per_s"] for r in ok),
             "tokens_per_s_range": [min(r["tokens_per_s"] for r in ok), max(r["tokens_per_s"] for r in ok)],
             "step_s": statistics.median(r["step_s"] for r in ok),
             "step_s_min": min(r["step_s_min"] for r in ok),
             "peak_mem_gib": max(r["peak_mem_gib"] for r in ok), "mem_kind": ok[0]["mem_kind"],
             "losses": ok[0]["losses"]}
        if "fwd_bwd_s" in ok[0]:
            c["fwd_bwd_s"] = statistics.median(r["fwd_bwd_s"] for r in ok)
            c["fwd_bwd_s_min"] = min(r["fwd_bwd_s_min"] for r in ok)
        if all("step_cpu_s_mean" in r for r in ok):
            c["step_cpu_s"] = statistics.median(r["step_cpu_s_mean"] for r in ok)
            if all("cpu_s" in r for r in ok):  # ciuic's (the peer times its steps itself)
                c["cpu_s"] = [r["cpu_s"] for r in ok]
                c["cpu_warmup_s"] = [r["cpu_warmup_s"] for r in ok]
        if "adapter_params" in ok[0]:
            c["adapter_params"] = ok[0]["adapter_params"]
        if not c["ok"]:
            c["error"] = next(r["error"] for r in rs if not r["ok"])
        out[name] = c
    return out


LABELS = {"ciuic-lora": "ciuic LoRA", "ciuic-qlora": "ciuic QLoRA (nf4 base)", "ciuic-full": "ciuic full fine-tune",
          "peft": "PEFT + transformers, eager", "peft-compile": "PEFT + transformers, layers compiled",
          "peft-qlora": "PEFT + bitsandbytes nf4 (QLoRA), eager"}


def summarize(a, s, comb, header):
    lines = [header, "", "| run | tokens/s (median step) | best step, tokens/s | step s | fwd+bwd s | CPU s/step | "
             "peak GiB | loss first → last | status |", "|---|---:|---:|---:|---:|---:|---:|---|---|"]
    tokens = a.micro_batch * a.seq
    for name, c in comb.items():
        if not c.get("tokens_per_s"):
            lines.append(f"| {LABELS[name]} | — | — | — | — | — | — | — | **failed**: {c['error'][:300]} (`{c['log']}`) |")
            continue
        fb = f"{c['fwd_bwd_s']:.4f}" if "fwd_bwd_s" in c else "—"
        cpu = f"{c['step_cpu_s']:.3f}" if "step_cpu_s" in c else "—"
        rng = c["tokens_per_s_range"]
        spread = f" ({rng[0]:,.0f}–{rng[1]:,.0f})" if c["reps"] > 1 else ""
        status = "ok" if c["ok"] else f"some reps failed: {c['error'][:120]}"
        lines.append(f"| {LABELS[name]} | {c['tokens_per_s']:,.0f}{spread} | {tokens / c['step_s_min']:,.0f} | "
                     f"{c['step_s']:.4f} | {fb} | {cpu} | {c['peak_mem_gib']:.2f} | {c['losses'][0]:.4f} → "
                     f"{c['losses'][-1]:.4f} | {status} |")
    lines.append("")
    ratios = {}

    def ratio(ours, peer, target_speed):
        o, p = comb.get(ours), comb.get(peer)
        if not o or not p or not o.get("tokens_per_s") or not p.get("tokens_per_s"):
            if o or p:
                lines.append(f"- {LABELS[ours]} / {LABELS[peer]}: no ratio (a side failed or did not run)")
            return
        sp, mem = o["tokens_per_s"] / p["tokens_per_s"], o["peak_mem_gib"] / p["peak_mem_gib"]
        best = p["step_s_min"] / o["step_s_min"]
        ratios[f"{ours}/{peer}"] = {"tokens_per_s": sp, "best_step": best, "peak_mem": mem}
        cpu = ""
        if "step_cpu_s" in o and "step_cpu_s" in p:
            ratios[f"{ours}/{peer}"]["cpu_time"] = p["step_cpu_s"] / o["step_cpu_s"]
            cpu = f", by CPU time per step: **{p['step_cpu_s'] / o['step_cpu_s']:.2f}×**"
        verdict = "met" if sp >= target_speed and mem <= 1.0 else "**not met**"
        lines.append(f"- {LABELS[ours]} / {LABELS[peer]}: **{sp:.2f}×** tokens/s (best steps: {best:.2f}×{cpu}) at "
                     f"**{mem:.2f}×** its peak memory (target ≥ {target_speed}× at ≤ 1.00×: {verdict})")

    ratio("ciuic-lora", "peft", 1.5)
    ratio("ciuic-lora", "peft-compile", 1.5)
    ratio("ciuic-qlora", "peft-qlora", 1.5)
    n_ad = adapter_params(s, a.r)
    share = 6 * n_ad / model_flops_per_token(s, a.seq)
    lo, full = comb.get("ciuic-lora"), comb.get("ciuic-full")
    if lo and full and lo.get("tokens_per_s") and full.get("tokens_per_s"):
        rel, rel_best = lo["step_s"] / full["fwd_bwd_s"], lo["step_s_min"] / full["fwd_bwd_s_min"]
        ratios["lora_step/full_fwd_bwd"] = {"ratio": rel, "best": rel_best, "allowed": 1 + share}
        verdict = "met" if rel <= 1 + share else "**not met**"
        lines.append(f"- ciuic LoRA step / the full model's forward+backward (same shape, batch, checkpointing): "
                     f"**{rel:.3f}** ({lo['step_s']:.4f} s / {full['fwd_bwd_s']:.4f} s; best steps {rel_best:.3f}); "
                     f"allowed ≤ {1 + share:.4f} (1 + the adapters' share of the FLOPs, 6 × {n_ad / 1e6:.1f}M adapter "
                     f"parameters per token): {verdict}. The LoRA step skips the base weights' gradients (a third "
                     f"of the full step's matmul FLOPs): about 2/3 is what the FLOPs allow.")
        if "step_cpu_s" in lo and "step_cpu_s" in full:
            lines.append(f"  By CPU time per step: LoRA {lo['step_cpu_s']:.3f} s / full {full['step_cpu_s']:.3f} s = "
                         f"{lo['step_cpu_s'] / full['step_cpu_s']:.3f} (the full step's includes its AdamW over every "
                         f"parameter).")
    peer_ad = next((c["adapter_params"] for c in comb.values() if c.get("adapter_params")), None)
    if peer_ad is not None and peer_ad != n_ad:
        lines.append(f"- note: PEFT trains {peer_ad:,} adapter parameters, the shape's all-linear count is {n_ad:,}")
    return lines, ratios


def write_summary(a, s, results):
    """summary.md and summary.json from every result so far (written after each run)."""
    n_base = s["layers"] * (2 * s["hidden"] ** 2 + 2 * s["hidden"] * s["kv_heads"] * (s["hidden"] // s["heads"])
                            + 3 * s["hidden"] * s["intermediate"] + 2 * s["hidden"]) + \
        s["vocab"] * s["hidden"] * (1 if s["tie"] else 2) + s["hidden"]
    header = (f"LoRA r={a.r} alpha={a.alpha:g} all-linear on the {a.shape} Llama shape ({n_base / 1e6:,.0f}M parameters, "
              f"{adapter_params(s, a.r) / 1e6:.1f}M adapter parameters), {a.device}, "
              f"{'bf16' if a.device == 'cuda' else 'fp32, %d threads' % a.threads}, micro-batch {a.micro_batch} × "
              f"seq {a.seq}, activation checkpointing {'on' if a.checkpointing else 'off'}, {a.warmup} warm-up + "
              f"{a.steps} measured steps, {a.reps} repetition(s) alternating; load average "
              f"{os.getloadavg()[0]:.1f} at the end")
    comb = combine(results)
    lines, ratios = summarize(a, s, comb, header)
    text = "\n".join(lines) + "\n"
    with open(os.path.join(a.out, "summary.md"), "w") as f:
        f.write(text)
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump({"args": vars(a), "shape": s, "results": results, "combined": comb, "ratios": ratios}, f, indent=1)
    return text


def main(argv=None):
    a = parse(argv)
    if not os.path.exists(a.ciuic_run):
        print(f"lora_speed.py: --ciuic-run {a.ciuic_run}: no such file", file=sys.stderr)
        return 2
    a.ciuic_run = os.path.abspath(a.ciuic_run)
    a.out = os.path.abspath(a.out)
    os.makedirs(a.out, exist_ok=True)
    s = SHAPES[a.shape]
    results = []
    prev = os.path.join(a.out, "summary.json")
    if a.append and os.path.exists(prev):  # an earlier call's runs (other names) stay in the table
        results = [r for r in json.load(open(prev))["results"] if r["run"] not in a.runs]
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), PYTHONUNBUFFERED="1")
    for rep in range(1, a.reps + 1):
        order = a.runs if rep % 2 else list(reversed(a.runs))
        for name in order:
            results.append(run_one(a, s, name, rep, env))
            text = write_summary(a, s, results)
    print(text)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
