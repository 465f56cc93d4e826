#!/usr/bin/env python3
"""Measures what the hostile chat templates of tests/fixtures/chat_templates/hostile_cases.json get
through the real binary (docs/reliability.md, "Hostile inputs: chat templates").

  tests/tokenizer/hostile_dry_run.py BUILD_DIR [WORK_DIR] [NAME...]

For each case: a model folder (the llama3 fixture's tokenizer.json, a tokenizer_config.json whose
chat_template is the hostile one), a one-conversation JSONL file and a recipe reading them with
`chat_template = "hf"` and the cached_ssd data plugin; then `/usr/bin/time -v ciuic-run RECIPE
--dry-run` (which loads the template and builds the data cache as rank 0, rendering it). Prints a
Markdown table: exit code, the last line of the error, wall time, peak memory. Standard library only.
"""
import json
import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FIX = os.path.join(ROOT, "tests", "fixtures", "chat_templates")

RECIPE = """[run]
name = "hostile"
output_dir = "{work}/out"
seed = 1
[cluster]
nproc_per_node = {nproc}
device = "cpu"
[model]
tokenizer = "{work}/model/tokenizer.json"
chat_template = "hf"
[model.config]
hidden_size = 64
intermediate_size = 128
num_hidden_layers = 1
num_attention_heads = 4
num_key_value_heads = 2
vocab_size = 1024
max_position_embeddings = 256
[train]
micro_batch_size = 1
seq_len = 64
max_steps = 1
[comm]
plugin = "gloo"
[sharding]
plugin = "zero2"
[precision]
plugin = "fp32"
[data]
plugin = "cached_ssd"
format = "chat"
sources = ["{work}/train.jsonl"]
cache_dir = "{work}/cache"
"""


def expand(t):
    return t if isinstance(t, str) else "".join(s * n for s, n in t)


def run_case(build, work, case, nproc=1):
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(os.path.join(work, "model"))
    shutil.copy(os.path.join(FIX, "llama3", "tokenizer.json"), os.path.join(work, "model", "tokenizer.json"))
    cfg = json.load(open(os.path.join(FIX, "llama3", "tokenizer_config.json")))
    cfg["chat_template"] = expand(case["template"])
    json.dump(cfg, open(os.path.join(work, "model", "tokenizer_config.json"), "w"))
    with open(os.path.join(work, "train.jsonl"), "w") as f:
        f.write(json.dumps({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}) + "\n")
    recipe = os.path.join(work, "recipe.toml")
    open(recipe, "w").write(RECIPE.format(work=work, nproc=nproc))
    exe = os.path.join(build, "bin", "ciuic-run")
    p = subprocess.run(["/usr/bin/time", "-v", exe, recipe, "--dry-run", "--plugin-path",
                        os.path.join(build, "lib", "ciuic", "plugins")], capture_output=True, text=True, timeout=600)
    err = p.stderr
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", err).group(1)
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", err).group(1))
    lines = [l for l in err.splitlines() if l.strip() and not l.startswith("\t") and "Command" not in l]
    msg = next((l for l in reversed(lines) if "error" in l.lower() or "tokenizer_config" in l), lines[-1] if lines else "")
    return p.returncode, msg, wall, rss


def main():
    build = os.path.abspath(sys.argv[1])
    work = os.path.abspath(sys.argv[2]) if len(sys.argv) > 2 else "/tmp/ciuic-hostile"
    names = set(sys.argv[3:])
    cases = json.load(open(os.path.join(FIX, "hostile_cases.json")))
    real = json.load(open(os.path.join(FIX, "llama3", "tokenizer_config.json")))["chat_template"]
    cases.insert(0, {"name": "llama3_real_template", "template": real})  # the reference: a run that works
    print("| input | exit | message | wall | peak RSS |")
    print("|---|---|---|---|---|")
    for c in cases:
        if names and c["name"] not in names:
            continue
        code, msg, wall, rss = run_case(build, os.path.join(work, c["name"]), c)
        at = msg.find("(chat_template):")  # the template's own message, from its line:column on
        msg = msg[at + len("(chat_template):"):].strip() if at >= 0 else msg.replace(work + "/" + c["name"], "…")
        msg = msg.split(" (ciuic's")[0].replace("|", "\\|")
        print(f"| `{c['name']}` | {code} | {msg[:120]} | {wall} | {rss // 1024} MiB |", flush=True)


if __name__ == "__main__":
    main()
