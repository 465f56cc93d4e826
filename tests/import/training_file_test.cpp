// Training files of the tools people leave (import/training_file.h): LLaMA-Factory and axolotl
// YAMLs, their dataset files and DeepSpeed configs, written here in each tool's documented format
// (LLaMA-Factory's examples/train_full and data/dataset_info.json, axolotl's examples and dataset
// types), imported into recipes that load. The run's length is checked against the HF Trainer's
// count (transformers trainer.py: ceil(epochs x max(ceil(ceil(N / (micro x world)) / accumulation),
// 1))), written out here per case; the "auto" values against transformers' own filling
// (deepspeed_test.cpp, AutoIsWhatTheHfTrainerFills).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include <ciuic/error.h>

#include "../support/read_file.h"
#include "base/text.h"
#include "hostile.h"
#include "import/training_file.h"
#include "recipe/recipe.h"
#include "recipe/schema.h"
#include "sdk/toml_format.h"

namespace ciuic::importer {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

std::string value(const toml::table& t, const std::string& dotted) {
  const toml::node* n = t.at_path(dotted).node();
  return n ? format_value(*n) : "<absent>";
}

std::string line_of(const std::string& toml_text, const std::string& key) {
  for (const auto& l : text::split(toml_text, '\n'))
    if (l.rfind(key + " = ", 0) == 0) return l;
  return "<no line for " + key + ">";
}

std::string joined(const std::vector<std::string>& v) { return text::join(v, "\n"); }

// A folder per test: a small model (config.json, a Llama-3-style chat template), data and configs.
class TrainingFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("training_file_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    write(dir_ / "model/config.json",
          R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2})");
    write(
        dir_ / "model/tokenizer_config.json",
        R"({"chat_template": "{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] }}<|eot_id|>{% endfor %}"})");
  }

  TrainingImport run(TrainingTool tool, const std::string& yaml,
                     const std::vector<std::string>& sets = {}) {
    write(dir_ / "train.yaml", yaml);
    return import_training_file(tool, (dir_ / "train.yaml").string(), sets,
                                (dir_ / "out-data").string());
  }

  std::string error_of(TrainingTool tool, const std::string& yaml,
                       const std::vector<std::string>& sets = {}) {
    try {
      run(tool, yaml, sets);
    } catch (const UsageError& e) {
      EXPECT_EQ(e.exit_code(), kExitUsage);
      return e.what();
    }
    return "no error";
  }

  static toml::table parse(const TrainingImport& im) {
    try {
      Recipe::parse(im.recipe.toml, "imported");
      return toml::parse(im.recipe.toml);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "does not load: " << e.what() << "\n" << im.recipe.toml;
      return {};
    }
  }

  // LLaMA-Factory's data folder: dataset_info.json naming an alpaca JSON array (LLaMA-Factory's
  // default format and columns) and a sharegpt JSON-lines file with OpenAI-style tags.
  void llamafactory_data(size_t alpaca, size_t sharegpt) {
    json a = json::array();
    for (size_t i = 0; i < alpaca; ++i)
      a.push_back({{"instruction", "Add " + std::to_string(i) + " and 2."},
                   {"input", i % 2 ? "Show the steps." : ""},
                   {"output", std::to_string(i + 2)}});
    write(dir_ / "lf_data/alpaca_demo.json", a.dump(2));
    std::string lines;
    for (size_t i = 0; i < sharegpt; ++i)
      lines += json{{"messages",
                     {{{"role", "system"}, {"content", "Be brief."}},
                      {{"role", "user"}, {"content", "Hi " + std::to_string(i)}},
                      {{"role", "assistant"}, {"content", "Hello."}}}}}
                   .dump() +
               "\n";
    write(dir_ / "lf_data/chat_demo.jsonl", lines);
    write(dir_ / "lf_data/dataset_info.json", R"({
      "alpaca_demo": {"file_name": "alpaca_demo.json"},
      "chat_demo": {"file_name": "chat_demo.jsonl", "formatting": "sharegpt",
                    "columns": {"messages": "messages"},
                    "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user",
                             "assistant_tag": "assistant", "system_tag": "system"}},
      "hub_only": {"hf_hub_url": "someone/dataset"}
    })");
  }

  fs::path dir_;
};

