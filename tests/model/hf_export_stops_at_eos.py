#!/usr/bin/env python3
"""An exported model stops generating at EOS in transformers (issue 17 item 3).

    .venv/bin/python tests/model/hf_export_stops_at_eos.py CIUIC_RUN CIUIC_GREEDY WORK_DIR [--check-only]

ctest runs it as hf_export_stops_at_eos (label `transformers`). Two cases, each a tiny Llama that
`ciuic-run` trains on CPU (one worker, a few hundred steps) until it knows a handful of short
documents by heart, then exports with `ciuic-run --export-hf CKPT OUT` (default dtype, bf16):

  text  the demo tokenizer (examples/demo), `format = "text"`: every document is
        [BOS] text [EOS]; a prompt is a document's first words.
  chat  the DeepSeek-LLM tokenizer fixture with its real chat template in tokenizer_config.json,
        `[model] chat_template = "hf"`, `format = "chat"` (the setup of docs/finetune.md); a prompt
        is the user's question with the generation prompt.

Then for each export, in transformers (AutoTokenizer + AutoModelForCausalLM from the folder, all
defaults):
  - the tokenizer encodes as ciuic's does (with and without special tokens) and decodes back to
    the text; the chat prompt of apply_chat_template(add_generation_prompt=True) is ciuic's
    encode_prompt;
  - generate(**inputs, max_new_tokens=200) with default settings stops at the tokenizer's EOS
    well before the limit, with exactly the ids ciuic's own greedy decoding gives
    (LlamaModel::generate_greedy, through tests/model/ciuic_greedy) and the memorized answer.

Without transformers this FAILS rather than skips: scripts/setup-deps.sh installs it into the
venv. --check-only reuses WORK_DIR's exports (e.g. after editing one by hand).
"""
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.abspath(os.path.join(HERE, "..", ".."))
MAX_NEW = 200

TEXT_DOCS = [
    "one plus one is two",
    "red apples grow on trees",
    "seven days make a week",
    "the moon circles the earth",
    "water boils at one hundred degrees",
    "cats sleep most of the day",
]
CHATS = [
    ("What is the capital of France?", "Paris"),
    ("How many legs does a spider have?", "Eight legs."),
    ("Name a primary color.", "Blue"),
    ("Which planet is the largest?", "Jupiter is the largest."),
    ("What do bees make?", "Honey"),
]
ROUND_TRIP = ["Hello world", "  two  spaces and a tab\t", "héllo wörld ✓ 12345", "line one\nline two"]

try:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    import transformers
except ImportError as e:
    print(f"FAILED: cannot import transformers ({e}); scripts/setup-deps.sh installs it into .venv "
          "(`ctest -LE transformers` runs the other tests without it)")
    sys.exit(1)


def vocab_size(tokenizer_json):
    with open(tokenizer_json, encoding="utf-8") as f:
        t = json.load(f)
    return 1 + max(list(t["model"]["vocab"].values()) + [a["id"] for a in t.get("added_tokens", [])])


def recipe(case, tok_json, data_file, out):
    chat = case == "chat"
    return f"""[run]
name = "hf-eos-{case}"
output_dir = "{out}/run"
seed = 11
[cluster]
nproc_per_node = 1
device = "cpu"
[model]
tokenizer = "{tok_json}"
init_std = 0.02
{'chat_template = "hf"' if chat else ''}
[model.config]
hidden_size = 64
intermediate_size = 192
num_hidden_layers = 2
num_attention_heads = 4
num_key_value_heads = 2
vocab_size = {vocab_size(tok_json)}
max_position_embeddings = 256
tie_word_embeddings = true
[train]
micro_batch_size = 4
seq_len = 64
max_steps = 250
gradient_clipping = 1.0
[optimizer]
lr = 1e-2
betas = [0.9, 0.95]
weight_decay = 0.0
[scheduler]
type = "warmup_cosine"
warmup_num_steps = 10
warmup_type = "linear"
[comm]
plugin = "gloo"
[sharding]
plugin = "ddp"
[precision]
plugin = "fp32"
[data]
plugin = "cached_ssd"
format = "{'chat' if chat else 'text'}"
sources = ["{data_file}"]
cache_dir = "{out}/cache"
[log]
every_steps = 50
progress = "off"
"""


def train_and_export(case, ciuic_run, root):
    out = os.path.join(root, case)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    if case == "text":
        tok_json = os.path.join(SRC, "examples", "demo", "tokenizer.json")
        lines = [{"text": d} for d in TEXT_DOCS]
    else:
        tok_json = os.path.join(SRC, "tests", "fixtures", "chat_templates", "deepseek_llm", "tokenizer.json")
        lines = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]} for q, a in CHATS]
    data_file = os.path.join(out, "train.jsonl")
    with open(data_file, "w", encoding="utf-8") as f:
        for _ in range(40):
            for line in lines:
                f.write(json.dumps(line) + "\n")
    rec = os.path.join(out, "recipe.toml")
    with open(rec, "w", encoding="utf-8") as f:
        f.write(recipe(case, tok_json, data_file, out))
    # A single CPU worker computes on every core (at::set_num_threads); with the default OpenMP
    # wait policy its threads spin at each of the many tiny ops' barriers, which on 2 busy cores
    # (ctest -j 2) made 250 steps take over a minute instead of 2 s. Passive waiting keeps it short.
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    t0 = time.time()
    subprocess.run([ciuic_run, rec], check=True, cwd=out, env=env)
    t1 = time.time()
    subprocess.run([ciuic_run, "--export-hf", os.path.join(out, "run", "checkpoints"), os.path.join(out, "hf")],
                   check=True, cwd=out, env=env)
    print(f"{case}: trained in {t1 - t0:.1f} s, exported in {time.time() - t1:.1f} s", flush=True)


