#!/usr/bin/env python3
"""A/B harness: two training set-ups measured side by side, alternately, on the same machine.

    bench/ab.py RECIPE_A [RECIPE_B] [--a-set K=V]... [--b-set K=V]... [--set K=V]...
                [--reps N] [--steps M] [--nproc P] [--out DIR] [--names A,B] [--ciuic-run PATH]

A is RECIPE_A with the --set and --a-set overrides; B is RECIPE_B (default: RECIPE_A) with the
--set and --b-set overrides (e.g. `--b-set sharding.plugin=ddp`, `--b-set comm.transport=pcie`).
Each of the N repetitions runs A and B for M optimizer steps each, in the order AB, BA, AB, ...
(so that drift of the machine — clocks, other load, caches — hits both). Every run is a full
`ciuic-run` (launch, set-up, training; no checkpoints, no export) cut to M steps with the
recipe's learning-rate schedule unchanged (a schedule that ends at train.max_steps keeps the
recipe's max_steps as its length, so M may be shorter than its warm-up). From each run's metrics.jsonl
the harness takes the steady state: the median over its steps after the first (warm-up).

Output:
  - a table on the terminal: per metric, median and spread (min-max) over the repetitions for A
    and B, and the ratio B/A of the medians;
  - DIR/ab.json: the same, plus every run's figures;
  - DIR/ab.svg: a self-contained chart (tokens/s of every repetition for A and B, ratio);
  - DIR/ab-loss.svg: the loss curves (loss over steps) of every run of A and of B, to see that a
    faster side also trains the same (or how differently).

Exit status: 0; 2 on a usage error or when a run fails (naming the side, repetition and the run's
log file). Only the Python standard library is needed.
"""
import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time

# metric key in metrics.jsonl -> (label, how a run's steps are combined, better when)
METRICS = {
    "tokens_per_s": ("tokens/s (all ranks)", "median", "higher"),
    "step_s": ("step time, s", "median", "lower"),
    "fwd_bwd_s": ("forward+backward, s", "median", "lower"),
    "optim_s": ("optimizer phase, s", "median", "lower"),
    "optim_step_s": ("optimizer update after backward, s", "median", "lower"),
    "mfu": ("MFU", "median", "higher"),
    "mem_gib": ("peak GPU memory, GiB", "max", "lower"),
    "comm_busy_s": ("comm busy per step, s", "rate", "lower"),
}


class HarnessError(Exception):
    pass


def default_ciuic_run():
    here = os.path.dirname(os.path.abspath(__file__))
    for cand in (os.path.join(here, "..", "build", "bin", "ciuic-run"), shutil.which("ciuic-run")):
        if cand and os.path.exists(cand):
            return os.path.abspath(cand)
    return None


def schedule_overrides(args, recipe, overrides):
    """A run cut to --steps keeps the recipe's learning-rate schedule. A schedule that ends at
    train.max_steps (warmup_decay or warmup_cosine with total_num_steps = 0) would otherwise be
    squeezed into --steps, or refused when --steps is shorter than its warm-up: it gets the
    recipe's own max_steps as total_num_steps. The resolved recipe comes from
    `ciuic-run --print-recipe`; when that fails, the run itself reports the problem."""
    try:
        import tomllib
    except ImportError:  # Python < 3.11: runs as before
        return []
    cmd = [args.ciuic_run, recipe, "--print-recipe"]
    for o in overrides:
        cmd += ["--set", o]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return []
    try:
        resolved = tomllib.loads(p.stdout)
    except tomllib.TOMLDecodeError:
        return []
    sched = resolved.get("scheduler", {})
    max_steps = resolved.get("train", {}).get("max_steps")
    if (sched.get("type") in ("warmup_decay", "warmup_cosine") and not sched.get("total_num_steps")
            and isinstance(max_steps, int) and max_steps > 0):
        return [f"scheduler.total_num_steps={max_steps}"]
    return []