// LLaMA-Factory's examples/deepspeed/ds_z2_offload_config.json style: everything "auto".
const char* kDsZ2Offload = R"({
  "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
  "gradient_clipping": "auto", "zero_allow_untested_optimizer": true,
  "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16, "hysteresis": 2,
           "min_loss_scale": 1},
  "bf16": {"enabled": "auto"},
  "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": true},
                        "allgather_partitions": true, "allgather_bucket_size": 5e8, "overlap_comm": false,
                        "reduce_scatter": true, "reduce_bucket_size": 5e8, "contiguous_gradients": true,
                        "round_robin_gradients": true}
})";

// LLaMA-Factory's examples/train_full/llama3_full_sft.yaml layout.
std::string llamafactory_yaml(const std::string& extra = "") {
  return R"(### model
model_name_or_path: model
trust_remote_code: true

### method
stage: sft
do_train: true
finetuning_type: full
deepspeed: ds_z2_offload_config.json

### dataset
dataset: alpaca_demo,chat_demo
dataset_dir: lf_data
template: llama3
cutoff_len: 1024
max_samples: 1000
overwrite_cache: true
preprocessing_num_workers: 16

### output
output_dir: saves/llama3-8b/full/sft
logging_steps: 10
save_steps: 500
plot_loss: true
overwrite_output_dir: true
report_to: tensorboard

### train
per_device_train_batch_size: 2
gradient_accumulation_steps: 4
learning_rate: 1.0e-5
num_train_epochs: 3.0
lr_scheduler_type: cosine
warmup_ratio: 0.1
bf16: true
ddp_timeout: 180000000
lora_rank: 8
)" + extra;
}