def ciuic_side(greedy, folder, dtype, request):
    req_file = folder + ".request.json"
    with open(req_file, "w", encoding="utf-8") as f:
        json.dump(dict(request, dtype=dtype, max_new_tokens=MAX_NEW), f)
    r = subprocess.run([greedy, folder, req_file], check=True, stdout=subprocess.PIPE, text=True)
    return json.loads(r.stdout)


class Checker:
    def __init__(self):
        self.failures = []

    def eq(self, what, got, want):
        if got != want:
            self.failures.append(f"{what}: got {short(got)}, expected {short(want)}")
        return got == want


def short(v, n=24):
    """repr of v, a long list cut to its first n items."""
    if isinstance(v, list) and len(v) > n:
        return repr(v[:n])[:-1] + f", ... ({len(v)} items)]"
    return repr(v)


def check_case(case, greedy, root, ck):
    folder = os.path.join(root, case, "hf")
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()  # defaults: the dtype config.json names
    dtype = {torch.float32: "fp32", torch.bfloat16: "bf16"}[model.dtype]
    eos = tok.eos_token_id
    print(f"{case}: {type(tok).__name__}, {type(model).__name__} in {model.dtype}; EOS {tok.eos_token!r} = {eos}, "
          f"generation_config.eos_token_id = {model.generation_config.eos_token_id}", flush=True)
    texts = ROUND_TRIP + (TEXT_DOCS if case == "text" else [q for q, _ in CHATS])
    request = {"texts": texts}
    if case == "text":
        prompts = [" ".join(d.split()[:2]) for d in TEXT_DOCS]
        answers = TEXT_DOCS
        request["text_prompts"] = prompts
    else:
        prompts = [[{"role": "user", "content": q}] for q, _ in CHATS]
        answers = [a for _, a in CHATS]
        request["chat_prompts"] = prompts
    ours = ciuic_side(greedy, folder, dtype, request)
    ck.eq(f"{case}: EOS id of transformers' tokenizer vs ciuic's", eos, ours["eos_id"])
    ck.eq(f"{case}: BOS id of transformers' tokenizer vs ciuic's", tok.bos_token_id, ours["bos_id"])

    for text, c in zip(texts, ours["texts"]):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        ck.eq(f"{case}: ids of {text!r}, transformers vs ciuic", ids, c["ids"])
        ck.eq(f"{case}: ids of {text!r} with special tokens, transformers vs ciuic", tok(text)["input_ids"],
              c["ids_special"])
        ck.eq(f"{case}: transformers' decode(encode({text!r}))", tok.decode(ids), text)
        ck.eq(f"{case}: ciuic's decode(encode({text!r}))", c["decoded"], text)

    results = ours["text_prompts"] if case == "text" else ours["chat_prompts"]
    for prompt, answer, c in zip(prompts, answers, results):
        if case == "text":
            inputs = tok(prompt, return_tensors="pt")
        else:
            inputs = tok.apply_chat_template(prompt, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        ids = inputs["input_ids"]
        if not ck.eq(f"{case}: prompt ids of {prompt!r}, transformers vs ciuic", ids[0].tolist(), c["prompt"]):
            continue
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=MAX_NEW)  # greedy: the export's generation_config
        new = out[0, ids.shape[1]:].tolist()
        text = tok.decode(new, skip_special_tokens=True)
        stopped = len(new) < MAX_NEW and new[-1:] == [eos]
        print(f"  {prompt!r} -> {text!r}: {len(new)} new tokens, "
              f"{'stopped at EOS' if stopped else 'did NOT stop at EOS'}", flush=True)
        if not stopped:
            ck.failures.append(f"{case}: generation from {prompt!r} did not stop at EOS {eos} within {MAX_NEW} "
                               f"tokens (last ids {new[-5:]})")
        ck.eq(f"{case}: generated ids from {prompt!r}, transformers vs ciuic's greedy", new, c["generated"])
        # The model learned its documents: the text case continues the prompt, the chat case
        # answers after "Assistant:" (the reply's leading space is the model's).
        ck.eq(f"{case}: the answer to {prompt!r}", prompt + text if case == "text" else text.strip(), answer)


def main():
    args = [a for a in sys.argv[1:] if a != "--check-only"]
    check_only = "--check-only" in sys.argv[1:]
    if len(args) != 3:
        print(__doc__)
        sys.exit(2)
    ciuic_run, greedy, root = (os.path.abspath(a) for a in args)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}", flush=True)
    os.makedirs(root, exist_ok=True)
    torch.manual_seed(0)
    ck = Checker()
    for case in ("text", "chat"):
        if not check_only:
            train_and_export(case, ciuic_run, root)
        check_case(case, greedy, root, ck)
    for f in ck.failures:
        print("FAILED:", f)
    print(f"{'FAILED' if ck.failures else 'passed'}: {len(ck.failures)} failed checks")
    sys.exit(1 if ck.failures else 0)


if __name__ == "__main__":
    main()
