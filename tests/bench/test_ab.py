#!/usr/bin/env python3
"""Tests of bench/ab.py (the A/B harness) on 2 CPU workers: ctest runs this with the build's
ciuic-run. The harness's summary is checked against figures recomputed here from each run's own
metrics.jsonl (not from the harness's code), and its refusals against their messages."""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import unittest

SRC = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
AB = os.path.join(SRC, "bench", "ab.py")
RECIPE = os.path.join(SRC, "tests", "bench", "tiny-ab.toml")
CIUIC_RUN = os.environ.get("CIUIC_RUN", os.path.join(SRC, "build", "bin", "ciuic-run"))


def ab(*args):
    return subprocess.run([sys.executable, AB, "--ciuic-run", CIUIC_RUN, *args],
                          capture_output=True, text=True, timeout=600)


class AbHarness(unittest.TestCase):
    def test_zero2_vs_ddp(self):
        out = tempfile.mkdtemp(prefix="ab-")
        p = ab(RECIPE, "--b-set", "sharding.plugin=ddp", "--names", "zero2,ddp",
               "--reps", "2", "--steps", "4", "--out", out)
        self.assertEqual(p.returncode, 0, p.stderr)
        # Alternating order: AB then BA.
        order = [l.split(": ")[-1] for l in p.stderr.splitlines() if l.startswith("[ab] repetition")]
        self.assertEqual(order, ["zero2", "ddp", "ddp", "zero2"])
        res = json.load(open(os.path.join(out, "ab.json")))
        self.assertEqual(res["names"], ["zero2", "ddp"])
        self.assertEqual(res["sides"]["ddp"]["overrides"], ["sharding.plugin=ddp"])
        # Recompute tokens/s from the runs' own metrics: median over steps 2..4, median over reps.
        per_side = {}
        for side in ("zero2", "ddp"):
            meds = []
            for rep in range(2):
                recs = [json.loads(l) for l in open(os.path.join(out, f"{side}-{rep}", "metrics.jsonl"))]
                steps = [r for r in recs if "event" not in r and "step" in r]
                self.assertEqual([r["step"] for r in steps], [1, 2, 3, 4])
                meds.append(statistics.median(r["tokens_per_s"] for r in steps[1:]))
            per_side[side] = statistics.median(meds)
            self.assertAlmostEqual(res["summary"][side]["tokens_per_s"]["median"], per_side[side], places=6)
        self.assertAlmostEqual(res["ratio_b_over_a"]["tokens_per_s"], per_side["ddp"] / per_side["zero2"], places=9)
        # The ddp runs really used ddp: its optimizer state is unsharded (2x zero2's at 2 ranks).
        def optim_gib(side):
            recs = [json.loads(l) for l in open(os.path.join(out, f"{side}-0", "metrics.jsonl"))]
            return next(r["optim_state_gib"] for r in recs if "optim_state_gib" in r)
        self.assertGreater(optim_gib("ddp"), 1.8 * optim_gib("zero2"))
        svg = open(os.path.join(out, "ab.svg")).read()
        self.assertTrue(svg.startswith("<svg") and svg.rstrip().endswith("</svg>"))
        self.assertIn("ddp/zero2 = ", svg)
        self.assertIn("tokens/s (all ranks)", p.stdout)
        # Loss curves: one line per run, one point per logged step, the runs' own losses.
        loss_svg = open(os.path.join(out, "ab-loss.svg")).read()
        self.assertTrue(loss_svg.startswith("<svg") and loss_svg.rstrip().endswith("</svg>"))
        for side in ("zero2", "ddp"):
            for rep in range(2):
                recs = [json.loads(l) for l in open(os.path.join(out, f"{side}-{rep}", "metrics.jsonl"))]
                losses = [[r["step"], r["loss"]] for r in recs if "event" not in r and "step" in r]
                self.assertEqual(res["runs"][side][rep]["loss_curve"], losses)
                tag = f'data-side="{side}" data-rep="{rep + 1}" points="'
                self.assertIn(tag, loss_svg)
                points = loss_svg.split(tag)[1].split('"')[0].split()
                self.assertEqual(len(points), 4)

    def test_steps_shorter_than_the_warmup_keep_the_recipes_schedule(self):
        # A recipe that warms up over 20 of its 40 steps; runs of 3 steps must neither be refused
        # ("the schedule would never finish its warmup") nor squeeze the schedule into 3 steps.
        # (Its max_steps is in the file: a --set of train.max_steps would override the harness's.)
        out = tempfile.mkdtemp(prefix="ab-")
        recipe = os.path.join(out, "warmup.toml")
        with open(recipe, "w") as f:
            f.write("include = [%s]\n[train]\nmax_steps = 40\n[optimizer]\nlr = 0.01\n"
                    "[scheduler]\ntype = \"warmup_cosine\"\nwarmup_num_steps = 20\nwarmup_type = \"linear\"\n"
                    % json.dumps(RECIPE))
        p = ab(recipe, "--b-set", "sharding.plugin=ddp", "--reps", "1", "--steps", "3", "--out", out)
        self.assertEqual(p.returncode, 0, p.stderr)
        for side in ("A", "B"):
            cmd = open(os.path.join(out, f"{side}-0", "log.txt")).readline()
            self.assertIn("scheduler.total_num_steps=40", cmd)
            recs = [json.loads(l) for l in open(os.path.join(out, f"{side}-0", "metrics.jsonl"))]
            lrs = [r["lr"] for r in recs if "event" not in r and "step" in r]
            self.assertEqual(len(lrs), 3)
            # Still warming up linearly towards 0.01 over 20 steps: rising, and far below the peak.
            self.assertTrue(lrs[0] < lrs[1] < lrs[2] < 0.25 * 0.01, lrs)

    def test_failing_side_is_named(self):
        out = tempfile.mkdtemp(prefix="ab-")
        p = ab(RECIPE, "--b-set", "sharding.plugin=nosuch", "--reps", "1", "--steps", "2", "--out", out)
        self.assertEqual(p.returncode, 2)
        self.assertIn("ab: error: B (repetition 1) failed with exit code 2; log: " + os.path.join(out, "B-0", "log.txt"),
                      p.stderr)
        self.assertIn("nosuch", p.stderr)  # the run's own error, from the log's tail

    def test_refusals(self):
        p = ab(RECIPE)
        self.assertEqual(p.returncode, 2)
        self.assertIn("A and B would be the same run", p.stderr)
        p = ab(RECIPE, "--b-set", "sharding.plugin=ddp", "--steps", "1")
        self.assertEqual(p.returncode, 2)
        self.assertIn("--steps >= 2", p.stderr)
        p = ab(RECIPE, "/nonexistent.toml")
        self.assertEqual(p.returncode, 2)
        self.assertIn("recipe /nonexistent.toml: no such file", p.stderr)
        p = ab(RECIPE, "--b-set", "x=1", "--names", "same,same")
        self.assertEqual(p.returncode, 2)
        self.assertIn("--names must be two different names", p.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