TEST_F(TrainingFile, LlamaFactoryFullSftWithDeepSpeed) {
  llamafactory_data(10, 6);
  write(dir_ / "ds_z2_offload_config.json", kDsZ2Offload);
  const TrainingImport im = run(TrainingTool::kLlamaFactory, llamafactory_yaml());
  const toml::table t = parse(im);
  const std::string& r = im.recipe.toml;
  EXPECT_EQ(value(t, "model.path"),
            format_value(toml::value<std::string>((dir_ / "model").lexically_normal().string())));
  EXPECT_EQ(value(t, "model.chat_template"), "\"hf\"");
  EXPECT_TRUE(has(line_of(r, "chat_template"),
                  "template = llama3: the Llama 3 format, the model's own template"))
      << r;
  EXPECT_EQ(value(t, "model.activation_checkpointing"), "true");
  EXPECT_EQ(value(t, "train.seq_len"), "1024");
  // The batch from the training arguments through DeepSpeed's "auto".
  EXPECT_EQ(value(t, "train.micro_batch_size"), "2");
  EXPECT_EQ(value(t, "train.gradient_accumulation_steps"), "4");
  EXPECT_TRUE(
      has(line_of(r, "micro_batch_size"), "\"auto\" -> 2: train.yaml: per_device_train_batch_size"))
      << r;
  // 16 records, micro 2 x world 1: 8 batches, ceil(8 / 4) = 2 steps per epoch, 3 epochs: 6 steps.
  EXPECT_EQ(value(t, "train.max_steps"), "6");
  EXPECT_TRUE(
      has(line_of(r, "max_steps"), "epochs 3 (train.yaml: num_train_epochs) x 2 steps per epoch"))
      << r;
  EXPECT_EQ(value(t, "train.gradient_clipping"), "1.0");  // "auto" -> HF's max_grad_norm default
  EXPECT_TRUE(has(line_of(r, "gradient_clipping"),
                  "\"auto\" -> 1.0: HF TrainingArguments max_grad_norm default"));
  EXPECT_EQ(value(t, "precision.plugin"), "\"bf16\"");
  EXPECT_TRUE(has(r, "\"auto\" -> bf16: train.yaml: bf16"));
  EXPECT_EQ(value(t, "sharding.plugin"), "\"zero2\"");
  EXPECT_EQ(value(t, "optimizer.plugin"), "\"cpu_adam\"");  // offload_optimizer
  EXPECT_EQ(value(t, "optimizer.lr"), "1e-5");
  EXPECT_TRUE(has(line_of(r, "lr"), "train.yaml: learning_rate"));
  // cosine with warmup_ratio 0.1 of 6 steps: ceil(0.6) = 1.
  EXPECT_EQ(value(t, "scheduler.type"), "\"warmup_cosine\"");
  EXPECT_EQ(value(t, "scheduler.warmup_type"), "\"linear\"");
  EXPECT_EQ(value(t, "scheduler.warmup_num_steps"), "1");
  EXPECT_EQ(value(t, "scheduler.cos_min_ratio"), "0.0");
  EXPECT_EQ(value(t, "run.output_dir"), "\"saves/llama3-8b/full/sft\"");
  EXPECT_EQ(value(t, "log.every_steps"), "10");
  EXPECT_EQ(value(t, "log.tensorboard"), "true");
  EXPECT_EQ(value(t, "checkpoint.every_steps"), "500");
  EXPECT_EQ(value(t, "data.format"), "\"chat\"");
  EXPECT_EQ(value(t, "data.packing"), "false");
  EXPECT_EQ(value(t, "data.assistant_only_loss"), "true");
  // The converted data: alpaca rows as (instruction + "\n" + input, output), sharegpt with its
  // tags.
  ASSERT_EQ(im.written.size(), 2u);
  const auto lines = text::split(ciuic_test::slurp(im.written[0]), '\n');
  EXPECT_EQ(
      json::parse(lines[1]),
      json::parse(R"({"messages": [{"role": "user", "content": "Add 1 and 2.\nShow the steps."},
                                                               {"role": "assistant", "content": "3"}]})"));
  EXPECT_EQ(json::parse(lines[0])["messages"][0]["content"], "Add 0 and 2.");
  EXPECT_EQ(json::parse(text::split(ciuic_test::slurp(im.written[1]), '\n')[0])["messages"][0],
            json::parse(R"({"role": "system", "content": "Be brief."})"));
  EXPECT_EQ(value(t, "data.sources"),
            "[" + format_value(toml::value<std::string>(im.written[0])) + ", " +
                format_value(toml::value<std::string>(im.written[1])) + "]");
  // Listed: the keys without a ciuic meaning, with their reasons; the LoRA key with LoRA's.
  const std::string ignored = joined(im.recipe.ignored);
  for (const char* k :
       {"plot_loss: ciuic-run --plot", "overwrite_cache: ciuic tokenizes once",
        "ddp_timeout:", "lora_rank: a LoRA/freeze key: LoRA is not built in ciuic yet",
        "ds_z2_offload_config.json: zero_optimization.allgather_bucket_size"})
    EXPECT_TRUE(has(ignored, k)) << k << "\n" << ignored;
  EXPECT_TRUE(has(joined(im.recipe.notes), "the world size is 1, the recipe's [cluster] default"));
  EXPECT_TRUE(im.recipe.placeholders.empty()) << joined(im.recipe.placeholders);

  // Two processes: 4 batches per epoch, 1 step, 3 steps.
  const toml::table t2 =
      parse(run(TrainingTool::kLlamaFactory, llamafactory_yaml(), {"cluster.nproc_per_node=2"}));
  EXPECT_EQ(value(t2, "train.max_steps"), "3");
  // max_steps wins over epochs; --set over both.
  EXPECT_EQ(value(parse(run(TrainingTool::kLlamaFactory, llamafactory_yaml("max_steps: 40\n"))),
                  "train.max_steps"),
            "40");
  EXPECT_EQ(
      value(parse(run(TrainingTool::kLlamaFactory, llamafactory_yaml(), {"train.max_steps=7"})),
            "train.max_steps"),
      "7");
}

