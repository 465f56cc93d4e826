#!/usr/bin/env python3
"""sacrebleu's corpus BLEU (13a, zh) and rouge-score's ROUGE-L on the corpus of score_bench.cpp
(tests/fixtures/score/cases.json's first corpus, 30 times, each line made distinct), single thread, in segments/s.
Compare with build/bin/score_bench's items_per_second. Each run builds a fresh BLEU object, so
sacrebleu's tokenizer cache starts empty, as ciuic's (which has none) always does.

  .venv/bin/python bench/score/sacrebleu_speed.py
"""
import json
import os
import time

from rouge_score import rouge_scorer
from sacrebleu.metrics import BLEU

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "..", "..", "tests", "fixtures", "score", "cases.json"), encoding="utf-8") as f:
    first = json.load(f)["corpora"][0]
# Distinct lines, as score_bench.cpp makes them (sacrebleu's tokenizer caches results per line).
hyps = [h + " " + str(rep) for rep in range(30) for h in first["hyps"]]
refs = [r[0] + " " + str(rep) for rep in range(30) for r in first["refs"]]


def best(fn, reps=3):
    t = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        t.append(time.perf_counter() - t0)
    return min(t)


for name in ("13a", "zh"):
    s = best(lambda: BLEU(tokenize=name).corpus_score(hyps, [refs]))
    print(f"sacrebleu corpus BLEU {name:4s} {len(hyps) / s:12.0f} segments/s")
scorer = rouge_scorer.RougeScorer(["rougeL"])
s = best(lambda: [scorer.score(r, h) for h, r in zip(hyps, refs)])
print(f"rouge-score ROUGE-L      {len(hyps) / s:12.0f} segments/s")