def run_once(args, side, rep, recipe, overrides, out_dir, schedule=()):
    run_dir = os.path.join(out_dir, f"{side}-{rep}")
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    cmd = [args.ciuic_run, recipe,
           "--set", f"train.max_steps={args.steps}",
           *[x for o in schedule for x in ("--set", o)],
           "--set", "log.every_steps=1",
           "--set", 'log.progress="off"',
           "--set", f'run.output_dir="{run_dir}"',
           "--set", "checkpoint.every_steps=0",
           "--set", "checkpoint.save_final=false",
           "--set", "checkpoint.export_hf=false"]
    if args.nproc:
        cmd += ["--nproc", str(args.nproc)]
    for o in overrides:
        cmd += ["--set", o]
    log = os.path.join(run_dir, "log.txt")
    t0 = time.monotonic()
    with open(log, "w") as f:
        f.write(" ".join(cmd) + "\n")
        f.flush()
        rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT)
    wall = time.monotonic() - t0
    if rc != 0:
        tail = open(log).read().strip().splitlines()[-5:]
        raise HarnessError(f"{side} (repetition {rep + 1}) failed with exit code {rc}; log: {log}\n  "
                           + "\n  ".join(tail))
    recs = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl")) if l.strip()]
    steps = [r for r in recs if "event" not in r and "step" in r]
    if len(steps) < 2:
        raise HarnessError(f"{side} (repetition {rep + 1}): fewer than 2 logged steps in "
                           f"{run_dir}/metrics.jsonl (use --steps >= 2)")
    steady = steps[1:]
    figures = {"wall_s": wall,
               "loss_curve": [[r["step"], r["loss"]] for r in steps if isinstance(r.get("loss"), (int, float))]}
    for key, (_, how, _) in METRICS.items():
        vals = [r[key] for r in steady if isinstance(r.get(key), (int, float))]
        if how == "rate":  # a cumulative counter: its increase per step
            pts = [(r["step"], r[key]) for r in steps if isinstance(r.get(key), (int, float))]
            if len(pts) >= 2 and pts[-1][0] > pts[0][0]:
                figures[key] = (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])
        elif vals:
            figures[key] = max(vals) if how == "max" else statistics.median(vals)
    return figures


def summarise(runs):
    out = {}
    for key in METRICS:
        vals = [r[key] for r in runs if key in r]
        if vals:
            out[key] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}
    return out


def fmt(v):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    a = abs(v)
    if a == 0:
        return "0"
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 0.01:
        return f"{v:.3f}"
    return f"{v:.2e}"