TEST_F(TrainingFile, LlamaFactoryWithoutDeepSpeedIsTheTrainersOwnRun) {
  llamafactory_data(20, 0);
  std::string y = llamafactory_yaml();
  y = text::join(text::split(y, '\n'), "\n");
  y.replace(y.find("deepspeed: ds_z2_offload_config.json"), 36, "max_grad_norm: 0.5");
  y.replace(y.find("dataset: alpaca_demo,chat_demo"), 30, "dataset: alpaca_demo");
  y.replace(y.find("lr_scheduler_type: cosine"), 25, "lr_scheduler_type: linear");
  const TrainingImport im =
      run(TrainingTool::kLlamaFactory, y + "val_size: 0.1\nweight_decay: 0.01\n");
  const toml::table t = parse(im);
  EXPECT_EQ(value(t, "sharding.plugin"), "\"ddp\"");
  EXPECT_EQ(value(t, "optimizer.plugin"), "\"adamw\"");
  EXPECT_EQ(value(t, "optimizer.weight_decay"), "0.01");
  EXPECT_EQ(value(t, "optimizer.betas"), "[0.9, 0.999]");
  EXPECT_EQ(value(t, "train.gradient_clipping"), "0.5");  // the Trainer clips to max_grad_norm
  EXPECT_EQ(value(t, "precision.plugin"), "\"bf16\"");
  EXPECT_EQ(value(t, "train.micro_batch_size"), "2");
  // 20 records, 0.1 held out: 18; 9 batches; ceil(9 / 4) = 3 per epoch; 9 steps; warmup ceil(0.9)
  // = 1.
  EXPECT_EQ(value(t, "data.eval_fraction"), "0.1");
  EXPECT_EQ(value(t, "train.max_steps"), "9");
  EXPECT_EQ(value(t, "scheduler.type"), "\"warmup_decay\"");
  EXPECT_EQ(value(t, "scheduler.warmup_min_lr"), "0.0");
  EXPECT_EQ(value(t, "scheduler.warmup_max_lr"), "1e-5");
  EXPECT_EQ(value(t, "scheduler.warmup_num_steps"), "1");
  EXPECT_EQ(value(t, "scheduler.warmup_type"), "\"linear\"");
  EXPECT_FALSE(has(line_of(im.recipe.toml, "gradient_clipping"), "DeepSpeed")) << im.recipe.toml;
  EXPECT_TRUE(has(im.recipe.toml,
                  "# Imported by ciuic-run --from-llamafactory train.yaml (docs/migrate.md)."));
}

