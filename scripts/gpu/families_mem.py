#!/usr/bin/env python3
"""Per ciuic run of scripts/gpu/families.sh: median tokens/s after the first step, the caching
allocator's peaks (metrics mem_gib / mem_reserved_gib) and nvidia-smi's largest memory.used in
the run's window (smi.csv; the CUDA context and what bypasses the allocator included).
    python3 scripts/gpu/families_mem.py DIR      (DIR: /tmp/families or the unpacked families.tgz)
"""
import datetime
import glob
import json
import os
import statistics
import sys


def smi_rows(path):
    rows = []
    for line in open(path, errors="replace"):
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3 or not parts[1].endswith("MiB"):
            continue
        try:
            t = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
        except ValueError:
            continue
        rows.append((t, float(parts[1].split()[0]) / 1024, float(parts[2].split()[0]) / 1024))
    return rows


def main(d):
    smi = smi_rows(os.path.join(d, "smi.csv")) if os.path.exists(os.path.join(d, "smi.csv")) else []
    print("| run | tokens/s (median) | mem_gib | mem_reserved_gib | smi used GiB (max) | smi total GiB |")
    print("|---|---:|---:|---:|---:|---:|")
    for m in sorted(glob.glob(os.path.join(d, "*.metrics.jsonl"))):
        name = os.path.basename(m)[: -len(".metrics.jsonl")]
        recs = [json.loads(l) for l in open(m) if l.strip()]
        steps = [r for r in recs if "tokens_per_s" in r]
        tps = statistics.median(r["tokens_per_s"] for r in steps[1:]) if len(steps) > 1 else float("nan")
        mem = max((r.get("mem_gib", 0) for r in recs), default=float("nan"))
        res = max((r.get("mem_reserved_gib", 0) for r in recs), default=float("nan"))
        used, total = float("nan"), float("nan")
        w = os.path.join(d, name + ".window")
        if smi and os.path.exists(w):
            t = [float(x) for x in open(w).read().split()]
            inside = [r for r in smi if t[0] <= r[0] <= (t[1] if len(t) > 1 else 1e18)]
            if inside:
                used, total = max(r[1] for r in inside), inside[0][2]
        print(f"| {name} | {tps:,.0f} | {mem:.2f} | {res:.2f} | {used:.2f} | {total:.2f} |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/families")
