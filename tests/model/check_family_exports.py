#!/usr/bin/env python3
"""Checks that the exports families_test writes (one folder per case of
tests/fixtures/gen_model_families.py) load in transformers as the family's *ForCausalLM, with
weights identical to the fixture's (written by transformers itself), the fixture's logits to
1e-5 relative, and generate() giving ciuic's greedy tokens up to and including an EOS. ctest runs it as families_export_loads_in_transformers after model_test; without
transformers in the venv it exits 77 (skipped).

    /work/main/.venv/bin/python tests/model/check_family_exports.py <folder holding the case folders>
"""
import importlib.util
import json
import os
import sys

missing = [m for m in ("transformers", "safetensors") if importlib.util.find_spec(m) is None]
if missing:
    print(f"skipped: no {', '.join(missing)} (scripts/setup-deps.sh installs them)")
    sys.exit(77)

import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "fixtures", "model", "families")


def main() -> int:
    root = sys.argv[1]
    with open(os.path.join(FIXTURES, "families.json")) as f:
        meta = json.load(f)
    cases = [c for c in meta if c != "published"]
    bad = 0
    with safe_open(os.path.join(FIXTURES, "expected.safetensors"), "pt") as want:
        for case in cases:
            ours = AutoModelForCausalLM.from_pretrained(os.path.join(root, case), dtype=torch.float32,
                                                        attn_implementation="eager").eval()
            ref = AutoModelForCausalLM.from_pretrained(os.path.join(FIXTURES, case), dtype=torch.float32,
                                                       attn_implementation="eager").eval()
            problems = []
            if type(ours) is not type(ref):
                problems.append(f"class {type(ours).__name__}, fixture {type(ref).__name__}")
            a, b = dict(ours.named_parameters()), dict(ref.named_parameters())
            if list(a) != list(b):
                problems.append(f"parameter names {list(a)[:3]}... differ from {list(b)[:3]}...")
            for n in b:
                if n in a and not torch.equal(a[n], b[n]):
                    problems.append(f"{n} differs")
            if ours.config.tie_word_embeddings != ref.config.tie_word_embeddings:
                problems.append("tie_word_embeddings differs")
            if getattr(ref.config, "layer_types", None) != getattr(ours.config, "layer_types", None):
                problems.append(f"layer_types {ours.config.layer_types} != {ref.config.layer_types}")
            ids = want.get_tensor(f"{case}.input_ids")
            with torch.no_grad():
                got = ours(input_ids=ids).logits
            expect = want.get_tensor(f"{case}.logits")
            rel = ((got - expect).abs().max() / expect.abs().max()).item()
            if rel > 1e-5:
                problems.append(f"logits differ by {rel:.2e}")
            # generate() on the export (its KV cache, sliding layers included) gives ciuic's greedy
            # tokens (Families.GreedyGenerationPastTheWindowMatchesFullForwards holds ciuic to the
            # same fixture) and stops at an EOS (one of them).
            prompt = want.get_tensor(f"{case}.generate.prompt")
            new = want.get_tensor(f"{case}.generate.new_tokens")
            # EOS: the token whose first appearance comes last (the longest generation that stops).
            firsts = {}
            for i, t in enumerate(new[0].tolist()):
                firsts.setdefault(t, i)
            eos = max(firsts, key=firsts.get)
            with torch.no_grad():
                gen = ours.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8,
                                    do_sample=False, eos_token_id=eos, pad_token_id=eos)[:, prompt.shape[1]:]
            first = int((new[0] == eos).nonzero()[0])
            if not torch.equal(gen, new[:, :first + 1]):
                problems.append(f"generate() gave {gen.tolist()}, ciuic's greedy {new.tolist()} (eos {eos})")
            print(f"{case:10s} {type(ours).__name__:20s} logits {rel:.2e}, generate {gen.shape[1]} tokens "
                  f"{'; '.join(problems) or 'ok'}")
            bad += bool(problems)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