TEST_F(TrainingFile, LlamaFactoryRefusalsAndMismatches) {
  llamafactory_data(4, 2);
  write(dir_ / "ds_z2_offload_config.json", kDsZ2Offload);
  const auto with = [&](const std::string& from, const std::string& to) {
    std::string y = llamafactory_yaml();
    y.replace(y.find(from), from.size(), to);
    return y;
  };
  std::string e =
      error_of(TrainingTool::kLlamaFactory, with("finetuning_type: full", "finetuning_type: lora"));
  EXPECT_TRUE(
      has(e, "train.yaml: finetuning_type: lora: LoRA, freeze and OFT are not built in ciuic yet"))
      << e;
  EXPECT_FALSE(fs::exists(dir_ / "out-data")) << "nothing is written before the file is accepted";
  e = error_of(TrainingTool::kLlamaFactory, with("stage: sft", "stage: dpo"));
  EXPECT_TRUE(has(e, "stage: dpo: ciuic fine-tunes with next-token loss")) << e;
  e = error_of(TrainingTool::kLlamaFactory, with("template: llama3", "template: alpaca"));
  EXPECT_TRUE(has(e, "template: alpaca: ciuic has no such template")) << e;
  EXPECT_TRUE(has(e, "--set model.chat_template=hf|deepseek|plain")) << e;
  // --set picks the template instead.
  EXPECT_EQ(
      value(parse(run(TrainingTool::kLlamaFactory, with("template: llama3", "template: alpaca"),
                      {"model.chat_template=plain"})),
            "model.chat_template"),
      "\"plain\"");
  // A template that is a model family's own, but not this model's.
  e = error_of(TrainingTool::kLlamaFactory, with("template: llama3", "template: qwen"));
  EXPECT_TRUE(
      has(e, "qwen is the ChatML (Qwen, Yi, Phi-4) chat format, and the model's own template"))
      << e;
  EXPECT_EQ(
      value(parse(run(TrainingTool::kLlamaFactory, with("template: llama3", "template: deepseek"))),
            "model.chat_template"),
      "\"deepseek\"");
  e = error_of(TrainingTool::kLlamaFactory,
               with("lr_scheduler_type: cosine", "lr_scheduler_type: polynomial"));
  EXPECT_TRUE(has(e, "lr_scheduler_type: polynomial: ciuic's schedules are")) << e;
  e = error_of(TrainingTool::kLlamaFactory,
               llamafactory_yaml("optim: adafactor\nquantization_bit: 4\n"));
  EXPECT_TRUE(has(e, "optim: adafactor: ciuic implements AdamW")) << e;
  EXPECT_TRUE(has(e, "quantization_bit: quantized models")) << e;
  // A DeepSpeed value that is not "auto" and differs from the training arguments: the HF Trainer
  // refuses it.
  std::string ds = kDsZ2Offload;
  ds.replace(ds.find("\"gradient_accumulation_steps\": \"auto\""), 37,
             "\"gradient_accumulation_steps\": 8");
  write(dir_ / "ds_z2_offload_config.json", ds);
  e = error_of(TrainingTool::kLlamaFactory, llamafactory_yaml());
  EXPECT_TRUE(has(e, "differ from the training arguments")) << e;
  EXPECT_TRUE(has(e,
                  "gradient_accumulation_steps = 8 but gradient_accumulation_steps = 4 "
                  "(train.yaml: gradient_accumulation_steps)"))
      << e;
  // A dataset that is not local: a placeholder, and the length is asked for.
  write(dir_ / "ds_z2_offload_config.json", kDsZ2Offload);
  const TrainingImport hub =
      run(TrainingTool::kLlamaFactory, with("dataset: alpaca_demo,chat_demo", "dataset: hub_only"));
  const std::string ph = joined(hub.recipe.placeholders);
  EXPECT_TRUE(has(ph, "data.sources") && has(ph, "train.max_steps")) << ph;
  EXPECT_TRUE(has(joined(hub.recipe.notes), "give --set train.max_steps=N"));
  // Bad values name the key and line.
  e = error_of(TrainingTool::kLlamaFactory, with("cutoff_len: 1024", "cutoff_len: long"));
  EXPECT_TRUE(has(e, "cutoff_len (line 15, column 13): expected an integer, found long")) << e;
  // A bad data record names its file and record.
  write(dir_ / "lf_data/alpaca_demo.json",
        R"([{"instruction": "a", "output": "b"}, {"instruction": "c"}])");
  e = error_of(TrainingTool::kLlamaFactory,
               with("dataset: alpaca_demo,chat_demo", "dataset: alpaca_demo"));
  EXPECT_TRUE(has(e, "alpaca_demo.json: record 1: \"output\" is not a string")) << e;
}

