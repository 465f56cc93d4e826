#!/usr/bin/env python3
"""Trains the demo's small byte-level BPE tokenizer (committed as examples/demo/tokenizer.json).

    /work/main/.venv/bin/python examples/demo/make_tokenizer.py [--vocab 384]

Needs the `tokenizers` package (scripts/setup-deps.sh --fixtures); `make demo` does not run it, it
uses the committed files. Steps: generate the demo data (gen_demo_data.py, into a temporary
folder), render every training conversation as the "plain" chat template does
("User: <question>\\n\\nAssistant: <answer>"), train a BPE model on it, and write

  tokenizer.json         byte-level BPE, digits split one by one (pre-tokenizer Digits, then
                         ByteLevel with the GPT-2 regex), post-processor adding BOS, ByteLevel decoder
  tokenizer_config.json  bos_token / eos_token, as transformers writes them

Special tokens: <|begin_of_text|> (BOS, id 0), <|end_of_text|> (EOS, id 1). Deterministic for a
given `tokenizers` version.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=384)
    ap.add_argument("--out", default=HERE)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, os.path.join(HERE, "gen_demo_data.py"), tmp], check=True)
        texts = []
        for name in ("train.jsonl",):
            with open(os.path.join(tmp, name), encoding="utf-8") as f:
                for line in f:
                    msgs = json.loads(line)["messages"]
                    texts.append("".join(
                        ("User: " + m["content"] + "\n\n") if m["role"] == "user" else
                        ("Assistant: " + m["content"]) for m in msgs))

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=args.vocab, special_tokens=[BOS, EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=BOS + " $A", pair=BOS + " $A " + BOS + " $B",
        special_tokens=[(BOS, tok.token_to_id(BOS))])
    tok.save(os.path.join(args.out, "tokenizer.json"))
    with open(os.path.join(args.out, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": BOS, "eos_token": EOS, "model_max_length": 2048,
                   "tokenizer_class": "PreTrainedTokenizerFast"}, f, indent=2)
        f.write("\n")
    sample = "User: What is 37 + 45?\n\nAssistant: 82"
    print("make_tokenizer: vocab %d; %r -> %s" % (tok.get_vocab_size(), sample,
                                                 tok.encode(sample).tokens))


if __name__ == "__main__":
    main()
