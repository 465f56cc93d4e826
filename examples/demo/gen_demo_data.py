#!/usr/bin/env python3
"""Makes the demo's chat dataset: arithmetic and unit conversions with exact answers.

    python3 examples/demo/gen_demo_data.py OUT_DIR [--train N] [--eval N] [--seed S]

Writes OUT_DIR/train.jsonl and OUT_DIR/eval.jsonl, one conversation per line in the format the
`cached_ssd` data plugin reads with format = "chat":

    {"messages": [{"role": "user", "content": "What is 37 + 45?"},
                  {"role": "assistant", "content": "82"}], "category": "add"}

eval.jsonl lines also carry "answer" (the exact expected reply). Held-out questions never appear in
train.jsonl in any phrasing: every category's problem space (its operands) is split first, and the
training conversations are drawn from the other part only.

Deterministic (the same bytes for the same arguments on any machine) and standard library only, so
`make demo` runs it with the system python3.
"""
import argparse
import json
import os
import random

# (from unit, to unit, factor): "How many <to> are in <n> <from>?" -> n * factor
CONVERSIONS = [
    ("meters", "centimeters", 100),
    ("kilometers", "meters", 1000),
    ("kilograms", "grams", 1000),
    ("hours", "minutes", 60),
    ("minutes", "seconds", 60),
    ("centimeters", "millimeters", 10),
    ("liters", "milliliters", 1000),
    ("days", "hours", 24),
]

PHRASES = {
    "add": ["What is {a} + {b}?", "Compute {a} + {b}.", "{a} + {b} = ?", "Add {a} and {b}.",
            "What is the sum of {a} and {b}?"],
    "sub": ["What is {a} - {b}?", "Compute {a} - {b}.", "{a} - {b} = ?", "Subtract {b} from {a}."],
    "mul": ["What is {a} * {b}?", "Compute {a} * {b}.", "{a} * {b} = ?", "What is {a} times {b}?"],
    "convert": ["How many {to} are in {n} {frm}?", "Convert {n} {frm} to {to}.",
                "{n} {frm} is how many {to}?"],
}

# Share of each category in the training conversations, and held-out questions per category.
MIX = [("add", 0.3), ("sub", 0.2), ("mul", 0.2), ("convert", 0.3)]


def problem_space():
    space = {
        "add": [(a, b) for a in range(10, 100) for b in range(10, 100)],
        "sub": [(a, b) for a in range(10, 100) for b in range(0, a + 1)],
        "mul": [(a, b) for a in range(2, 13) for b in range(2, 13)],
        "convert": [(u, n) for u in range(len(CONVERSIONS)) for n in range(1, 100)],
    }
    return space


def render(category, key, rng):
    phrase = rng.choice(PHRASES[category])
    if category == "convert":
        u, n = key
        frm, to, factor = CONVERSIONS[u]
        return phrase.format(n=n, frm=frm, to=to), str(n * factor)
    a, b = key
    answer = {"add": a + b, "sub": a - b, "mul": a * b}[category]
    return phrase.format(a=a, b=b), str(answer)


def conversation(category, key, rng, with_answer):
    question, answer = render(category, key, rng)
    line = {"messages": [{"role": "user", "content": question},
                         {"role": "assistant", "content": answer}],
            "category": category}
    if with_answer:
        line["answer"] = answer
    return line


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--train", type=int, default=6000, help="training conversations")
    ap.add_argument("--eval", type=int, default=50, help="held-out questions per category")
    ap.add_argument("--seed", type=int, default=20240601)
    args = ap.parse_args()

    rng = random.Random(args.seed)
    train_keys, eval_keys = {}, {}
    for category, keys in sorted(problem_space().items()):
        keys = list(keys)
        rng.shuffle(keys)
        eval_keys[category] = keys[:args.eval]
        train_keys[category] = keys[args.eval:]

    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "train.jsonl"), "w", encoding="utf-8", newline="\n") as f:
        cats = [c for c, _ in MIX]
        weights = [w for _, w in MIX]
        for _ in range(args.train):
            category = rng.choices(cats, weights)[0]
            key = rng.choice(train_keys[category])
            f.write(json.dumps(conversation(category, key, rng, False), sort_keys=True) + "\n")
    with open(os.path.join(args.out_dir, "eval.jsonl"), "w", encoding="utf-8", newline="\n") as f:
        for category, _ in MIX:
            for key in eval_keys[category]:
                f.write(json.dumps(conversation(category, key, rng, True), sort_keys=True) + "\n")
    print("gen_demo_data: %d training conversations, %d held-out questions in %s"
          % (args.train, args.eval * len(MIX), args.out_dir))


if __name__ == "__main__":
    main()