// axolotl's examples/llama-3 layout (no DeepSpeed), with its dataset types.
TEST_F(TrainingFile, AxolotlFullFineTune) {
  json alpaca = json::array();
  for (int i = 0; i < 7; ++i)
    alpaca.push_back({{"instruction", "Q" + std::to_string(i)}, {"input", ""}, {"output", "A"}});
  write(dir_ / "data/alpaca.json", alpaca.dump());
  std::string chat;
  for (int i = 0; i < 5; ++i)
    chat += json{{"conversations",
                  {{{"from", "human"}, {"value", "Hi"}}, {{"from", "gpt"}, {"value", "Hey"}}}}}
                .dump() +
            "\n";
  write(dir_ / "data/chat.jsonl", chat);
  const std::string y = R"(base_model: model
model_type: LlamaForCausalLM
tokenizer_type: AutoTokenizer
load_in_8bit: false
load_in_4bit: false
strict: false
chat_template: llama3
datasets:
  - path: data/alpaca.json
    type: alpaca
  - path: data/chat.jsonl
    type: chat_template
    field_messages: conversations
    message_property_mappings:
      role: from
      content: value
dataset_prepared_path: last_run_prepared
val_set_size: 0.0
output_dir: ./outputs/out
sequence_len: 512
sample_packing: false
pad_to_sequence_len: true
wandb_project:
gradient_accumulation_steps: 2
micro_batch_size: 2
num_epochs: 2
optimizer: adamw_bnb_8bit
lr_scheduler: cosine
cosine_min_lr_ratio: 0.1
learning_rate: 2e-5
train_on_inputs: false
bf16: auto
tf32: false
gradient_checkpointing: true
flash_attention: true
warmup_steps: 3
logging_steps: 1
saves_per_epoch: 1
weight_decay: 0.0
lora_r: 16
special_tokens:
  pad_token: <|end_of_text|>
)";
  const TrainingImport im = run(TrainingTool::kAxolotl, y);
  const toml::table t = parse(im);
  EXPECT_EQ(value(t, "model.chat_template"), "\"hf\"");
  EXPECT_EQ(value(t, "train.seq_len"), "512");
  EXPECT_EQ(value(t, "train.micro_batch_size"), "2");
  EXPECT_EQ(value(t, "train.gradient_accumulation_steps"), "2");
  // 12 records, micro 2: 6 batches, ceil(6 / 2) = 3 per epoch, 2 epochs: 6 steps; a checkpoint per
  // epoch.
  EXPECT_EQ(value(t, "train.max_steps"), "6");
  EXPECT_EQ(value(t, "checkpoint.every_steps"), "3");
  EXPECT_EQ(value(t, "optimizer.lr"),
            "2e-5");  // "2e-5" is a YAML string; axolotl reads it as a number
  EXPECT_EQ(value(t, "optimizer.plugin"), "\"adamw\"");
  EXPECT_EQ(value(t, "scheduler.type"), "\"warmup_cosine\"");
  EXPECT_EQ(value(t, "scheduler.cos_min_ratio"), "0.1");
  EXPECT_EQ(value(t, "scheduler.warmup_num_steps"), "3");
  EXPECT_EQ(value(t, "precision.plugin"), "\"bf16\"");
  EXPECT_EQ(value(t, "train.gradient_clipping"), "1.0");
  EXPECT_EQ(value(t, "model.activation_checkpointing"), "true");
  EXPECT_EQ(value(t, "log.every_steps"), "1");
  ASSERT_EQ(im.written.size(), 2u);
  EXPECT_EQ(
      json::parse(text::split(ciuic_test::slurp(im.written[1]), '\n')[0]),
      json::parse(
          R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hey"}]})"));
  const std::string notes = joined(im.recipe.notes), ignored = joined(im.recipe.ignored);
  EXPECT_TRUE(has(notes, "optimizer = adamw_bnb_8bit -> ciuic's AdamW")) << notes;
  EXPECT_TRUE(has(notes, "type alpaca: axolotl writes these rows in its Alpaca prompt")) << notes;
  for (const char* k : {"flash_attention: ciuic's attention kernels", "lora_r: a LoRA/freeze key",
                        "strict:", "special_tokens: ciuic uses the tokenizer's own special tokens",
                        "pad_to_sequence_len:"})
    EXPECT_TRUE(has(ignored, k)) << k << "\n" << ignored;

  std::string e = error_of(TrainingTool::kAxolotl, y + "adapter: lora\n");
  EXPECT_TRUE(has(e, "adapter: lora: LoRA and QLoRA adapters are not built in ciuic yet")) << e;
  std::string q = y;
  q.replace(q.find("load_in_4bit: false"), 19, "load_in_4bit: true");
  EXPECT_TRUE(
      has(error_of(TrainingTool::kAxolotl, q), "load_in_4bit: quantized models are not supported"));
  std::string c = y;
  c.replace(c.find("type: alpaca"), 12, "type: input_output");
  EXPECT_TRUE(has(error_of(TrainingTool::kAxolotl, c),
                  "datasets[0].type: input_output: ciuic converts the types"));
}

