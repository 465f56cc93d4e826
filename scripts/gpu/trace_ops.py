#!/usr/bin/env python3
"""Attributes GPU kernel time in a ciuic profile trace to the CPU operators that launched it.

    scripts/gpu/trace_ops.py RUN/profile/rank0.trace.json [--kernels REGEX] [--top N] [--steps S]

The trace is the Chrome/Kineto JSON the trainer writes with `[log] profile_start_step`
(train/profile.cpp records input shapes). Each GPU kernel carries the "External id" of the ATen
operator that launched it; the operator's enclosing operators on the same thread (found by time
containment) give the call chain, e.g. `autograd::engine::evaluate_function: MmBackward0 >
aten::mm`. Kernels whose name matches --kernels (default: copies and casts) are grouped by
(kernel, chain, input shapes of the launching operator) and printed by GPU time, per profiled
step when --steps is given. Python standard library only.
"""
import argparse
import collections
import json
import re
import sys


def short(name, n=60):
    name = re.sub(r"<.*", "", name) if "<" in name and len(name) > n else name
    return name if len(name) <= n else name[: n - 1] + "…"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--kernels", default=r"copy|memcpy|cast|Memcpy|Memset|memset",
                    help="regex on kernel names (default: copies and casts)")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--steps", type=float, default=1.0, help="profiled steps (times are divided by it)")
    ap.add_argument("--depth", type=int, default=3, help="chain length kept (innermost operators)")
    args = ap.parse_args()

    with open(args.trace) as f:
        events = json.load(f)
    events = events.get("traceEvents", events) if isinstance(events, dict) else events

    ops_by_tid = collections.defaultdict(list)
    by_ext = {}
    kernels = []
    for e in events:
        if e.get("ph") != "X":
            continue
        cat = e.get("cat", "")
        if cat in ("cpu_op", "user_annotation", "python_function"):
            ops_by_tid[(e.get("pid"), e.get("tid"))].append(e)
            ext = e.get("args", {}).get("External id")
            if ext is not None and cat == "cpu_op":
                by_ext[ext] = e
        elif cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            kernels.append(e)

    # Parent of every operator: the innermost operator on its thread that contains it.
    parent = {}
    starts = {}
    for tid, ops in ops_by_tid.items():
        ops.sort(key=lambda o: (o["ts"], -o.get("dur", 0)))
        stack = []
        for o in ops:
            end = o["ts"] + o.get("dur", 0)
            while stack and stack[-1]["ts"] + stack[-1].get("dur", 0) < end:
                stack.pop()
            parent[id(o)] = stack[-1] if stack else None
            stack.append(o)
        starts[tid] = [o["ts"] for o in ops]

    pattern = re.compile(args.kernels)
    groups = collections.defaultdict(lambda: [0.0, 0])
    total = collections.defaultdict(float)
    unattributed = 0.0
    for k in kernels:
        dur = k.get("dur", 0) / 1000.0
        total["all"] += dur
        if not pattern.search(k.get("name", "")):
            continue
        total["matched"] += dur
        ext = k.get("args", {}).get("External id")
        op = by_ext.get(ext)
        if op is None:
            unattributed += dur
            key = (short(k["name"]), "(no operator)", "")
        else:
            chain = []
            o = op
            while o is not None and len(chain) < args.depth:
                chain.append(o["name"])
                o = parent.get(id(o))
            dims = op.get("args", {}).get("Input Dims", "")
            types = op.get("args", {}).get("Input type", "")
            key = (short(k["name"]), " < ".join(chain), f"{dims} {types}")
        groups[key][0] += dur
        groups[key][1] += 1

    s = args.steps
    print(f"GPU kernel time {total['all'] / s:.1f} ms/step; matching /{args.kernels}/: "
          f"{total['matched'] / s:.1f} ms/step ({unattributed / s:.1f} without an operator)")
    print(f"{'ms/step':>8} {'n/step':>7}  kernel | operator chain (innermost first) | input dims, types")
    for key, (ms, n) in sorted(groups.items(), key=lambda kv: -kv[1][0])[: args.top]:
        print(f"{ms / s:8.2f} {n / s:7.1f}  {key[0]} | {key[1]} | {key[2]}")


if __name__ == "__main__":
    sys.exit(main())
