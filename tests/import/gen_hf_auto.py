#!/usr/bin/env python3
"""Writes tests/import/hf_auto_cases.json: DeepSpeed configs with "auto" values as the HF Trainer
fills them (transformers' integrations/deepspeed.py, HfTrainerDeepSpeedConfig.trainer_config_process
and trainer_config_finalize), for TrainingArguments' defaults and for a set of given arguments.
import_deepspeed_test (DeepSpeedImport.AutoIsWhatTheHfTrainerFills) imports each config with the
same arguments and compares the recipe with what transformers filled in.

    .venv/bin/python tests/import/gen_hf_auto.py     # transformers 5.24.0 (scripts/setup-deps.sh --tests)

The configs are written here in DeepSpeed's documented format, in the styles of the HF Trainer's
documentation, LLaMA-Factory's examples/deepspeed and transformers' tests. TrainingArguments is not
constructed (its __post_init__ wants accelerate and a device): its dataclass defaults are read and
world_size is 1. The small lookups the HF class inherits from accelerate's HfDeepSpeedConfig
(find_config_node, is_true, ...) are written below; the filling itself is transformers' code.
"""
import copy
import dataclasses
import json
import os
import types

import transformers
from transformers import TrainingArguments
from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig


class Filler(HfTrainerDeepSpeedConfig):
    def __init__(self, config):  # no accelerate: the lookups below instead of its base class
        self.config = config
        self.mismatches = []

    def find_config_node(self, path):
        node = self.config
        *parents, key = path.split(".")
        for p in parents:
            node = node.get(p)
            if node is None:
                return None, key
        return node, key

    def get_value(self, path, default=None):
        node, key = self.find_config_node(path)
        return default if node is None else node.get(key, default)

    def is_true(self, path):
        v = self.get_value(path)
        return v is not None and v != "auto" and bool(v)

    def is_false(self, path):
        v = self.get_value(path)
        return v is not None and not bool(v)

    def is_auto(self, path):
        return self.get_value(path) == "auto"

    def is_zero3(self):
        return self.get_value("zero_optimization.stage") == 3


A = "auto"
CONFIGS = {
    # The HF Trainer's documentation: everything the Trainer knows is "auto".
    "trainer_docs_zero2": {
        "fp16": {"enabled": A, "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
                 "hysteresis": 2, "min_loss_scale": 1},
        "bf16": {"enabled": A},
        "optimizer": {"type": "AdamW", "params": {"lr": A, "betas": A, "eps": A, "weight_decay": A}},
        "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": A, "warmup_max_lr": A,
                                                          "warmup_num_steps": A, "total_num_steps": A}},
        "zero_optimization": {"stage": 2, "allgather_partitions": True, "allgather_bucket_size": 2e8,
                              "overlap_comm": True, "reduce_scatter": True, "reduce_bucket_size": A,
                              "contiguous_gradients": True},
        "gradient_accumulation_steps": A, "gradient_clipping": A, "steps_per_print": 2000,
        "train_batch_size": A, "train_micro_batch_size_per_gpu": A, "wall_clock_breakdown": False,
    },
    # LLaMA-Factory's examples/deepspeed style: batch, clipping and precision "auto", no optimizer
    # or scheduler (the Trainer builds them), optimizer offload.
    "llamafactory_style_z2_offload": {
        "train_batch_size": A, "train_micro_batch_size_per_gpu": A, "gradient_accumulation_steps": A,
        "gradient_clipping": A, "zero_allow_untested_optimizer": True,
        "fp16": {"enabled": A, "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
                 "hysteresis": 2, "min_loss_scale": 1},
        "bf16": {"enabled": A},
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                              "allgather_partitions": True, "allgather_bucket_size": 5e8, "overlap_comm": False,
                              "reduce_scatter": True, "reduce_bucket_size": 5e8, "contiguous_gradients": True,
                              "round_robin_gradients": True},
    },
    # transformers' tests style: WarmupLR, a cosine-free schedule, buckets written out.
    "transformers_tests_style_zero2": {
        "fp16": {"enabled": A, "loss_scale": 0, "loss_scale_window": 1000, "hysteresis": 2, "min_loss_scale": 1},
        "bf16": {"enabled": A},
        "optimizer": {"type": "AdamW", "params": {"lr": A, "betas": A, "eps": A, "weight_decay": A}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": A, "warmup_max_lr": A, "warmup_num_steps": A}},
        "zero_optimization": {"stage": 2, "allgather_partitions": True, "allgather_bucket_size": 2e8,
                              "overlap_comm": True, "reduce_scatter": True, "reduce_bucket_size": 2e8,
                              "contiguous_gradients": True, "cpu_offload": False},
        "gradient_accumulation_steps": A, "gradient_clipping": A, "train_batch_size": A,
        "train_micro_batch_size_per_gpu": A,
    },
    # A cosine schedule and a bucket from the model.
    "cosine_bucket_from_model": {
        "bf16": {"enabled": A},
        "optimizer": {"type": "AdamW", "params": {"lr": A, "betas": A, "eps": A, "weight_decay": A}},
        "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": A, "warmup_num_steps": A}},
        "zero_optimization": {"stage": 1, "reduce_bucket_size": A},
        "gradient_accumulation_steps": A, "gradient_clipping": A, "train_micro_batch_size_per_gpu": A,
    },
}

# TrainingArguments given by a training file (the LLaMA-Factory / axolotl importers set these).
GIVEN = {"learning_rate": 2e-5, "per_device_train_batch_size": 2, "gradient_accumulation_steps": 4,
         "max_grad_norm": 0.5, "weight_decay": 0.1, "adam_beta2": 0.95, "adam_epsilon": 1e-6,
         "warmup_steps": 0.1, "bf16": True}
HIDDEN_SIZE = 64
NUM_TRAINING_STEPS = 1000


def filled(config, given):
    d = {f.name: f.default for f in dataclasses.fields(TrainingArguments)}
    d.update(given)
    args = types.SimpleNamespace(**d)
    args.world_size = 1
    args.get_warmup_steps = lambda n: TrainingArguments.get_warmup_steps(args, n)
    f = Filler(copy.deepcopy(config))
    f.trainer_config_process(args)
    model = types.SimpleNamespace(config=types.SimpleNamespace(hidden_size=HIDDEN_SIZE))
    f.trainer_config_finalize(args, model, NUM_TRAINING_STEPS)
    assert not f.mismatches, f.mismatches
    return f.config


def main():
    names = [f.name for f in dataclasses.fields(TrainingArguments)]
    defaults = {f.name: f.default for f in dataclasses.fields(TrainingArguments)}
    keys = ["per_device_train_batch_size", "gradient_accumulation_steps", "max_grad_norm", "learning_rate",
            "adam_beta1", "adam_beta2", "adam_epsilon", "weight_decay", "warmup_steps", "fp16", "bf16"]
    assert all(k in names for k in keys)
    cases = []
    for name, config in CONFIGS.items():
        for label, given in (("defaults", {}), ("given", GIVEN)):
            cases.append({"name": f"{name}/{label}", "config": config, "given": given,
                          "filled": filled(config, given)})
    out = {"transformers": transformers.__version__, "hidden_size": HIDDEN_SIZE,
           "num_training_steps": NUM_TRAINING_STEPS,
           "training_arguments_defaults": {k: defaults[k] for k in keys}, "cases": cases}
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf_auto_cases.json")
    with open(path, "w") as fh:
        json.dump(out, fh, indent=1)
        fh.write("\n")
    print(f"wrote {path}: {len(cases)} cases (transformers {transformers.__version__})")


if __name__ == "__main__":
    main()
