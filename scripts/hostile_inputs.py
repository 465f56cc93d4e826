#!/usr/bin/env python3
"""The hostile inputs of docs/reliability.md ("Hostile inputs: importer and parsers", issue 27):
generates each (DeepSpeed configs with hostile keys and values, 300k keys, and every JSON input
nested 100,000 deep) in OUT_DIR and runs ciuic-run on it under /usr/bin/time -v. Prints one line
per input: exit code (or signal), wall and CPU time, peak memory, whether stderr held a raw
control byte, and the message. Standard library only.

    scripts/hostile_inputs.py build/bin/ciuic-run [OUT_DIR]     (default OUT_DIR: /tmp/ciuic-hostile)
SKIP300=1 leaves out the 300k-key import (minutes on a build before the fix)."""
import json
import os
import re
import shutil
import struct
import subprocess
import sys

EXE = os.path.abspath(sys.argv[1])
M = os.path.abspath(sys.argv[2] if len(sys.argv) > 2 else "/tmp/ciuic-hostile")
SRC = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
DEEP = 100000
shutil.rmtree(M, ignore_errors=True)
os.makedirs(M)

def w(path, data):
    p = os.path.join(M, path)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())
    return p

nest = lambda d, inner="1": "[" * d + inner + "]" * d

# DeepSpeed
w("ds_hostile.json", json.dumps({"train_micro_batch_size_per_gpu": 1,
    "comms_logger\n[run]\nplugin_paths = [\"evilplugins\"] #": 1,
    "\x1b]0;owned\x07\x1b[2J\x1b[31m": 2, "nul\x00after": 3, "x": "\x1b[31m"}))
