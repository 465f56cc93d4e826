#!/usr/bin/env python3
"""Accuracy cost of reducing gradients across ranks in bf16 instead of fp32 (issue 14), or of
any other recipe setting against a reference (--key, --values).

    python3 bench/reduce_dtype_study.py CIUIC_RUN OUT_DIR [--recipe R] [--steps N]
            [--eval-every K] [--seeds S1,S2] [--key K --values REF,OTHER] [--set K=V ...]
            [--analyze-only]

What it measures: the demo recipe (configs/tiny-cpu.toml: a 0.8M-parameter Llama trained from
scratch on the synthetic arithmetic / unit-conversion chat data of examples/demo, 3 CPU ranks over
gloo, ZeRO-2) is trained with the `bf16` precision plugin (bf16 parameters and compute, fp32
master weights) twice per seed, once with `[precision] reduce_dtype = "fp32"` (gradients summed
across ranks in fp32) and once with `reduce_dtype = "bf16"` (summed in bf16). Everything
else (data, data order, initialisation, schedule) is identical between the two settings of a
seed, and a ciuic CPU run is deterministic, so any difference between them comes from the
reduction dtype. For comparison the same figures between seeds show the run-to-run spread that
is not caused by the reduction.

Each run is `CIUIC_RUN RECIPE --set precision.plugin="bf16" --set precision.reduce_dtype=...
--set run.seed=S --set run.output_dir=OUT_DIR/<setting>-seed<S> --set train.max_steps=N
--set train.eval_every_steps=K --set log.every_steps=1 --overwrite` (the rest of the recipe
unchanged). The demo data is generated first (examples/demo/gen_demo_data.py runs/demo-data)
when it is missing.

Output (from every run's metrics.jsonl):
  - a markdown table on stdout (also OUT_DIR/summary.md): per setting and seed the final train
    loss (mean of the last 20 logged steps), the final eval loss, exact-match accuracy after
    training, tokens/s, communication bytes per step and wall time; the eval loss at every eval
    point; the relative difference of the final eval loss bf16 vs fp32 (mean over seeds, and per
    seed) next to the seed-to-seed spread of each setting;
  - OUT_DIR/eval_loss.svg: eval loss against step for every run (hand-written SVG);
  - OUT_DIR/study.json: the figures of every run.

Another setting (`--key sharding.grad_accumulation --values reduce_each,no_sync`): the two runs
of a seed take `--set KEY="REF"` and `--set KEY="OTHER"` in place of reduce_dtype (the bf16 plugin
and every other setting as above); REF is the reference the differences are taken against.

Fine-tuning variant (`--set`, repeatable, adds recipe settings to every run): start every run from
the same trained model (`--set model.path="DIR"`, an HF folder ciuic exported) at a fine-tuning
learning rate; then the two settings of a seed differ only by the reduction, from a model that
has already converged, as in the seeds' use.

Exit status: 0; 1 when a run fails (its log is OUT_DIR/<run>.log); 2 on a usage error.
Python standard library only.
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

KEY = "precision.reduce_dtype"  # the recipe key studied (--key)
SETTINGS = ("fp32", "bf16")      # its values (--values): the reference first
LAST_N = 20                  # final train loss: mean of the last LAST_N logged steps
REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def run_name(setting, seed):
    return f"reduce-{setting}-seed{seed}" if KEY == "precision.reduce_dtype" else f"{setting}-seed{seed}"


def ensure_demo_data():
    data = os.path.join(REPO, "runs", "demo-data")
    if os.path.exists(os.path.join(data, "train.jsonl")) and os.path.exists(os.path.join(data, "eval.jsonl")):
        return
    print(f"generating the demo data into {data}", flush=True)
    subprocess.run([sys.executable, os.path.join(REPO, "examples", "demo", "gen_demo_data.py"), data],
                   cwd=REPO, check=True)


def run_one(args, setting, seed):
    name = run_name(setting, seed)
    out = os.path.join(args.out_dir, name)
    log = os.path.join(args.out_dir, name + ".log")
    cmd = [args.ciuic_run, args.recipe,
           "--set", 'precision.plugin="bf16"',
           "--set", f'{KEY}="{setting}"',
           "--set", f"run.seed={seed}",
           "--set", f"run.output_dir={json.dumps(out)}",
           "--set", f"train.max_steps={args.steps}",
           "--set", f"train.eval_every_steps={args.eval_every}",
           "--set", "log.every_steps=1"]
    for kv in args.set:
        cmd += ["--set", kv]
    cmd.append("--overwrite")
    print(f"[{name}] {' '.join(cmd)}", flush=True)
    t0 = time.monotonic()
    with open(log, "w") as f:
        f.write("# " + " ".join(cmd) + "\n")
        f.flush()
        rc = subprocess.run(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT).returncode
    wall = time.monotonic() - t0
    print(f"[{name}] exit {rc}, {wall:.1f} s", flush=True)
    if rc != 0:
        print(f"error: run {name} failed with exit status {rc}; see {log}", file=sys.stderr)
        sys.exit(1)
    return wall


def read_run(out_dir, setting, seed):
    name = run_name(setting, seed)
    path = os.path.join(out_dir, name, "metrics.jsonl")
    steps, evals, em_after, end = [], {}, None, None
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            r = json.loads(line)
            ev = r.get("event")
            if ev is None and "loss" in r:
                steps.append(r)
            elif ev == "eval":
                evals[r["step"]] = r["eval_loss"]
            elif ev == "exact_match" and r.get("when") == "after":
                em_after = r
            elif ev == "end":
                end = r
    if not steps or not evals or end is None:
        raise SystemExit(f"error: {path} is incomplete (no step, eval or end record)")
    last_step = steps[-1]["step"]
    tail = steps[-LAST_N:]
    tps = [r["tokens_per_s"] for r in steps[1:] if "tokens_per_s" in r]
    comm = None
    if len(steps) > 1 and "comm_bytes" in steps[-1] and "comm_bytes" in steps[0]:
        comm = (steps[-1]["comm_bytes"] - steps[0]["comm_bytes"]) / (steps[-1]["step"] - steps[0]["step"])
    return {
        "name": name, "setting": setting, "seed": seed, "steps": last_step,
        "final_train_loss": statistics.fmean(r["loss"] for r in tail),
        "train_loss": [(r["step"], r["loss"]) for r in steps],
        "evals": sorted(evals.items()),
        "final_eval_loss": evals[max(evals)],
        "final_eval_step": max(evals),
        "exact_match": em_after["accuracy"] if em_after else None,
        "exact_match_questions": em_after["questions"] if em_after else None,
        "tokens_per_s_run": end.get("tokens_per_s"),
        "tokens_per_s_step_median": statistics.median(tps) if tps else None,
        "comm_bytes_per_step": comm,
        "elapsed_s": end.get("elapsed_s"),
    }


def rel(a, b):
    return (a - b) / b


def pct(x, digits=3):
    return f"{x * 100:+.{digits}f}%"


def spread(vals):
    """(max - min) / mean of the values: relative seed-to-seed spread."""
    return (max(vals) - min(vals)) / statistics.fmean(vals)


def summarize(runs, seeds, args, walls):
    by = {(r["setting"], r["seed"]): r for r in runs}
    ref, alt = SETTINGS
    name = KEY.split(".")[-1]
    lines = []
    add = lines.append
    add(f"Setup: `{os.path.relpath(args.recipe, REPO)}` with precision.plugin=\"bf16\", "
        f"{runs[0]['steps']} steps, eval every {args.eval_every} steps, seeds {', '.join(map(str, seeds))}.")
    add("")
    add(f"| {KEY.split('.')[-1]} | seed | final train loss (mean of last 20 steps) | final eval loss "
        "| exact match after | tokens/s (run) | tokens/s (median step) | comm MB/step | wall s |")
    add("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for s in SETTINGS:
        for seed in seeds:
            r = by[(s, seed)]
            em = (f"{r['exact_match'] * 100:.1f}% ({round(r['exact_match'] * r['exact_match_questions'])}"
                  f"/{r['exact_match_questions']})") if r["exact_match"] is not None else "–"
            comm = f"{r['comm_bytes_per_step'] / 1e6:.2f}" if r["comm_bytes_per_step"] else "–"
            wall = f"{walls[r['name']]:.0f}" if walls.get(r["name"]) else "–"
            add(f"| {s} | {seed} | {r['final_train_loss']:.5f} | {r['final_eval_loss']:.5f} | {em} "
                f"| {r['tokens_per_s_run']:,.0f} | {r['tokens_per_s_step_median']:,.0f} | {comm} | {wall} |")
    add("")
    # eval loss at every eval point
    eval_steps = sorted({st for r in runs for st, _ in r["evals"]})
    cols = [(s, seed) for s in SETTINGS for seed in seeds]
    add("Eval loss at every eval point:")
    add("")
    add("| step | " + " | ".join(f"{s} s{seed}" for s, seed in cols) +
        f" | {alt} vs {ref} (mean over seeds) |")
    add("|---:|" + "---:|" * (len(cols) + 1))
    for st in eval_steps:
        vals = {c: dict(by[c]["evals"]).get(st) for c in cols}
        cells = [f"{vals[c]:.5f}" if vals[c] is not None else "–" for c in cols]
        m = {s: [vals[(s, seed)] for seed in seeds if vals[(s, seed)] is not None] for s in SETTINGS}
        d = pct(rel(statistics.fmean(m[alt]), statistics.fmean(m[ref]))) \
            if m[alt] and m[ref] and len(m[alt]) == len(m[ref]) else "–"
        add(f"| {st} | " + " | ".join(cells) + f" | {d} |")
    add("")
    # headline
    fin = {s: [by[(s, seed)]["final_eval_loss"] for seed in seeds] for s in SETTINGS}
    trn = {s: [by[(s, seed)]["final_train_loss"] for seed in seeds] for s in SETTINGS}
    emv = {s: [by[(s, seed)]["exact_match"] for seed in seeds] for s in SETTINGS}
    head = {
        "final_eval_loss_mean": {s: statistics.fmean(fin[s]) for s in SETTINGS},
        "rel_diff_final_eval_loss_mean": rel(statistics.fmean(fin[alt]), statistics.fmean(fin[ref])),
        "rel_diff_final_eval_loss_per_seed": {seed: rel(by[(alt, seed)]["final_eval_loss"],
                                                        by[(ref, seed)]["final_eval_loss"]) for seed in seeds},
        "rel_diff_final_train_loss_mean": rel(statistics.fmean(trn[alt]), statistics.fmean(trn[ref])),
        "seed_spread_final_eval_loss": {s: spread(fin[s]) for s in SETTINGS} if len(seeds) > 1 else None,
        "seed_spread_final_train_loss": {s: spread(trn[s]) for s in SETTINGS} if len(seeds) > 1 else None,
    }
    add("| figure | value |")
    add("|---|---:|")
    add(f"| final eval loss, mean over seeds: {ref} / {alt} | "
        f"{head['final_eval_loss_mean'][ref]:.5f} / {head['final_eval_loss_mean'][alt]:.5f} |")
    add(f"| **relative difference of the final eval loss, {alt} vs {ref} (mean over seeds)** | "
        f"**{pct(head['rel_diff_final_eval_loss_mean'])}** |")
    for seed in seeds:
        add(f"| ... seed {seed} alone | {pct(head['rel_diff_final_eval_loss_per_seed'][seed])} |")
    add(f"| relative difference of the final train loss, {alt} vs {ref} (mean over seeds) | "
        f"{pct(head['rel_diff_final_train_loss_mean'])} |")
    if head["seed_spread_final_eval_loss"]:
        for s in SETTINGS:
            add(f"| seed-to-seed spread of the final eval loss, {name}={s} ((max-min)/mean) | "
                f"{head['seed_spread_final_eval_loss'][s] * 100:.3f}% |")
        for s in SETTINGS:
            add(f"| seed-to-seed spread of the final train loss, {name}={s} | "
                f"{head['seed_spread_final_train_loss'][s] * 100:.3f}% |")
    add(f"| exact match after training, mean over seeds: {ref} / {alt} | "
        f"{statistics.fmean(emv[ref]) * 100:.1f}% / {statistics.fmean(emv[alt]) * 100:.1f}% |")
    same = all(by[(ref, seed)]["train_loss"] == by[(alt, seed)]["train_loss"] for seed in seeds)
    if same:
        add("")
        add("WARNING: the two settings produced bit-identical train losses: {KEY} did not take effect.")
    head["identical_losses"] = same
    return "\n".join(lines), head


# ---------------------------------------------------------------------------------------- SVG

COLORS = (["#1f5fbf", "#6fa8ff"], ["#d9480f", "#ffa94d"])  # the reference, the other setting
DASH = ("", "6,4")


def esc(s):
    return str(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def nice_ticks(lo, hi, n=5):
    span = hi - lo
    if span <= 0:
        return [lo]
    raw = span / n
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw), default=10 * mag)
    t = math.ceil(lo / step) * step
    out = []
    while t <= hi + step * 1e-9:
        out.append(round(t, 10))
        t += step
    return out


def panel(x0, y0, w, h, series, xr, yr, logy, title, ylabel):
    """One chart: series = [(label, color, dash, [(x, y)...])]."""
    ml, mr, mt, mb = 62, 12, 28, 40
    pw, ph = w - ml - mr, h - mt - mb
    ylo, yhi = yr
    f = (lambda v: math.log10(v)) if logy else (lambda v: v)
    fy0, fy1 = f(ylo), f(yhi)

    def X(v):
        return x0 + ml + (v - xr[0]) / (xr[1] - xr[0]) * pw

    def Y(v):
        return y0 + mt + ph - (f(v) - fy0) / (fy1 - fy0) * ph

    o = [f'<text x="{x0 + ml + pw / 2:.1f}" y="{y0 + 17}" text-anchor="middle" font-size="13" '
         f'font-weight="bold">{esc(title)}</text>',
         f'<rect x="{x0 + ml}" y="{y0 + mt}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>']
    if logy:
        yt = [v for v in (0.5, 0.7, 1, 1.5, 2, 3, 4, 6, 8, 10) if ylo <= v <= yhi]
    else:
        yt = nice_ticks(ylo, yhi, 6)
    for v in yt:
        o.append(f'<line x1="{x0 + ml}" x2="{x0 + ml + pw}" y1="{Y(v):.1f}" y2="{Y(v):.1f}" stroke="#e4e4e4"/>')
        o.append(f'<text x="{x0 + ml - 5}" y="{Y(v) + 4:.1f}" text-anchor="end" font-size="11">{v:g}</text>')
    for v in nice_ticks(xr[0], xr[1], 8):
        o.append(f'<line x1="{X(v):.1f}" x2="{X(v):.1f}" y1="{y0 + mt}" y2="{y0 + mt + ph}" stroke="#f0f0f0"/>')
        o.append(f'<text x="{X(v):.1f}" y="{y0 + mt + ph + 15}" text-anchor="middle" font-size="11">{v:g}</text>')
    o.append(f'<text x="{x0 + ml + pw / 2:.1f}" y="{y0 + h - 6}" text-anchor="middle" font-size="12">step</text>')
    o.append(f'<text x="{x0 + 14}" y="{y0 + mt + ph / 2:.1f}" text-anchor="middle" font-size="12" '
             f'transform="rotate(-90 {x0 + 14} {y0 + mt + ph / 2:.1f})">{esc(ylabel)}</text>')
    for _, color, dash, pts in series:
        pts = [(x, y) for x, y in pts if xr[0] <= x <= xr[1]]
        if not pts:
            continue
        d = " ".join(f"{X(x):.1f},{Y(y):.1f}" for x, y in pts)
        da = f' stroke-dasharray="{dash}"' if dash else ""
        o.append(f'<polyline points="{d}" fill="none" stroke="{color}" stroke-width="1.8"{da}/>')
        for x, y in pts:
            o.append(f'<circle cx="{X(x):.1f}" cy="{Y(y):.1f}" r="2.4" fill="{color}"/>')
    return o


def write_svg(runs, seeds, path):
    series = []
    for k, s in enumerate(SETTINGS):
        for i, seed in enumerate(seeds):
            r = next(r for r in runs if r["setting"] == s and r["seed"] == seed)
            series.append((f"{KEY.split('.')[-1]}={s}, seed {seed}", COLORS[k][i % 2], DASH[k], r["evals"]))
    allx = [x for *_, pts in series for x, _ in pts]
    ally = [y for *_, pts in series for _, y in pts]
    xmax = max(allx)
    W, H = 1000, 420
    per_row = 3  # legend entries per row (300 px each)
    rows = (len(series) + per_row - 1) // per_row
    total_h = H + 40 + 20 * rows
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{total_h}" '
         f'viewBox="0 0 {W} {total_h}" font-family="sans-serif">',
         f'<rect width="{W}" height="{total_h}" fill="white"/>']
    o += panel(0, 0, W / 2, H, series, (0, xmax), (min(ally) * 0.95, max(ally) * 1.05), True,
               "Eval loss, whole run (log scale)", "eval loss")
    # zoom: from the first eval point at or after 1/4 of the run
    zx0 = min((x for x in sorted(set(allx)) if x >= xmax / 4), default=0)
    zy = [y for *_, pts in series for x, y in pts if x >= zx0]
    pad = (max(zy) - min(zy)) * 0.08 or 0.01
    o += panel(W / 2, 0, W / 2, H, series, (zx0, xmax), (min(zy) - pad, max(zy) + pad), False,
               f"Eval loss from step {zx0:g} (linear)", "eval loss")
    # legend
    lx, ly = 70, H + 20
    for i, (label, color, dash, _) in enumerate(series):
        x = lx + (i % per_row) * 300
        y = ly + (i // per_row) * 20
        da = f' stroke-dasharray="{dash}"' if dash else ""
        o.append(f'<line x1="{x}" x2="{x + 30}" y1="{y}" y2="{y}" stroke="{color}" stroke-width="2.5"{da}/>')
        o.append(f'<text x="{x + 36}" y="{y + 4}" font-size="12">{esc(label)}</text>')
    what = ("gradients reduced across 3 ranks in fp32 (solid) or bf16 (dashed)" if KEY == "precision.reduce_dtype"
            else f"{KEY} = {SETTINGS[0]} (solid) or {SETTINGS[1]} (dashed)")
    o.append(f'<text x="{lx}" y="{ly + 20 * rows + 8}" font-size="11" fill="#555">ciuic bf16 precision plugin, {esc(what)}; '
             f'bench/reduce_dtype_study.py</text>')
    o.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(o) + "\n")


def main():
    global KEY, SETTINGS
    ap = argparse.ArgumentParser(
        description="Accuracy cost of [precision] reduce_dtype=\"bf16\" vs \"fp32\" (bf16 plugin): "
                    "trains the demo recipe with both settings and several seeds, then prints a "
                    "markdown table (final train/eval loss, eval loss at every eval point, exact "
                    "match, tokens/s, relative final eval-loss difference vs seed-to-seed spread) "
                    "and writes an SVG chart of eval loss vs step.",
        epilog="example: python3 bench/reduce_dtype_study.py build/bin/ciuic-run /tmp/rdstudy")
    ap.add_argument("ciuic_run", help="path of the ciuic-run binary")
    ap.add_argument("out_dir", help="output folder: one sub-folder per run, logs, summary.md, "
                                    "study.json, eval_loss.svg")
    ap.add_argument("--recipe", default=os.path.join(REPO, "configs", "tiny-cpu.toml"),
                    help="base recipe (default: configs/tiny-cpu.toml)")
    ap.add_argument("--steps", type=int, default=800, help="train.max_steps of every run (default 800)")
    ap.add_argument("--eval-every", type=int, default=50, help="train.eval_every_steps (default 50)")
    ap.add_argument("--seeds", default="1234,5678", help="comma-separated run.seed values (default 1234,5678)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="more recipe settings for every run (repeatable), e.g. model.path=\"DIR\" to "
                         "fine-tune a model trained before, and a lower optimizer.lr")
    ap.add_argument("--key", default=KEY,
                    help="the recipe key whose two settings are compared (default precision.reduce_dtype)")
    ap.add_argument("--values", default=",".join(SETTINGS), metavar="REF,OTHER",
                    help="its two values, the reference first (default fp32,bf16); written as TOML strings")
    ap.add_argument("--analyze-only", action="store_true",
                    help="do not train: read the runs already in OUT_DIR")
    args = ap.parse_args()
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        ap.error(f"--seeds: not a list of integers: {args.seeds!r}")
    if not seeds:
        ap.error("--seeds: at least one seed")
    values = tuple(v.strip() for v in args.values.split(","))
    if len(values) != 2 or not all(values) or values[0] == values[1]:
        ap.error(f"--values: expected two different values REF,OTHER, found {args.values!r}")
    if not args.key or "." not in args.key:
        ap.error(f"--key: expected section.key, found {args.key!r}")
    KEY, SETTINGS = args.key, values
    if args.steps < 1 or args.eval_every < 1:
        ap.error("--steps and --eval-every must be >= 1")
    args.ciuic_run = os.path.abspath(args.ciuic_run)
    args.recipe = os.path.abspath(args.recipe)
    args.out_dir = os.path.abspath(args.out_dir)
    if not args.analyze_only and not os.access(args.ciuic_run, os.X_OK):
        ap.error(f"not an executable: {args.ciuic_run}")
    os.makedirs(args.out_dir, exist_ok=True)

    walls_path = os.path.join(args.out_dir, "walls.json")
    walls = {}
    if os.path.exists(walls_path):
        with open(walls_path) as f:
            walls = json.load(f)
    if not args.analyze_only:
        ensure_demo_data()
        # interleave the settings (reference, other for seed 1, then seed 2, ...) so machine drift
        # affects both settings alike in the tokens/s column
        for seed in seeds:
            for s in SETTINGS:
                walls[run_name(s, seed)] = run_one(args, s, seed)
                with open(walls_path, "w") as f:
                    json.dump(walls, f, indent=1)

    runs = [read_run(args.out_dir, s, seed) for s in SETTINGS for seed in seeds]
    text, head = summarize(runs, seeds, args, walls)
    print()
    print(text)
    with open(os.path.join(args.out_dir, "summary.md"), "w") as f:
        f.write(text + "\n")
    svg = os.path.join(args.out_dir, "eval_loss.svg")
    write_svg(runs, seeds, svg)
    with open(os.path.join(args.out_dir, "study.json"), "w") as f:
        json.dump({"headline": head, "walls_s": walls,
                   "runs": [{k: v for k, v in r.items() if k != "train_loss"} for r in runs]}, f, indent=1)
    print(f"\nwrote {svg}, {os.path.join(args.out_dir, 'summary.md')}, {os.path.join(args.out_dir, 'study.json')}")


if __name__ == "__main__":
    main()
