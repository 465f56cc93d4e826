#!/usr/bin/env bash
# `make demo`: generate the demo data, train configs/tiny-cpu.toml on 3 CPU workers, and show
# what the model learned (held-out exact match, BLEU, ROUGE-L, response time and eval loss,
# before and after).
set -euo pipefail
build=${1:-build}
cd "$(dirname "$0")/.."
python3 examples/demo/gen_demo_data.py runs/demo-data
rm -rf runs/tiny-cpu
"$build/bin/ciuic-run" configs/tiny-cpu.toml
python3 - runs/tiny-cpu/metrics.jsonl <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
em = {r["when"]: r for r in recs if r.get("event") == "exact_match"}
ev = [r for r in recs if r.get("event") == "eval"]
end = next((r for r in recs if r.get("event") == "end"), {})
print()
print("                         before training   after training")
if ev:
    print(f"held-out eval loss       {ev[0]['eval_loss']:15.3f}   {ev[-1]['eval_loss']:14.3f}")
if em:
    b, a = em.get("before", {}), em.get("after", {})
    print(f"exact-match accuracy     {100*b.get('accuracy', float('nan')):14.1f}%   "
          f"{100*a.get('accuracy', float('nan')):13.1f}%   ({a.get('questions', 0)} held-out questions)")
    if "bleu" in a:
        print(f"BLEU ({a.get('bleu_tokenize', '13a')}, sacrebleu's){'':4}{b.get('bleu', float('nan')):11.2f}   "
              f"{a['bleu']:14.2f}")
        if a["bleu"] == 0 and a.get("bleu_precision_1", 0) > 0:
            print(f"  (BLEU is 0 by sacrebleu's definition: the answers are single numbers, with no 2- to 4-grams;\n"
                  f"   its 1-gram precision went {b.get('bleu_precision_1', float('nan')):.1f}% -> "
                  f"{a['bleu_precision_1']:.1f}%)")
    if "rouge_l" in a:
        print(f"ROUGE-L F (rouge-score)  {b.get('rouge_l', float('nan')):15.4f}   {a['rouge_l']:14.4f}")
    if "ttft_median_s" in a:
        print(f"time to first token p50  {1000*b.get('ttft_median_s', float('nan')):12.1f} ms   "
              f"{1000*a['ttft_median_s']:11.1f} ms   (p90 {1000*a['ttft_p90_s']:.1f} ms)")
        print(f"answer tokens/s p50      {b.get('answer_tokens_per_s_median', float('nan')):15.0f}   "
              f"{a['answer_tokens_per_s_median']:14.0f}   (p90 {a['answer_tokens_per_s_p90']:.0f})")
if end:
    print(f"\n{end['steps']} steps, {end['tokens']:.0f} tokens in {end['elapsed_s']:.0f} s "
          f"({end['tokens_per_s']:.0f} tokens/s); model exported to runs/tiny-cpu/hf")
PY
