#!/usr/bin/env python3
"""Loads the PEFT folders model_test wrote (Lora.ExportedPeftFolder) with peft.PeftModel.from_pretrained
on the same transformers base and checks that PEFT's logits equal ciuic's (saved beside them).

    check_peft_export.py <build>/test-tmp/model
Exit 77 (skip) when the venv has no peft.
"""
import glob
import json
import os
import sys

try:
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM
except ImportError as e:
    print("skipped:", e)
    sys.exit(77)

root = sys.argv[1]
dirs = sorted(glob.glob(os.path.join(root, "Lora.ExportedPeftFolder.*")))
if len(dirs) != 2:
    print("expected the llama and qwen2 exports under", root, "found", dirs)
    sys.exit(1)
worst = 0.0
for d in dirs:
    with open(os.path.join(d, "adapter", "adapter_config.json")) as f:
        base_path = json.load(f)["base_model_name_or_path"]
    base = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32, attn_implementation="eager")
    model = PeftModel.from_pretrained(base, os.path.join(d, "adapter"))
    model.eval()
    want = load_file(os.path.join(d, "ciuic.safetensors"))
    with torch.no_grad():
        got = model(input_ids=want["input_ids"]).logits
    rel = float((got - want["logits"]).abs().max() / want["logits"].abs().max())
    print(os.path.basename(d), "max rel diff", rel)
    worst = max(worst, rel)
sys.exit(0 if worst < 1e-5 else 1)
