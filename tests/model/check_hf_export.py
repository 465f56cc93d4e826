#!/usr/bin/env python3
"""Manual check that a folder written by write_hf_folder loads in transformers and reproduces
the fixture's logits (not run by CI: it needs transformers).

    /work/main/.venv/bin/python tests/model/check_hf_export.py <exported folder> [<fixture case>]

model_test leaves an export of tests/fixtures/model/tiny_linear under
<build>/test-tmp/model/ExportHf.RoundTripAndAtomicReplace.export/hf (case "linear"); the export of
tiny under ExportHf.ErrorsLeaveTheTargetUntouched.export_err/hf is case "tiny".
"""
import os
import sys

import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
EXPECTED = os.path.join(HERE, "..", "fixtures", "model", "expected.safetensors")


def main() -> None:
    folder = sys.argv[1]
    case = sys.argv[2] if len(sys.argv) > 2 else "linear"
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    print(type(model).__name__, "rope:", model.config.rope_parameters)
    with safe_open(EXPECTED, "pt") as f:
        ids = f.get_tensor(f"{case}.input_ids")
        pos = f.get_tensor(f"{case}.position_ids") if f"{case}.position_ids" in f.keys() else None
        want = f.get_tensor(f"{case}.logits")
    with torch.no_grad():
        got = model(input_ids=ids, position_ids=pos).logits
    rel = ((got - want).abs().max() / want.abs().max()).item()
    print(f"max relative logit difference vs the fixture: {rel:.2e}")
    sys.exit(0 if rel < 1e-4 else 1)


if __name__ == "__main__":
    main()