// Keys and values of a training file are untrusted: they reach the recipe as comments and literals.
TEST_F(TrainingFile, HostileKeysAndValuesStayData) {
  llamafactory_data(3, 0);
  const std::string clean =
      "model_name_or_path: model\nstage: sft\nfinetuning_type: full\ndataset: alpaca_demo\n"
      "dataset_dir: lf_data\ntemplate: llama3\n";
  const TrainingImport ref = run(TrainingTool::kLlamaFactory, clean);
  std::string y = clean;
  for (const std::string& h : hostile_strings())
    // A double-quoted YAML scalar holds a JSON string with every non-ASCII character escaped.
    // (an explicit key: an implicit one is at most 1024 characters long).
    y += "? " + json(h).dump(-1, ' ', true) + "\n: " + json(h).dump(-1, ' ', true) + "\n";
  y += "output_dir: " + json("out\n[run]\nplugin_paths = [\"x\"]\x1b[0m").dump() + "\n";
  const TrainingImport im = run(TrainingTool::kLlamaFactory, y);
  const auto keys = [](const std::string& text) {
    std::set<std::string> out;
    std::function<void(const toml::table&, const std::string&)> walk = [&](const toml::table& t,
                                                                           const std::string& p) {
      for (auto&& [k, v] : t) {
        const std::string path = p.empty() ? std::string(k.str()) : p + "." + std::string(k.str());
        out.insert(path);
        if (const toml::table* sub = v.as_table()) walk(*sub, path);
      }
    };
    walk(toml::parse(text), "");
    return out;
  };
  std::set<std::string> want = keys(ref.recipe.toml);
  want.insert("run");
  want.insert("run.output_dir");
  EXPECT_EQ(keys(im.recipe.toml), want);
  EXPECT_EQ(toml::parse(im.recipe.toml).at_path("run.output_dir").value<std::string>().value_or(""),
            "out\n[run]\nplugin_paths = [\"x\"]\x1b[0m");
  EXPECT_EQ(unsafe_byte(im.recipe.toml, true), "");
  for (const auto* list : {&im.recipe.ignored, &im.recipe.notes, &im.recipe.placeholders})
    for (const auto& line : *list) EXPECT_EQ(unsafe_byte(line, false), "") << line;
  EXPECT_EQ(im.recipe.ignored.size(), ref.recipe.ignored.size() + hostile_strings().size());
  // A YAML bomb in a training file: refused, nothing written.
  std::string bomb = "a: &a [x,x,x,x,x,x,x,x,x,x]\n";
  for (char ch = 'b'; ch <= 'h'; ++ch)
    bomb += std::string(1, ch) + ": &" + ch + " [*" + char(ch - 1) + ",*" + char(ch - 1) + ",*" +
            char(ch - 1) + ",*" + char(ch - 1) + ",*" + char(ch - 1) + ",*" + char(ch - 1) + ",*" +
            char(ch - 1) + ",*" + char(ch - 1) + ",*" + char(ch - 1) + ",*" + char(ch - 1) + "]\n";
  fs::remove_all(dir_ / "out-data");
  EXPECT_TRUE(has(error_of(TrainingTool::kLlamaFactory, clean + bomb), "an alias bomb?"));
  EXPECT_FALSE(fs::exists(dir_ / "out-data"));
}

}  // namespace
}  // namespace ciuic::importer
