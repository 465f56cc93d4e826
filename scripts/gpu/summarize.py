#!/usr/bin/env python3
"""Summarises a GPU suite's output folder (scripts/gpu/run-suite.sh) as a Markdown table.

ciuic runs: <name>.metrics.jsonl (steady state = median over logged windows after the first,
which holds start-up and warm-up). Peer runs: <name>.json from bench/peers/fsdp2_llama.py.
"""
import glob
import json
import os
import statistics
import sys


def ciuic_row(path):
    recs = [json.loads(l) for l in open(path) if l.strip()]
    steps = [r for r in recs if "tokens_per_s" in r and "event" not in r]
    end = next((r for r in recs if r.get("event") == "end"), {})
    if not steps:
        return None
    steady = steps[1:] or steps
    world = end.get("world_size") or steps[-1].get("world_size", 1)
    tps = statistics.median(r["tokens_per_s"] for r in steady)
    row = {"tokens/s per GPU": tps / world, "world": world,
           "MFU": statistics.median(r.get("mfu", float("nan")) for r in steady),
           "peak GiB": max(r.get("mem_gib", 0) for r in steps),
           "loss": steps[-1]["loss"]}
    for k in ("fwd_bwd_s", "optim_s", "step_s", "optim_update_s", "optim_copy_wait_s", "comm_busy_s",
              "step_drain_s", "step_norm_s", "step_update_s", "step_publish_s",
              "grad_host_fold_s", "grad_host_blocked_s"):
        vals = [r[k] for r in steady if k in r]
        if vals:
            row[k] = statistics.median(vals)
    return row


def peer_row(path):
    r = json.load(open(path))
    return {"tokens/s per GPU": r["tokens_per_s_per_gpu"], "world": r["world"], "MFU": r["mfu"],
            "peak GiB": r["peak_mem_gib"], "loss": r["loss"], "step_s": r["step_s_median"]}


def main(out):
    rows = {}
    for p in sorted(glob.glob(os.path.join(out, "*.metrics.jsonl"))):
        r = ciuic_row(p)
        if r:
            rows[os.path.basename(p)[: -len(".metrics.jsonl")]] = r
    for p in sorted(glob.glob(os.path.join(out, "*.json"))):
        r = json.load(open(p))
        if isinstance(r, dict) and r.get("peer"):  # bench/peers output (not parity.json)
            rows[os.path.basename(p)[:-5]] = peer_row(p)
    cols = ["world", "tokens/s per GPU", "MFU", "peak GiB", "step_s", "fwd_bwd_s", "optim_s",
            "step_drain_s", "step_norm_s", "step_update_s", "step_publish_s",
            "optim_update_s", "optim_copy_wait_s", "grad_host_fold_s", "grad_host_blocked_s",
            "loss"]
    print("| run | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for name, r in rows.items():
        cells = []
        for c in cols:
            v = r.get(c)
            if v is None:
                cells.append("")
            elif c == "MFU":
                cells.append(f"{100 * v:.1f}%")
            elif c == "tokens/s per GPU":
                cells.append(f"{v:,.0f}")
            elif isinstance(v, float):
                cells.append(f"{v:.3g}")
            else:
                cells.append(str(v))
        print(f"| {name} | " + " | ".join(cells) + " |")
    # Ratios of each ciuic run to its peer (same suffix).
    for name, r in rows.items():
        if name.startswith("fsdp2-"):
            continue
        suffix = name.split("-", 1)[1] if "-" in name else name
        peer = rows.get("fsdp2-" + suffix)
        if peer:
            print(f"\n{name} / fsdp2-{suffix}: tokens/s ratio "
                  f"{r['tokens/s per GPU'] / peer['tokens/s per GPU']:.3f}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
