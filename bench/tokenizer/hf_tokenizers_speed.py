#!/usr/bin/env python3
"""HF tokenizers vs ciuic encode throughput on the same documents and tokenizers, same session.

  /work/main/.venv/bin/python bench/tokenizer/hf_tokenizers_speed.py --bench build-tok/bin/tokenizer_bench

1. Writes a deterministic mixed corpus (English prose, Chinese, Japanese, code, numbers, emoji,
   whitespace runs; ~4 MB, documents of ~2-8 KB) to <out>/docs.jsonl.
2. Trains a 32k-vocab byte-level BPE on it with the DeepSeek-LLM pre-tokenizer and one with the
   Llama-3 pre-tokenizer (the configurations of tests/fixtures/gen_tokenizer.py), a 32k Qwen2-style
   one (NFC + Qwen2 regex, transformers' Qwen2Converter) and 32k SentencePiece BPE models (byte
   fallback) converted by transformers in the Llama-2 (Prepend/Replace normalizer), Mistral
   (Metaspace "first") and Gemma (Replace normalizer) layouts (tests/fixtures/gen_tokenizer_spm.py),
   and saves them as <out>/<config>/tokenizer.json — realistic vocabulary sizes without model files.
3. Measures HF `tokenizers` single-threaded (RAYON_NUM_THREADS=1): `encode_batch` over all
   documents and a Python loop of `encode`; best of N repetitions, in process CPU time — the
   Google Benchmark rates are per CPU second too, so a busy shared machine skews neither side.
4. Runs the ciuic Google Benchmark binary on the same folder and prints both and the ratios.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "fixtures"))
import gen_tokenizer as G  # noqa: E402
import gen_tokenizer_spm as S  # noqa: E402
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

WORDS = ("the of and to in is was for that with as on by at from his her are were be this which have an "
         "model training data gradient optimizer loss batch token sequence layer attention memory device "
         "tensor parallel shard checkpoint learning rate schedule warmup step epoch value function return "
         "class import print self list dict string number file path error result test case example").split()
CJK = "的一是不了人我在有他这为之大来以个中上们到说国和地也子时道出而要于就下得可你年生自会那后能对着事其里所去行过家十用发天如然作方成者多日都三小军二无同么经法当起与好看学进种将还分此心前面又定见只主没公从" \
      "深度学习模型需要大量数据进行训练我们使用分词器将文本转换为标记"
JA = "日本語のテキストとカタカナひらがなを含む文章です東京は大きな都市ですトークナイザー"
CODE = [
    "def {f}(x, y={n}):\n    if x > {n}:\n        return x * y\n    return [i ** 2 for i in range(x)]\n",
    "for (int i = 0; i < {n}; ++i) {{\n\tsum += a[i] * b[i];  // {f}\n}}\n",
    "    self.{f} = nn.Linear({n}, {n})\n    self.dropout = nn.Dropout(0.1)\n",
    "SELECT {f}, COUNT(*) FROM t WHERE id > {n} GROUP BY {f};\n",
    "{{\"{f}\": {n}, \"list\": [1, 2, 3], \"ok\": true}}\n",
]
EMOJI = ["😀", "👍🏽", "🇺🇸", "❤️", "👨‍👩‍👧", "🚀", "✨"]


CONFIGS = ("deepseek_llm", "llama3", "qwen2", "llama2_spm", "mistral_spm", "gemma_spm")


def make_docs(total_bytes, seed=1234):
    rng = random.Random(seed)
    docs, size = [], 0
    while size < total_bytes:
        parts = []
        target = rng.randint(2000, 8000)
        n = 0
        while n < target:
            kind = rng.random()
            if kind < 0.45:
                sent = " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 20)))
                s = sent[0].upper() + sent[1:] + rng.choice([".", ",", "!", "?", ";", ". It's", ". They're"]) + " "
            elif kind < 0.6:
                s = "".join(rng.choice(CJK) for _ in range(rng.randint(10, 40))) + rng.choice(["。", "，", "！"])
            elif kind < 0.65:
                s = "".join(rng.choice(JA) for _ in range(rng.randint(10, 30))) + "。"
            elif kind < 0.85:
                s = rng.choice(CODE).format(f=rng.choice(WORDS) + "_" + rng.choice(WORDS), n=rng.randint(0, 100000))
            elif kind < 0.92:
                s = " ".join(str(rng.randint(0, 10 ** rng.randint(1, 12))) for _ in range(rng.randint(1, 6))) + " "
            elif kind < 0.96:
                s = rng.choice(EMOJI) + " " + rng.choice(WORDS) + " "
            else:
                s = rng.choice(["\n\n", "\n", "    ", "\t", "   \n", "\r\n"])
            parts.append(s)
            n += len(s.encode())
        doc = "".join(parts)
        docs.append(doc)
        size += len(doc.encode())
    return docs


def train(docs, pre_tokenizer, vocab_size):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer=trainer)
    tok.decoder = decoders.ByteLevel()
    return tok


def build(docs, out, vocab_size):
    paths = {}
    ds = pre_tokenizers.Sequence(G.seq_splits(G.DEEPSEEK_LLM_SPLITS) + [
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    ll = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(G.LLAMA3_SPLIT), behavior="isolated"),
                                  pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    toks = {name: train(docs, pre, vocab_size) for name, pre in [("deepseek_llm", ds), ("llama3", ll)]}
    lines = [line for d in docs for line in d.split("\n") if line.strip()]
    import tempfile
    with tempfile.TemporaryDirectory() as work:
        toks["llama2_spm"] = S.build_llama2(work, lines, vocab_size)[0]
        toks["mistral_spm"] = S.build_mistral(work, lines, vocab_size)[0]
        toks["gemma_spm"] = S.build_gemma(work, lines, vocab_size)[0]
    toks["qwen2"] = S.build_qwen2(lines, vocab_size)[0]
    for name, tok in toks.items():
        os.makedirs(os.path.join(out, name), exist_ok=True)
        paths[name] = os.path.join(out, name, "tokenizer.json")
        tok.save(paths[name])
    return paths


def measure_hf(path, docs, reps):
    tok = Tokenizer.from_file(path)
    nbytes = sum(len(d.encode()) for d in docs)
    tok.encode_batch(docs[:20])  # warm-up
    res = {}
    best = float("inf")
    for _ in range(reps):
        t = time.process_time()
        enc = tok.encode_batch(docs, add_special_tokens=False)
        best = min(best, time.process_time() - t)
    res["encode_batch_MBps"] = nbytes / best / 1e6
    res["tokens"] = sum(len(e.ids) for e in enc)
    best = float("inf")
    for _ in range(reps):
        t = time.process_time()
        for d in docs:
            tok.encode(d, add_special_tokens=False)
        best = min(best, time.process_time() - t)
    res["encode_loop_MBps"] = nbytes / best / 1e6
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/ciuic-tokenizer-bench")
    ap.add_argument("--bench", help="path of the tokenizer_bench binary (optional)")
    ap.add_argument("--mb", type=float, default=4.0)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--retrain", action="store_true", help="train the tokenizers even if <out> has them")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    docs = make_docs(int(args.mb * 1e6))
    with open(os.path.join(args.out, "docs.jsonl"), "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps(d, ensure_ascii=False) + "\n")
    nbytes = sum(len(d.encode()) for d in docs)
    print(f"corpus: {len(docs)} documents, {nbytes / 1e6:.2f} MB", flush=True)
    paths = {n: os.path.join(args.out, n, "tokenizer.json") for n in CONFIGS}
    if args.retrain or not all(os.path.exists(p) for p in paths.values()):
        print(f"training {args.vocab}-token vocabularies ...", flush=True)
        paths = build(docs, args.out, args.vocab)
    hf = {name: measure_hf(p, docs, args.reps) for name, p in paths.items()}
    ours = {}
    if args.bench:
        env = dict(os.environ, CIUIC_TOKENIZER_BENCH_DIR=args.out)
        r = subprocess.run([args.bench, "--benchmark_filter=BM_Encode/", "--benchmark_format=json"], env=env,
                           capture_output=True, text=True, check=True)
        for b in json.loads(r.stdout)["benchmarks"]:
            ours[b["name"].split("/")[1]] = b["MB/s"]
    print(f"\n{'tokenizer':<14}{'HF encode_batch':>18}{'HF encode loop':>16}{'ciuic encode':>14}{'ratio vs batch':>16}"
          f"{'ratio vs loop':>15}")
    for name in paths:
        h = hf[name]
        o = ours.get(name)
        line = f"{name:<14}{h['encode_batch_MBps']:>13.2f} MB/s{h['encode_loop_MBps']:>11.2f} MB/s"
        if o:
            line += f"{o:>9.2f} MB/s{o / h['encode_batch_MBps']:>15.2f}x{o / h['encode_loop_MBps']:>14.2f}x"
        print(line)
    print(json.dumps({"hf": hf, "ciuic_MBps": ours, "bytes": nbytes, "docs": len(docs),
                      "load_average": os.getloadavg()}))


if __name__ == "__main__":
    main()