w("ds_deep.json", '{"zero_optimization": {"stage": 2, "x": %s}}' % nest(DEEP))
for n in (30000, 300000):
    d = {"train_micro_batch_size_per_gpu": 1}
    for i in range(n // 2): d["key_%d" % i] = i
    d["zero_optimization"] = {"stage": 2, **{"stage3_k%d" % i: True for i in range(n // 2)}}
    w("ds_%dk.json" % (n // 1000), json.dumps(d))
w("ds_bad_type.json", json.dumps({"optimizer": {"type": "Adam\n[run]\x1b[2J"}}))

# a model folder and recipe for --dry-run
def model_dir(name, config=None, safetensors=None, tokenizer=None, tokenizer_config=None):
    d = os.path.join(M, name)
    os.makedirs(d, exist_ok=True)
    cfg = open(SRC + "/tests/fixtures/model/tiny/config.json").read() if config is None else config
    w(name + "/config.json", cfg)
    st = open(SRC + "/tests/fixtures/model/tiny/model.safetensors", "rb").read() if safetensors is None else safetensors
    w(name + "/model.safetensors", st)
    tok = open(SRC + "/tests/fixtures/tokenizer/gpt2/tokenizer.json").read() if tokenizer is None else tokenizer
    w(name + "/tokenizer.json", tok)
    tc = open(SRC + "/tests/fixtures/tokenizer/gpt2/tokenizer_config.json").read() if tokenizer_config is None else tokenizer_config
    w(name + "/tokenizer_config.json", tc)
    return d

def recipe(name, model_section, data_section):
    """A one-process CPU recipe of one step; [model] and [data] as given."""
    return w(name + ".toml", f"""[run]
output_dir = "{M}/runs/{name}"
[cluster]
nproc_per_node = 1
device = "cpu"
{model_section}
[train]
micro_batch_size = 1
seq_len = 32
max_steps = 1
[comm]
plugin = "gloo"
{data_section}
""")


def jsonl_data(name, source):
    return f'[data]\nplugin = "cached_ssd"\nformat = "text"\nsources = ["{source}"]\ncache_dir = "{M}/cache-{name}"'


def recipe_model(name, model, data="train.jsonl"):  # the model folder's weights and tokenizer
    return recipe(name, f'[model]\npath = "{model}"\ntokenizer = "{model}/tokenizer.json"\nchat_template = "plain"',
                  jsonl_data(name, data))


def recipe_st(name, model):  # a 1-step run on synthetic data: the worker loads the weights
    for f in ("tokenizer.json", "tokenizer_config.json"):
        os.remove(os.path.join(model, f))
    return recipe(name, f'[model]\npath = "{model}"', '[data]\nplugin = "synthetic"\nvocab_size = 300')


def recipe_jsonl(name, data):  # random init, the gpt2 fixture tokenizer
    model = (f'[model]\ntokenizer = "{SRC}/tests/fixtures/tokenizer/gpt2/tokenizer.json"\nchat_template = "plain"\n'
             "[model.config]\nhidden_size = 64\nintermediate_size = 128\nnum_hidden_layers = 2\n"
             "num_attention_heads = 4\nnum_key_value_heads = 2\nvocab_size = 1024\nmax_position_embeddings = 256")
    return recipe(name, model, jsonl_data(name, data))


w("train.jsonl", '{"text": "hello world"}\n' * 4)
gpt2 = json.load(open(SRC + "/tests/fixtures/tokenizer/gpt2/tokenizer.json"))
seq_pre = '{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true}'
seq = '{"type":"Sequence","pretokenizers":[' * DEEP + seq_pre + "]}" * DEEP
t = dict(gpt2); t["pre_tokenizer"] = "@@"
tok_deep = json.dumps(t).replace('"@@"', seq)
t = dict(gpt2); t["unknown_key"] = "@@"
tok_unknown = json.dumps(t).replace('"@@"', nest(DEEP))
cfg = json.load(open(SRC + "/tests/fixtures/model/tiny/config.json"))
cfg["x"] = "@@"
cfg_deep = json.dumps(cfg).replace('"@@"', nest(DEEP))
st = open(SRC + "/tests/fixtures/model/tiny/model.safetensors", "rb").read()
hl = struct.unpack("<Q", st[:8])[0]
hdr = json.loads(st[8:8 + hl])
hdr["__metadata__"] = {"x": "@@"}
h2 = json.dumps(hdr).replace('"@@"', nest(DEEP)).encode()
h2 += b" " * ((8 - len(h2) % 8) % 8)
st_deep = struct.pack("<Q", len(h2)) + h2 + st[8 + hl:]

cases = [
    ("DeepSpeed keys: newline + [run] plugin_paths, ESC/BEL/CSI, NUL", ["--from-deepspeed", M + "/ds_hostile.json", "-o", M + "/ds_hostile.toml"]),
    ("DeepSpeed value with newline + ESC (optimizer.type)", ["--from-deepspeed", M + "/ds_bad_type.json"]),
    ("DeepSpeed config nested 100k deep", ["--from-deepspeed", M + "/ds_deep.json"]),
    ("DeepSpeed config, 30k keys", ["--from-deepspeed", M + "/ds_30k.json", "-o", M + "/ds_30k.toml"]),
    ("DeepSpeed config, 300k keys", ["--from-deepspeed", M + "/ds_300k.json", "-o", M + "/ds_300k.toml"]),
    ("tokenizer.json: Sequence pre-tokenizers 100k deep", ["--dry-run", recipe_model("tok_seq", model_dir("tok_seq", tokenizer=tok_deep))]),
    ("tokenizer.json: unknown key 100k deep", ["--dry-run", recipe_model("tok_unk", model_dir("tok_unk", tokenizer=tok_unknown))]),
    ("tokenizer_config.json 100k deep", ["--dry-run", recipe_model("tok_cfg", model_dir("tok_cfg", tokenizer_config='{"bos_token": %s}' % nest(DEEP)))]),
    ("config.json 100k deep", ["--dry-run", recipe_model("cfg", model_dir("cfg", config=cfg_deep))]),
    ("safetensors header 100k deep (a 1-step run)", [recipe_st("st", model_dir("st", safetensors=st_deep))]),
    ("JSONL line 100k deep", ["--dry-run", recipe_jsonl("jsonl", w("deep.jsonl", '{"text": "ok"}\n{"text": %s}\n' % nest(DEEP)))]),
    ("recipe key with ESC and NUL", [w("esc.toml", '[train]\nmax_steps = 2\n"a\\u001b[2Jb\\u0000c" = 1\n')]),
]
ck = os.path.join(M, "ckpt", "step_00000001")
os.makedirs(ck)
w("ckpt/step_00000001/manifest.json", '{"format": "ciuic-checkpoint", "version": 1, "x": %s}' % nest(DEEP))
cases.append(("checkpoint manifest.json 100k deep", ["--export-hf", ck, M + "/hf1"]))
ck2 = os.path.join(M, "ckpt2", "step_00000001")
os.makedirs(ck2)
w("ckpt2/step_00000001/manifest.json", '{"format": "ciuic-checkpoint", "version": 1, "files": {}}')
w("ckpt2/step_00000001/trainer.json", '{"step": 1, "x": %s}' % nest(DEEP))
cases.append(("checkpoint trainer.json 100k deep", ["--export-hf", ck2, M + "/hf2"]))

def shown(b):
    s = b.decode("utf-8", "backslashreplace")
    return "".join(c if (c >= " " or c == "\n") and c != "\x7f" else "<RAW %02x>" % ord(c) for c in s)

for name, args in cases:
    if os.environ.get("SKIP300") and "300k" in name:
        continue
    r = subprocess.run(["/usr/bin/time", "-v", EXE] + args, capture_output=True, timeout=600)
    err = r.stderr
    tv = err[err.rfind(b"\tCommand being timed"):].decode()
    body = err[:err.rfind(b"\tCommand being timed")]
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", tv).group(1)
    cpu = float(re.search(r"User time \(seconds\): (\S+)", tv).group(1)) + float(re.search(r"System time \(seconds\): (\S+)", tv).group(1))
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", tv).group(1))
    sig = re.search(r"Command terminated by signal (\d+)", err.decode("utf-8", "replace"))
    code = re.search(r"Exit status: (\d+)", tv).group(1)
    raw = any((c < 0x20 and c not in (9, 10)) or c == 0x7f for c in body)
    lines = [l for l in shown(body).split("\n") if l.strip() and not l.startswith("Command exited")]
    i = next((k for k, l in enumerate(lines) if "error" in l), 0)
    msg = " / ".join(lines[i:i + 2]) if lines else ""
    print(f"{name} | exit {'signal ' + sig.group(1) if sig else code} | {wall} wall, {cpu:.2f} s CPU | {rss // 1024} MiB | raw control bytes: {'YES' if raw else 'no'} | {msg[:260]}")