def table(names, summary):
    a, b = names
    rows = [("metric", f"{a} median (min-max)", f"{b} median (min-max)", f"{b}/{a}")]
    for key, (label, _, better) in METRICS.items():
        sa, sb = summary[a].get(key), summary[b].get(key)
        if not sa and not sb:
            continue
        cell = lambda s: "-" if not s else f"{fmt(s['median'])} ({fmt(s['min'])}-{fmt(s['max'])})"
        ratio = sb["median"] / sa["median"] if sa and sb and sa["median"] else None
        rows.append((f"{label} ({better} is better)", cell(sa), cell(sb), "-" if ratio is None else f"{ratio:.3f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = []
    for n, r in enumerate(rows):
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def svg_chart(names, runs, summary, title):
    """Grouped bars: tokens/s of each repetition for A and B, medians as lines, ratio in the title."""
    a, b = names
    key = "tokens_per_s"
    va = [r.get(key, 0.0) for r in runs[a]]
    vb = [r.get(key, 0.0) for r in runs[b]]
    top = max(va + vb + [1e-9]) * 1.15
    W, H, L, R, T, B = 640, 360, 70, 20, 50, 50
    pw, ph = W - L - R, H - T - B
    n = len(va)
    group = pw / max(n, 1)
    bar = group * 0.35
    colors = {a: "#4e79a7", b: "#f28e2b"}
    y = lambda v: T + ph - v / top * ph
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
             f'font-family="sans-serif" font-size="12">',
             f'<rect width="{W}" height="{H}" fill="white"/>']
    ratio = ""
    if summary[a].get(key) and summary[b].get(key) and summary[a][key]["median"]:
        ratio = f" — {b}/{a} = {summary[b][key]['median'] / summary[a][key]['median']:.3f}"
    parts.append(f'<text x="{W / 2}" y="22" text-anchor="middle" font-size="14">'
                 f'{escape(title)}: tokens/s per repetition{escape(ratio)}</text>')
    for i in range(5):  # y grid
        v = top * i / 4
        parts.append(f'<line x1="{L}" x2="{W - R}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#ddd"/>')
        parts.append(f'<text x="{L - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{fmt(v)}</text>')
    for i in range(n):
        x0 = L + i * group + group * 0.15
        for j, (name, vals) in enumerate(((a, va), (b, vb))):
            x = x0 + j * bar
            parts.append(f'<rect x="{x:.1f}" y="{y(vals[i]):.1f}" width="{bar:.1f}" '
                         f'height="{T + ph - y(vals[i]):.1f}" fill="{colors[name]}"/>')
        parts.append(f'<text x="{x0 + bar:.1f}" y="{T + ph + 16}" text-anchor="middle">rep {i + 1}</text>')
    for name in (a, b):
        s = summary[name].get(key)
        if s:
            parts.append(f'<line x1="{L}" x2="{W - R}" y1="{y(s["median"]):.1f}" y2="{y(s["median"]):.1f}" '
                         f'stroke="{colors[name]}" stroke-dasharray="4 3"/>')
    for j, name in enumerate((a, b)):
        lx = L + j * 200
        parts.append(f'<rect x="{lx}" y="{H - 22}" width="12" height="12" fill="{colors[name]}"/>')
        parts.append(f'<text x="{lx + 18}" y="{H - 12}">{escape(name)} (dashed: median)</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def svg_loss_chart(names, runs, title):
    """Loss over steps: one line per run, A's in blue and B's in orange (repetitions overlaid)."""
    colors = dict(zip(names, ("#4e79a7", "#f28e2b")))
    curves = [(n, i, [(s, l) for s, l in r.get("loss_curve", []) if math.isfinite(l)])
              for n in names for i, r in enumerate(runs[n])]
    pts = [p for _, _, c in curves for p in c]
    W, H, L, R, T, B = 640, 360, 70, 20, 50, 50
    pw, ph = W - L - R, H - T - B
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
             f'font-family="sans-serif" font-size="12">',
             f'<rect width="{W}" height="{H}" fill="white"/>',
             f'<text x="{W / 2}" y="22" text-anchor="middle" font-size="14">{escape(title)}: loss per step</text>']
    if pts:
        x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
        y0, y1 = min(p[1] for p in pts), max(p[1] for p in pts)
        if x1 == x0:
            x0, x1 = x0 - 1, x1 + 1
        pad = (y1 - y0) * 0.05 or abs(y0) * 0.05 or 1.0
        y0, y1 = y0 - pad, y1 + pad
        x = lambda s: L + (s - x0) / (x1 - x0) * pw
        y = lambda v: T + ph - (v - y0) / (y1 - y0) * ph
        for i in range(5):
            v = y0 + (y1 - y0) * i / 4
            parts.append(f'<line x1="{L}" x2="{W - R}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#ddd"/>')
            parts.append(f'<text x="{L - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{fmt(v)}</text>')
        for s in sorted({x0, x1, round((x0 + x1) / 2)}):
            parts.append(f'<text x="{x(s):.1f}" y="{T + ph + 16}" text-anchor="middle">{fmt(s)}</text>')
        parts.append(f'<text x="{L + pw / 2}" y="{T + ph + 32}" text-anchor="middle">step</text>')
        for name, rep, c in curves:
            if c:
                line = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in c)
                parts.append(f'<polyline data-side="{escape(name)}" data-rep="{rep + 1}" points="{line}" '
                             f'fill="none" stroke="{colors[name]}" stroke-width="1.5" stroke-opacity="0.8"/>')
    else:
        parts.append(f'<text x="{W / 2}" y="{H / 2}" text-anchor="middle">no loss logged</text>')
    for j, name in enumerate(names):
        lx = L + j * 200
        parts.append(f'<rect x="{lx}" y="{H - 12}" width="12" height="4" fill="{colors[name]}"/>')
        parts.append(f'<text x="{lx + 18}" y="{H - 6}">{escape(name)} (every repetition)</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def escape(s):
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="Example: bench/ab.py configs/llama-1b-bench.toml --nproc 2 "
                                       "--b-set comm.transport=pcie --names nvlink,pcie",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("recipe_a")
    p.add_argument("recipe_b", nargs="?")
    p.add_argument("--set", dest="common", action="append", default=[], metavar="K=V",
                   help="override for both sides (repeatable)")
    p.add_argument("--a-set", action="append", default=[], metavar="K=V", help="override for A")
    p.add_argument("--b-set", action="append", default=[], metavar="K=V", help="override for B")
    p.add_argument("--reps", type=int, default=3, help="repetitions of the pair (default 3)")
    p.add_argument("--steps", type=int, default=10, help="optimizer steps per run (default 10)")
    p.add_argument("--nproc", type=int, default=0, help="workers per run (default: the recipes')")
    p.add_argument("--out", default="runs/ab", help="output folder (default runs/ab)")
    p.add_argument("--names", default="A,B", help="names of the two sides, comma-separated")
    p.add_argument("--ciuic-run", default=default_ciuic_run(), help="the ciuic-run program")
    args = p.parse_args(argv)
    try:
        if not args.ciuic_run or not os.path.exists(args.ciuic_run):
            raise HarnessError("ciuic-run not found: build it (make) or pass --ciuic-run PATH")
        if args.reps < 1 or args.steps < 2:
            raise HarnessError("--reps must be >= 1 and --steps >= 2 (the first step is warm-up)")
        names = [n.strip() for n in args.names.split(",")]
        if len(names) != 2 or not all(names) or names[0] == names[1]:
            raise HarnessError(f"--names must be two different names separated by a comma, got {args.names!r}")
        recipe_b = args.recipe_b or args.recipe_a
        for r in (args.recipe_a, recipe_b):
            if not os.path.isfile(r):
                raise HarnessError(f"recipe {r}: no such file")
        if not args.recipe_b and not args.a_set and not args.b_set:
            raise HarnessError("A and B would be the same run: give RECIPE_B, --a-set or --b-set")
        sides = {names[0]: (args.recipe_a, args.common + args.a_set),
                 names[1]: (recipe_b, args.common + args.b_set)}
        os.makedirs(args.out, exist_ok=True)
        schedules = {n: schedule_overrides(args, *sides[n]) for n in names}  # once per side
        runs = {n: [] for n in names}
        for rep in range(args.reps):
            order = names if rep % 2 == 0 else names[::-1]
            for side in order:
                recipe, overrides = sides[side]
                print(f"[ab] repetition {rep + 1}/{args.reps}: {side}", file=sys.stderr, flush=True)
                runs[side].append(run_once(args, side, rep, recipe, overrides, args.out, schedules[side]))
    except HarnessError as e:
        print(f"ab: error: {e}", file=sys.stderr)
        return 2
    summary = {n: summarise(runs[n]) for n in names}
    print(table(names, summary))
    result = {"names": names, "reps": args.reps, "steps": args.steps,
              "sides": {n: {"recipe": sides[n][0], "overrides": sides[n][1]} for n in names},
              "runs": runs, "summary": summary,
              "ratio_b_over_a": {k: summary[names[1]][k]["median"] / summary[names[0]][k]["median"]
                                 for k in METRICS
                                 if k in summary[names[0]] and k in summary[names[1]]
                                 and summary[names[0]][k]["median"]}}
    with open(os.path.join(args.out, "ab.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(args.out, "ab.svg"), "w") as f:
        f.write(svg_chart(names, runs, summary, f"{names[0]} vs {names[1]}"))
    with open(os.path.join(args.out, "ab-loss.svg"), "w") as f:
        f.write(svg_loss_chart(names, runs, f"{names[0]} vs {names[1]}"))
    print(f"\n[ab] {args.out}/ab.json, {args.out}/ab.svg, {args.out}/ab-loss.svg", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
