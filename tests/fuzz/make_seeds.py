#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets into tests/fuzz/corpus/<target>/ (committed; rerun after
changing this file). Standard library only: the seeds need not be valid, only representative —
one well-formed example of every input shape a target reads, so that libFuzzer starts from the
real grammar instead of random bytes.

Layouts (see each tests/fuzz/<target>_fuzz.cpp):
  recipe       recipe text ["\\n%%\\n" --set lines]
  safetensors  file bytes (also read as an index JSON)
  tokenizer    selector byte (0: tokenizer.json ["\\n%%\\n" tokenizer_config.json], else text)
  jsonl        selector byte (bit 0: chat, 1: assistant-only loss, 2: BOS, 3: EOS, 4: deepseek
               template, 5: tokenizer) + one JSONL line
  manifest     a checkpoint's manifest.json ["\\n%%\\n" trainer.json], next to the harness's fixed
               files rank_00000.safetensors (MANIFEST_RANK_FILE) and precision.safetensors (empty)
  template     selector byte (bit 0: add_generation_prompt, 1: render twice) + a chat template
               ["\\n%%\\n" variables JSON]: the real templates of tests/fixtures/chat_templates, the
               language cases and the hostile ones (hostile_cases.json, long ones cut to 2,000 repeats)
"""
import json
import os
import shutil
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def recipe_seeds():
    minimal = '[train]\nmax_steps = 1\n[data]\nplugin = "synthetic"\n'
    write("recipe", "minimal.toml", minimal)
    with open(os.path.join(ROOT, "configs", "tiny-cpu.toml")) as f:
        write("recipe", "tiny-cpu.toml", f.read())
    write("recipe", "overrides.toml", minimal + "\n%%\ntrain.seq_len=128\ncomm.plugin=gloo\n"
          "optimizer.betas=[0.9,0.95]\nrun.name=\"x\"\nmodel.config.num_hidden_layers=2\n")
    write("recipe", "plugins.toml", minimal.replace('plugin = "synthetic"', 'plugin = "fuzz"\nneeded = "x"\n'
          'count = 7\nratio = 0.25\nmode = "b"\nnames = ["a", "b"]\nvalues = [1, 2.5]\nflag = true') +
          '[sharding]\nplugin = "zero2"\nreduce_bucket_size = 5e7\n[offload]\nplugin = ""\n')
    write("recipe", "model_config.toml", minimal + "[model.config]\nhidden_size = 64\nintermediate_size = 128\n"
          "num_hidden_layers = 2\nnum_attention_heads = 4\nnum_key_value_heads = 2\nvocab_size = 384\n"
          "max_position_embeddings = 256\nrope_scaling_type = \"linear\"\nrope_scaling_factor = 2.0\n"
          "[cluster]\ntimeout_s = 30.0\nmemory_per_device_gib = 24\n")
    write("recipe", "errors.toml", "include = 3\n[trian]\nmax_step = \"1\"\n[train]\nseq_len = 1.5\n"
          "[scheduler]\ntype = \"cosine\"\n")
    write("recipe", "include.toml", 'include = ["base.toml"]\n' + minimal)


def safetensors_file(tensors, metadata=None, pad=True):
    """tensors: [(name, dtype, shape, bytes)]"""
    header, offset, data = {}, 0, b""
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        data += raw
    h = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + data


def safetensors_seeds():
    f32 = struct.pack("<6f", 0, 1, 2, 3, 4, 5)
    write("safetensors", "one.safetensors", safetensors_file([("w", "F32", [2, 3], f32)]))
    write("safetensors", "mixed.safetensors", safetensors_file(
        [("a", "BF16", [2], b"\x80\x3f\x00\x40"), ("ids", "I64", [1], struct.pack("<q", 7)),
         ("empty", "F16", [0], b""), ("flag", "BOOL", [3], b"\x01\x00\x01")],
        metadata={"format": "pt", "layout": "[[\"w\",0,6,0]]"}))
    write("safetensors", "unpadded.safetensors", safetensors_file([("x", "U8", [3], b"abc")], pad=False))
    write("safetensors", "empty.safetensors", safetensors_file([]))
    write("safetensors", "index.json", json.dumps(
        {"metadata": {"total_size": 16}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                                                         "b": "model-00002-of-00002.safetensors"}}))


def tokenizer_seeds():
    for name in ("gpt2", "llama3"):
        d = os.path.join(FIXTURES, "tokenizer", name)
        with open(os.path.join(d, "tokenizer.json"), "rb") as f:
            tok = f.read()
        with open(os.path.join(d, "tokenizer_config.json"), "rb") as f:
            cfg = f.read()
        write("tokenizer", name + ".json", b"\x00" + tok + b"\n%%\n" + cfg)
    texts = ["Hello, world! 12345 \u00e9t\u00e9\n\tThe end.", "<|begin_of_text|>x<|end_of_text|>",
             "  spaces   and\r\nnewlines\n\n", "\u4f60\u597d\uff0c\u4e16\u754c \U0001F600 1234567890",
             "I'm can't we've they'll 3.14159"]
    for i, t in enumerate(texts):
        write("tokenizer", "text%d" % i, bytes([1 + i % 3]) + t.encode())


def jsonl_seeds():
    text = {"text": "Hello world. 2 + 2 = 4"}
    chat = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
                         {"role": "assistant", "content": "4"}]}
    write("jsonl", "text", bytes([0b1100]) + json.dumps(text).encode())
    write("jsonl", "chat", bytes([0b0111]) + json.dumps(chat).encode())
    write("jsonl", "chat_deepseek", bytes([0b111111]) + json.dumps(chat).encode())
    write("jsonl", "prompter", bytes([0b0001]) + json.dumps(
        {"messages": [{"role": "prompter", "content": "hi"}, {"role": "assistant", "content": "hello"}]}).encode())
    write("jsonl", "bad", bytes([0]) + b'{"text": "unterminated')


MANIFEST_RANK_FILE = b"rank 0 shard bytes\n"  # as tests/fuzz/manifest_fuzz.cpp writes it


def crc32c(data):
    """CRC-32C (Castagnoli), as ciuic/checksum.h: crc32c(b"123456789") == 0xE3069283."""
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def manifest_seeds():
    assert crc32c(b"123456789") == 0xE3069283
    trainer = {"step": 6, "updates": 6, "skipped": 0, "nonfinite_skips": 0, "tokens": 3072.0,
               "run_id": "20261201T101112Z-3fa2c1d9e0b4a7f1", "world_size": 2, "data_cursors": ["12", "12"],
               "shape": {"model_config": {"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 384},
                         "global_rows": 8, "seq_len": 64,
                         "params": [{"name": "model.embed_tokens.weight", "shape": [384, 64]}]}}
    tj = json.dumps(trainer, indent=2).encode()

    def manifest(files, **over):
        m = {"format": "ciuic-checkpoint", "version": 1, "step": 6, "world_size": 2,
             "files": {n: {"bytes": len(b), "crc32c": crc32c(b)} for n, b in files.items()}}
        m.update(over)
        return json.dumps(m, indent=2).encode()

    files = {"rank_00000.safetensors": MANIFEST_RANK_FILE, "precision.safetensors": b"", "trainer.json": tj}
    write("manifest", "valid", manifest(files) + b"\n%%\n" + tj)
    write("manifest", "no_trainer", manifest({"rank_00000.safetensors": MANIFEST_RANK_FILE}))
    bad = json.loads(manifest(files))
    bad["files"]["rank_00000.safetensors"]["bytes"] = 18
    bad["files"]["trainer.json"]["crc32c"] = 1234
    write("manifest", "wrong_size_crc", json.dumps(bad).encode() + b"\n%%\n" + tj)
    write("manifest", "version2", manifest({}, version=2) + b"\n%%\n{}")
    write("manifest", "names", json.dumps({"format": "ciuic-checkpoint", "version": 1, "files": {
        "sub": {"bytes": 0, "crc32c": 0}, "../x": {"bytes": 1, "crc32c": 2}, "missing": {"bytes": 0, "crc32c": 0}}}))
    # trainer.json shapes for an elastic resume: 24 rows written on 3 ranks (micro 4 x accumulation 2).
    elastic = dict(trainer, world_size=3, shape=dict(trainer["shape"], global_rows=24))
    write("manifest", "elastic", manifest({}) + b"\n%%\n" + json.dumps(elastic).encode())
    write("manifest", "elastic_odd", manifest({}) + b"\n%%\n" +
          json.dumps({"world_size": 7, "shape": {"global_rows": 7}, "run_id": 5}).encode())


def template_seeds():
    d = os.path.join(FIXTURES, "chat_templates")
    for model in sorted(os.listdir(d)):
        cfg = os.path.join(d, model, "tokenizer_config.json")
        if os.path.exists(cfg):
            with open(cfg) as f:
                write("template", "model_" + model, b"\x01" + json.load(f)["chat_template"].encode())
    with open(os.path.join(d, "jinja_cases.json")) as f:
        for c in json.load(f):
            write("template", "case_" + c["name"], b"\x02" + c["template"].encode() + b"\n%%\n" +
                  json.dumps(c["vars"], ensure_ascii=False).encode())
    with open(os.path.join(d, "hostile_cases.json")) as f:
        for c in json.load(f):
            t = c["template"]
            if not isinstance(t, str):
                t = "".join(text * min(n, 2000) for text, n in t)
            write("template", "hostile_" + c["name"], b"\x00" + t.encode())


def main():
    shutil.rmtree(os.path.join(HERE, "corpus"), ignore_errors=True)
    recipe_seeds()
    safetensors_seeds()
    tokenizer_seeds()
    jsonl_seeds()
    manifest_seeds()
    template_seeds()


if __name__ == "__main__":
    main()
