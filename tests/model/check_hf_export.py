#!/usr/bin/env python3
"""Checks that a folder written by write_hf_folder loads in transformers and reproduces the
fixture's logits within 1e-4 (relative to the largest logit). ctest runs it as
hf_export_loads_in_transformers after model_test; without transformers in the venv
(scripts/setup-deps.sh installs it) it exits 77, which ctest reports as skipped.

    /work/main/.venv/bin/python tests/model/check_hf_export.py <exported folder> [<fixture case>]

model_test leaves an export of tests/fixtures/model/tiny_linear under
<build>/test-tmp/model/ExportHf.RoundTripAndAtomicReplace.export/hf (case "linear"); the export of
tiny under ExportHf.ErrorsLeaveTheTargetUntouched.export_err/hf is case "tiny".
"""
import importlib.util
import os
import sys

# Decide to skip before importing torch: a venv without transformers may hold the torch wheel
# without its Python dependencies, and importing it there is slow before it fails.
missing = [m for m in ("transformers", "safetensors") if importlib.util.find_spec(m) is None]
if missing:
    print(f"skipped: no {', '.join(missing)} (scripts/setup-deps.sh installs them)")
    sys.exit(77)

try:
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM
except ImportError as e:
    print(f"skipped: {e} (scripts/setup-deps.sh installs transformers)")
    sys.exit(77)

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
