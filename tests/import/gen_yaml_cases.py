#!/usr/bin/env python3
"""Writes tests/import/yaml_cases.json: YAML texts and what PyYAML's safe_load (the loader LLaMA-Factory
and axolotl read their training files with) makes of them, or that it refuses them.
import_yaml_test (Yaml.ReadsWhatPyYamlReads) parses each text with core/src/import/yaml.cpp and compares.

    .venv/bin/python tests/import/gen_yaml_cases.py     # PyYAML 6.0.4 (scripts/setup-deps.sh --tests)
"""
import json
import os

import yaml

CASES = {
    "scalars": """
learning_rate: 1.0e-5
lr_string: 2e-5
epochs: 3.0
steps: 1000
neg: -7
hex_like: 0x1F
underscored: 1_000
yes_plain: yes
no_plain: No
on_plain: on
off_plain: OFF
true_plain: True
quoted_true: "true"
single: 'yes'
null_plain: null
tilde: ~
empty:
name: llama3
path: /models/Meta-Llama-3-8B
colon_in: "a: b"
""",
    "nested": """
datasets:
  - path: data/alpaca.json
    type: alpaca
  - path: tatsu-lab/alpaca
    type:
      field_instruction: instruction
      format: "[INST] {instruction} [/INST]"
special_tokens:
  pad_token: <|end_of_text|>
report_to: [tensorboard, wandb]
flow: {a: 1, b: [x, y]}
""",
    "block_scalars": """
literal: |
  line one
  line two
folded: >
  folded
  text
keep: |+
  kept

strip: |-
  stripped
""",
    "anchors_and_merge": """
base: &base
  learning_rate: 1.0e-5
  bf16: true
  nested: &n [1, 2, 3]
run:
  <<: *base
  bf16: false
again: *n
multi:
  <<: [*base, {extra: 1}]
""",
    "duplicate_keys": """
a: 1
b: 2
a: 3
""",
    "comments_and_unicode": """
# a comment
template: qwen   # trailing comment
system: "你好 🤖"
escaped: "tab\\tnewline\\n"
""",
    "document_marker": """---
stage: sft
...
""",
    "empty": "",
}
REFUSED = {
    "python_tag": "model: !!python/object/apply:os.system ['echo pwned']\n",
    "bad_indent": "a:\n  b: 1\n c: 2\n",
    "two_documents": "a: 1\n---\nb: 2\n",
    "unknown_alias": "a: *nothing\n",
    "unclosed_flow": "a: [1, 2\n",
}


def main():
    out = {"pyyaml": yaml.__version__, "cases": [], "refused": []}
    for name, text in CASES.items():
        out["cases"].append({"name": name, "yaml": text, "value": yaml.safe_load(text)})
    for name, text in REFUSED.items():
        try:
            yaml.safe_load(text)
            raise SystemExit(f"{name}: PyYAML accepted it")
        except yaml.YAMLError as e:
            out["refused"].append({"name": name, "yaml": text, "pyyaml_error": type(e).__name__})
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "yaml_cases.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {path}: {len(out['cases'])} cases, {len(out['refused'])} refused (PyYAML {yaml.__version__})")


if __name__ == "__main__":
    main()
