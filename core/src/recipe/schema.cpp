// The core recipe schema and the section validator.
#include "recipe/schema.h"

#include <charconv>
#include <cmath>
#include <sstream>

#include <ciuic/error.h>

#include "base/text.h"

namespace ciuic::recipe {

namespace {

using P = KeySpec::Presence;

// Small builder so that the schema below reads as a table.
struct K {
  KeySpec s;
  K(const char* key, OptionType type, const char* def, const char* help) {
    s.key = key;
    s.type = type;
    s.help = help;
    if (def) {
      s.default_literal = def;
    } else {
      s.presence = P::kRequired;
    }
  }
  K& optional() {
    s.presence = P::kOptional;
    return *this;
  }
  K& min(double v, bool exclusive = false) {
    s.min = v;
    s.min_exclusive = exclusive;
    return *this;
  }
  K& max(double v, bool exclusive = false) {
    s.max = v;
    s.max_exclusive = exclusive;
    return *this;
  }
  K& choices(const char* c) {
    s.choices = c;
    return *this;
  }
  K& size(size_t n) {
    s.list_size = n;
    return *this;
  }
  K& or_auto() {
    s.or_auto = true;
    return *this;
  }
  operator KeySpec() const { return s; }  // NOLINT: builder
};

constexpr auto kB = OptionType::kBool;
constexpr auto kI = OptionType::kInt;
constexpr auto kF = OptionType::kFloat;
constexpr auto kS = OptionType::kString;
constexpr auto kSL = OptionType::kStringList;
constexpr auto kFL = OptionType::kFloatList;

SectionSpec slot_section(const char* name, const char* help, const char* plugin_help,
                         bool required) {
  SectionSpec s{name, help, {}, true};
  // Defaults come from the table of default plugins in recipe.cpp (comm depends on [cluster]
  // device).
  K plugin("plugin", kS, required ? nullptr : "", plugin_help);
  s.keys.push_back(required ? KeySpec(plugin) : KeySpec(plugin.optional()));
  return s;
}

std::vector<SectionSpec> build_core_schema() {
  std::vector<SectionSpec> v;
  v.push_back(
      {"run",
       "naming, output folder, seed, plugin search paths, log level",
       {
           K("name", kS, "\"run\"", "name of the run (used in the default output_dir)"),
           K("output_dir", kS, nullptr,
             "output folder (relative to the working directory); default runs/<name>")
               .optional(),
           K("seed", kI, "1234", "seed of every random generator (init, data order, dropout)")
               .min(0),
           K("plugin_paths", kSL, "[]",
             "extra plugin folders (relative to the recipe's folder), searched after "
             "--plugin-path"),
           K("log_level", kS, "\"info\"", "least severe log level printed")
               .choices("debug|info|warning|error"),
           K("setup", kS, "\"\"",
             "how this recipe's input files are made (a command); shown with an error about a "
             "missing input"),
       }});
  v.push_back(
      {"cluster",
       "processes, device, memory cap, timeouts",
       {
           K("nproc_per_node", kI, "1", "worker processes on each node (one per GPU)").min(1),
           K("nnodes", kI, "1", "number of nodes").min(1),
           K("device", kS, "\"cpu\"", "device to compute on").choices("cpu|cuda"),
           K("memory_per_device_gib", kF, "0.0",
             "memory cap per device in GiB (CUDA caching allocator; the planner); 0 = no cap")
               .min(0),
           // At most a week: 1e300 passed validation and failed inside gloo (issue 16 item 6).
           K("timeout_s", kF, "600.0", "rendezvous and collective timeout in seconds")
               .min(0, true)
               .max(604800),
           K("output", kS, "\"rank0\"", "whose output the launcher shows").choices("rank0|all"),
       }});
  v.push_back(
      {"model",
       "model folder or inline architecture, tokenizer, chat template",
       {
           K("path", kS, "\"\"",
             "Hugging Face model folder (config.json + safetensors); \"\" = random init from "
             "[model.config]"),
           K("tokenizer", kS, "\"\"",
             "tokenizer.json; \"\" = <path>/tokenizer.json when path is set"),
           K("chat_template", kS, "\"plain\"",
             "chat template for chat data: hf (the model's own, tokenizer_config.json), auto (hf "
             "if the model has one, else plain), deepseek, plain"),
           K("activation_checkpointing", kB, "false",
             "recompute layer activations in backward to save memory"),
           K("checkpoint_layers", kI, "0",
             "with activation_checkpointing: checkpoint only the first N decoder layers (the rest "
             "keep their "
             "activations: less recomputation where memory allows); 0 = all; \"auto\" = the fewest "
             "that the "
             "memory plan fits in 92% of the device (or of [cluster] memory_per_device_gib)")
               .min(0)
               .or_auto(),
           K("init_std", kF, "0.02", "standard deviation of the random initialisation").min(0),
           K("fused_kernels", kS, "\"auto\"",
             "fused CUDA kernels for rotary embedding and SwiGLU: auto (where the build and device "
             "have them), on (required: "
             "an error where they are missing), off (ATen compositions)")
               .choices("auto|on|off"),
           K("loss_backward", kS, "\"in_forward\"",
             "loss gradient: in_forward (computed with the loss, no recomputed logits; holds vocab "
             "x hidden of gradient "
             "from forward to backward), recompute (logits recomputed in backward: one more "
             "matmul, less memory)")
               .choices("in_forward|recompute"),
       }});
  v.push_back(
      {"model.config",
       "HF config.json keys overriding (or, without a path, defining) the architecture",
       {
           K("model_type", kS, nullptr,
             "architecture family (docs/finetune.md, Model families); default llama")
               .optional()
               .choices("llama|mistral|qwen2|qwen3|gemma3_text"),
           K("hidden_size", kI, nullptr, "width of the residual stream").optional().min(1),
           K("intermediate_size", kI, nullptr, "width of the SwiGLU MLP").optional().min(1),
           K("num_hidden_layers", kI, nullptr, "number of transformer layers").optional().min(1),
           K("num_attention_heads", kI, nullptr, "query heads").optional().min(1),
           K("num_key_value_heads", kI, nullptr, "key/value heads (grouped-query attention)")
               .optional()
               .min(1),
           K("head_dim", kI, nullptr, "per-head width; default hidden_size / num_attention_heads")
               .optional()
               .min(1),
           K("vocab_size", kI, nullptr, "vocabulary size").optional().min(1),
           K("max_position_embeddings", kI, nullptr, "longest sequence the model supports")
               .optional()
               .min(1),
           K("rope_theta", kF, nullptr, "rotary embedding base").optional().min(0, true),
           K("rms_norm_eps", kF, nullptr, "RMSNorm epsilon").optional().min(0, true),
           K("tie_word_embeddings", kB, nullptr, "share the input embedding with the output head")
               .optional(),
           K("bos_token_id", kI, nullptr, "beginning-of-sequence token id").optional().min(0),
           K("eos_token_id", kI, nullptr, "end-of-sequence token id").optional().min(0),
           K("pad_token_id", kI, nullptr,
             "padding token id (the embedding row without gradient; < 0 counts from the end)")
               .optional(),
           K("sliding_window", kI, nullptr,
             "windowed layers attend to this many last positions (mistral, qwen2/3, gemma3_text)")
               .optional()
               .min(1),
           K("use_sliding_window", kB, nullptr,
             "qwen2/qwen3: window the layers from max_window_layers on")
               .optional(),
           K("max_window_layers", kI, nullptr,
             "qwen2/qwen3: first windowed layer with use_sliding_window")
               .optional()
               .min(0),
           K("sliding_window_pattern", kI, nullptr,
             "gemma3_text: every N-th layer attends to all positions")
               .optional()
               .min(1),
           K("query_pre_attn_scalar", kF, nullptr,
             "gemma3_text: attention scores scaled by its -1/2 power")
               .optional()
               .min(0, true),
           K("rope_local_base_freq", kF, nullptr, "gemma3_text: rotary base of the windowed layers")
               .optional()
               .min(0, true),
           K("rope_scaling_type", kS, nullptr, "rotary scaling: none or linear")
               .optional()
               .choices("none|linear"),
           K("rope_scaling_factor", kF, nullptr, "linear rotary scaling factor (1 = none)")
               .optional()
               .min(0, true),
       }});
  v.push_back(
      {"train",
       "batch shape, length of the run, clipping, evaluation, non-finite losses",
       {
           K("micro_batch_size", kI, "1",
             "sequences per rank per forward/backward; \"auto\" = the largest that divides "
             "global_batch_size / ranks "
             "and whose memory plan fits 92% of the device (or of [cluster] memory_per_device_gib)")
               .min(1)
               .or_auto(),
           K("gradient_accumulation_steps", kI, "1",
             "micro-batches per optimizer step (with micro_batch_size = \"auto\": derived, this "
             "key is not read)")
               .min(1),
           K("global_batch_size", kI, "0",
             "sequences per optimizer step over all ranks; 0 = micro_batch_size x "
             "gradient_accumulation_steps x ranks; "
             "required with micro_batch_size = \"auto\"")
               .min(0)
               .max(16777216),
           K("seq_len", kI, "512", "tokens per sequence").min(1),
           K("max_steps", kI, nullptr, "optimizer steps to run").min(1),
           K("gradient_clipping", kF, "1.0", "clip the global gradient L2 norm to this; 0 = off")
               .min(0),
           K("eval_every_steps", kI, "0", "evaluate on the held-out split every N steps; 0 = never")
               .min(0),
           K("eval_batches", kI, "0", "micro-batches per evaluation; 0 = the whole split").min(0),
           K("nonfinite", kS, "\"stop\"", "on a non-finite loss: stop the run, or skip the step")
               .choices("stop|skip"),
           K("max_nonfinite_skips", kI, "10",
             "with nonfinite = skip: stop after this many skipped steps")
               .min(0),
           K("exact_match_file", kS, "\"\"",
             "chat JSONL of held-out questions: greedy answers are scored by exact match before "
             "and after training; \"\" = off"),
           K("exact_match_limit", kI, "0", "questions scored from exact_match_file; 0 = all")
               .min(0),
           K("exact_match_max_new_tokens", kI, "32", "longest greedy answer generated").min(1),
           K("exact_match_batch_size", kI, "16",
             "questions answered together, batched by prompt length (left-padded batches with a "
             "KV cache, the same greedy answers; the KV cache holds batch x (longest prompt + "
             "exact_match_max_new_tokens) positions); 1 = one at a time, its response time "
             "measured alone")
               .min(1),
           K("exact_match_every_steps", kI, "0",
             "also run the exact_match_file evaluation every N steps (records with when = "
             "\"during\"); 0 = only before and after")
               .min(0),
           K("eval_metrics", kSL, "[\"exact_match\", \"bleu\", \"rouge_l\", \"response_time\"]",
             "what the exact_match_file evaluation reports: exact_match, bleu (corpus BLEU, "
             "sacrebleu's), rouge_l "
             "(rouge-score's ROUGE-L F, mean over questions), response_time (time to first token "
             "and tokens/s per "
             "answer, median and p90)"),
           K("bleu_tokenize", kS, "\"13a\"",
             "BLEU tokenizer, sacrebleu's: 13a (its default), zh (Chinese), none")
               .choices("13a|zh|none"),
           K("rouge_use_stemmer", kB, "false",
             "ROUGE-L as rouge-score's use_stemmer=True: tokens of more than 3 letters stemmed by "
             "NLTK's Porter stemmer"),
       }});

  v.push_back(
      {"scheduler",
       "learning-rate schedule (DeepSpeed's names and meanings)",
       {
           K("type", kS, "\"constant\"", "schedule")
               .choices("constant|warmup|warmup_decay|warmup_cosine"),
           K("warmup_min_lr", kF, "0.0", "learning rate at step 0 (warmup, warmup_decay)").min(0),
           K("warmup_max_lr", kF, "-1.0", "learning rate after warmup; -1 = [optimizer] lr")
               .min(-1),
           K("warmup_num_steps", kI, "0", "warmup steps").min(0),
           K("warmup_type", kS, "\"log\"", "warmup curve").choices("log|linear"),
           K("total_num_steps", kI, "0",
             "steps of the whole schedule (decay/cosine); 0 = [train] max_steps")
               .min(0),
           K("warmup_min_ratio", kF, "0.0", "warmup_cosine: start lr as a fraction of the peak")
               .min(0)
               .max(1),
           K("cos_min_ratio", kF, "1e-4", "warmup_cosine: final lr as a fraction of the peak")
               .min(0)
               .max(1),
       }});
  v.push_back(slot_section("comm", "communication backend plugin and its options",
                           "comm plugin; default gloo (device cpu) or nccl (device cuda)", false));
  v.push_back(slot_section("sharding", "optimizer sharding plugin and its options",
                           "sharding plugin; default ddp", false));
  {
    SectionSpec o = slot_section(
        "optimizer", "optimizer plugin, learning rate, weight decay, and the plugin's options",
        "optimizer plugin; default adamw (on the device); cpu_adam keeps the "
        "state in host memory",
        false);
    o.keys.push_back(K("lr", kF, "1e-4", "peak learning rate (the schedule's)").min(0));
    o.keys.push_back(K("weight_decay", kF, "0.0", "decoupled weight decay (matrices only)").min(0));
    v.push_back(std::move(o));
  }
  v.push_back(slot_section("precision", "precision policy plugin and its options",
                           "precision plugin; default fp32", false));
  v.push_back(
      slot_section("data", "data source plugin and its options", "data plugin (required)", true));
  v.push_back(
      {"adapter",
       "LoRA adapter: frozen base, trained low-rank adapters (docs/finetune.md, LoRA)",
       {
           K("type", kS, "\"none\"", "none (train every parameter) or lora").choices("none|lora"),
           K("r", kI, "8", "LoRA rank").min(0, true),
           K("alpha", kF, "8.0",
             "LoRA alpha: the adapter's output is scaled by alpha / r (alpha / sqrt(r) with "
             "use_rslora)")
               .min(0, true),
           K("dropout", kF, "0.0",
             "dropout on the adapters' input while training (PEFT's lora_dropout)")
               .min(0)
               .max(1, true),
           K("target_modules", kSL, "[\"q_proj\", \"v_proj\"]",
             "linear modules given adapters by PEFT's names: q_proj k_proj v_proj o_proj gate_proj "
             "up_proj down_proj, or "
             "\"all-linear\""),
           K("use_rslora", kB, "false", "rank-stabilised scaling alpha / sqrt(r)"),
           K("init", kS, "\"default\"",
             "A's initialisation: default (Kaiming-uniform, PEFT's) or gaussian (normal, std 1/r); "
             "B is zero")
               .choices("default|gaussian"),
           K("modules_to_save", kSL, "[]",
             "modules trained fully beside the adapters: embed_tokens, lm_head"),
           K("init_from", kS, "\"\"",
             "a PEFT adapter folder (adapter_config.json + adapter_model.safetensors) the run "
             "starts from instead of a fresh init; its r, alpha, targets and modules_to_save "
             "fill the keys left unset, a key set to another value is refused"),
           K("base_quantization", kS, "\"\"",
             "frozen base stored quantized: \"\" (none) or nf4 (QLoRA: every decoder linear weight "
             "in 4-bit NormalFloat, blocks of 64, double-quantized scales, as bitsandbytes)"),
       }});
  v.push_back(
      {"checkpoint",
       "checkpoint folder, frequency, retention, Hugging Face export",
       {
           K("dir", kS, "\"\"", "checkpoint folder; \"\" = <output_dir>/checkpoints"),
           K("every_steps", kI, "0",
             "save every N optimizer steps; 0 = only at the end and on signals")
               .min(0),
           K("keep_last", kI, "3", "checkpoints kept; 0 = keep all").min(0),
           K("export_hf", kB, "false", "export a Hugging Face folder at the end of the run"),
           K("export_dtype", kS, "\"bf16\"", "dtype of the exported weights").choices("bf16|fp32"),
           K("on_signal", kB, "true", "save a checkpoint on SIGINT/SIGTERM before exiting"),
           K("save_final", kB, "true", "save a checkpoint at the end of the run"),
       }});
  v.push_back(
      {"log",
       "metrics and progress output",
       {
           K("every_steps", kI, "1", "log metrics every N optimizer steps").min(1),
           K("metrics_file", kS, "\"metrics.jsonl\"",
             "metrics file (JSON lines), relative to output_dir"),
           K("progress", kS, "\"auto\"", "progress line: auto (when stderr is a terminal), on, off")
               .choices("auto|on|off"),
           K("peak_tflops", kF, "0.0", "device peak TFLOP/s for MFU; 0 = from the GPU name table")
               .min(0),
           K("tensorboard", kB, "false", "also write TensorBoard event files to <output_dir>/tb"),
           K("profile_start_step", kI, "0",
             "profile from this optimizer step (Kineto: Chrome trace and a GPU time table by "
             "category in "
             "<output_dir>/profile); 0 = off")
               .min(0),
           K("profile_steps", kI, "3", "steps profiled from profile_start_step").min(1),
           K("rank_records", kB, "true",
             "write every rank's figures (memory, device busy, link, data wait, step time) at each "
             "log step"),
           K("straggler_margin", kF, "0.2",
             "name a rank whose data wait + forward/backward exceeds the other ranks' median by "
             "this fraction; "
             "0 = never")
               .min(0)
               .max(100),
           K("straggler_log_steps", kI, "3", "... for this many log steps in a row").min(1),
       }});
  return v;
}

bool is_float_list_element(const toml::node& n) { return n.is_floating_point() || n.is_integer(); }

}  // namespace

const std::vector<SectionSpec>& core_schema() {
  static const std::vector<SectionSpec> kSchema = build_core_schema();
  return kSchema;
}

const SectionSpec* find_section(std::string_view name) {
  for (const auto& s : core_schema())
    if (s.name == name) return &s;
  return nullptr;
}

std::vector<std::string> section_names() {
  std::vector<std::string> out;
  for (const auto& s : core_schema()) out.push_back(s.name);
  return out;
}

std::vector<KnownSection> core_known_sections() {
  std::vector<KnownSection> out;
  for (const auto& s : core_schema()) {
    KnownSection k{s.name, {}};
    for (const auto& key : s.keys) k.keys.push_back(key.key);
    out.push_back(std::move(k));
  }
  return out;
}

KeySpec key_from_option(const OptionSpec& o) {
  KeySpec s;
  s.key = o.key ? o.key : "";
  s.type = o.type;
  if (o.default_value) {
    s.default_literal = o.default_value;
  } else {
    s.presence = P::kRequired;
  }
  s.help = o.help ? o.help : "";
  s.min = o.min;
  s.max = o.max;
  if (o.choices) s.choices = o.choices;
  if ((o.flags & kOptionPlanned) && o.type == OptionType::kInt)
    s.or_auto = true;  // the planner chooses
  return s;
}

const char* type_name(OptionType type) {
  switch (type) {
    case OptionType::kBool: return "boolean";
    case OptionType::kInt: return "integer";
    case OptionType::kFloat: return "float";
    case OptionType::kString: return "string";
    case OptionType::kStringList: return "list of strings";
    case OptionType::kFloatList: return "list of numbers";
  }
  return "unknown type";
}

std::string describe_expected(const KeySpec& s) {
  std::string out;
  switch (s.type) {
    case OptionType::kBool: return "a boolean (true or false)";
    case OptionType::kInt: out = "an integer"; break;
    case OptionType::kFloat: out = "a number"; break;
    case OptionType::kString:
      if (s.choices.empty()) return "a string";
      {
        std::vector<std::string> quoted;
        for (const auto& c : text::split(s.choices, '|')) quoted.push_back(toml_quote(c));
        return "one of " + text::join(quoted, ", ");
      }
    case OptionType::kStringList: out = "a list of strings"; break;
    case OptionType::kFloatList:
      out = "a list of";
      if (s.list_size) out += " " + std::to_string(s.list_size);
      out += " numbers";
      break;
  }
  if (s.type == OptionType::kStringList && s.list_size)
    out = "a list of " + std::to_string(s.list_size) + " strings";
  const bool has_min = !std::isnan(s.min), has_max = !std::isnan(s.max);
  std::string range;
  if (has_min && has_max) {
    range = std::string("in ") + (s.min_exclusive ? "(" : "[") + format_number(s.min) + ", " +
            format_number(s.max) + (s.max_exclusive ? ")" : "]");
  } else if (has_min) {
    range = std::string(s.min_exclusive ? "> " : ">= ") + format_number(s.min);
  } else if (has_max) {
    range = std::string(s.max_exclusive ? "< " : "<= ") + format_number(s.max);
  }
  if (!range.empty()) out += (s.type == OptionType::kFloatList ? ", each " : " ") + range;
  if (s.or_auto) out += " or \"auto\"";
  return out;
}

std::string default_text(const KeySpec& s) {
  switch (s.presence) {
    case P::kRequired: return "(required)";
    case P::kOptional: return "(unset)";
    case P::kDefault: break;
  }
  return s.default_literal;
}

std::string describe_found(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string: return "a string (" + format_value(node) + ")";
    case toml::node_type::integer: return "an integer (" + format_value(node) + ")";
    case toml::node_type::floating_point: return "a float (" + format_value(node) + ")";
    case toml::node_type::boolean: return "a boolean (" + format_value(node) + ")";
    case toml::node_type::array: return "an array (" + format_value(node) + ")";
    case toml::node_type::table: return "a table";
    default: return "a date/time (" + format_value(node) + ")";
  }
}

std::optional<toml::table> parse_literal(std::string_view literal) {
  if (literal.find('\n') != std::string_view::npos || literal.find('\r') != std::string_view::npos)
    return std::nullopt;
  try {
    toml::table t = toml::parse("v = " + std::string(literal), std::string("<literal>"));
    if (t.size() != 1 || !t.contains("v")) return std::nullopt;
    return t;
  } catch (const toml::parse_error&) {
    return std::nullopt;
  }
}

// ---- errors -------------------------------------------------------------------------------
void ErrorList::add(std::string_view where, std::string_view message) {
  std::string line;
  if (!where.empty()) {
    line += where;
    line += ": ";
  }
  line += message;
  for (const auto& l : lines_)
    if (l == line) return;  // the same problem reached twice (e.g. through two includes)
  lines_.push_back(std::move(line));
}

void ErrorList::append(const ErrorList& other) {
  for (const auto& l : other.lines_) {
    bool dup = false;
    for (const auto& m : lines_) dup = dup || m == l;
    if (!dup) lines_.push_back(l);
  }
}

void ErrorList::throw_if_any(std::string_view subject) const {
  if (lines_.empty()) return;
  if (lines_.size() == 1) throw UsageError(lines_[0]);
  std::string msg = std::string(subject) + " has " + std::to_string(lines_.size()) + " errors:";
  for (const auto& l : lines_) msg += "\n" + l;
  throw UsageError(msg);
}

// ---- validation ---------------------------------------------------------------------------
namespace {

// Checks one value against its spec; returns "" when fine, else what is wrong (without location).
// On success `out` holds the value to store (integers widened to floats for kFloat/kFloatList).
std::string check_value(const KeySpec& s, const toml::node& v, std::unique_ptr<toml::node>& out) {
  const std::string want = describe_expected(s);
  auto wrong_type = [&] {
    std::string m = "expected " + want + ", found " + describe_found(v);
    if (v.is_string() &&
        (s.type == OptionType::kInt || s.type == OptionType::kFloat ||
         s.type == OptionType::kBool) &&
        parse_literal(*v.value_exact<std::string>()))
      m += "; write the value without quotes";
    if (s.type == OptionType::kString && !v.is_string() && !v.is_table())
      m += "; strings are written in quotes";
    return m;
  };
  auto in_range = [&](double x) {
    if (!std::isfinite(x)) return false;
    if (!std::isnan(s.min) && (s.min_exclusive ? x <= s.min : x < s.min)) return false;
    if (!std::isnan(s.max) && (s.max_exclusive ? x >= s.max : x > s.max)) return false;
    return true;
  };
  auto range_error = [&] { return format_value(v) + " is out of range: expected " + want; };
  switch (s.type) {
    case OptionType::kBool:
      if (!v.is_boolean()) return wrong_type();
      out = std::make_unique<toml::value<bool>>(*v.value_exact<bool>());
      return "";
    case OptionType::kInt: {
      if (s.or_auto && v.is_string()) {
        if (*v.value_exact<std::string>() != "auto") return wrong_type();
        out = std::make_unique<toml::value<std::string>>("auto");
        return "";
      }
      if (!v.is_integer()) return wrong_type();
      int64_t x = *v.value_exact<int64_t>();
      if (!in_range(static_cast<double>(x))) return range_error();
      out = std::make_unique<toml::value<int64_t>>(x);
      return "";
    }
    case OptionType::kFloat: {
      double x;
      if (auto f = v.value_exact<double>())
        x = *f;
      else if (auto i = v.value_exact<int64_t>())
        x = static_cast<double>(*i);
      else
        return wrong_type();
      if (!in_range(x)) return range_error();
      out = std::make_unique<toml::value<double>>(x);
      return "";
    }
    case OptionType::kString: {
      if (!v.is_string()) return wrong_type();
      const std::string x = *v.value_exact<std::string>();
      if (!s.choices.empty()) {
        auto choices = text::split(s.choices, '|');
        bool ok = false;
        for (const auto& c : choices) ok = ok || c == x;
        if (!ok) {
          std::string m = toml_quote(x) + " is not allowed: expected " + want;
          std::string near = text::closest(x, choices);
          if (!near.empty()) m += "; did you mean " + toml_quote(near) + "?";
          return m;
        }
      }
      out = std::make_unique<toml::value<std::string>>(x);
      return "";
    }
    case OptionType::kStringList:
    case OptionType::kFloatList: {
      const toml::array* a = v.as_array();
      if (!a) return wrong_type();
      const bool strings = s.type == OptionType::kStringList;
      auto arr = std::make_unique<toml::array>();
      for (const auto& e : *a) {
        if (strings ? !e.is_string() : !is_float_list_element(e)) return wrong_type();
        if (strings) {
          arr->push_back(*e.value_exact<std::string>());
        } else {
          double x = e.is_integer() ? static_cast<double>(*e.value_exact<int64_t>())
                                    : *e.value_exact<double>();
          if (!in_range(x)) return range_error();
          arr->push_back(x);
        }
      }
      if (s.list_size && a->size() != s.list_size)
        return format_value(v) + " has " + std::to_string(a->size()) + " elements: expected " +
               want;
      out = std::move(arr);
      return "";
    }
  }
  return "unknown option type";
}

}  // namespace

std::string check_default(const KeySpec& s) {
  if (s.presence != P::kDefault) return "";
  auto lit = parse_literal(s.default_literal);
  if (!lit) return "default " + s.default_literal + " is not a TOML value literal";
  std::unique_ptr<toml::node> out;
  std::string problem = check_value(s, *lit->get("v"), out);
  return problem.empty() ? "" : "default " + s.default_literal + ": " + problem;
}

namespace {

std::string loc_of(const SectionInput& in, const std::string& key, bool value) {
  if (in.locations) {
    auto it = in.locations->find(in.section + "." + key);
    if (it != in.locations->end()) return value ? it->second.value : it->second.key;
  }
  return in.origin;
}

std::string section_loc(const SectionInput& in) {
  if (in.locations) {
    auto it = in.locations->find(in.section);
    if (it != in.locations->end()) return it->second.key;
  }
  return in.origin;
}

std::string label(const SectionInput& in) {
  std::string l = "[" + in.section + "]";
  if (!in.owner.empty()) l += " (" + in.owner + ")";
  return l;
}

}  // namespace

std::shared_ptr<Config::Impl> validate_section(const SectionInput& in,
                                               const std::vector<KeySpec>& keys,
                                               const std::vector<KnownSection>& elsewhere,
                                               ErrorList& errors) {
  auto impl = std::make_shared<Config::Impl>();
  impl->section = in.section;
  impl->origin = in.origin;
  auto skipped = [&](std::string_view k) {
    for (const auto& s : in.skip)
      if (s == k) return true;
    return false;
  };
  std::vector<std::string> known;
  for (const auto& k : keys) known.push_back(k.key);

  // Unknown keys first (in the order written).
  if (in.written) {
    for (auto&& [k, v] : *in.written) {
      const std::string key(k.str());
      if (skipped(key)) continue;
      bool found = false;
      for (const auto& s : keys) found = found || s.key == key;
      if (found || in.others_ok) continue;
      const std::string where = loc_of(in, key, false);
      if (v.is_table()) {
        std::string m = "unknown section [" + in.section + "." + key + "]";
        errors.add(where, m);
        continue;
      }
      std::string m = "unknown key '" + key + "' in " + label(in);
      std::string near = text::closest(key, known);
      std::string other;
      for (const auto& e : elsewhere) {
        if (e.name == in.section) continue;
        for (const auto& ek : e.keys)
          if (ek == key && other.empty()) other = e.name;
      }
      if (!other.empty())
        m += "; did you mean section [" + other + "]?";
      else if (!near.empty())
        m += "; did you mean '" + near + "'?";
      else if (known.empty())
        m += " (it takes no options)";
      else
        m += " (known keys: " + text::join(known, ", ") + ")";
      errors.add(where, m);
    }
  }

  // Declared keys: check what is written, fill defaults.
  for (const auto& s : keys) {
    const toml::node* v = in.written ? in.written->get(s.key) : nullptr;
    if (!v) {
      if (s.presence == P::kRequired) {
        if (in.report_missing)
          errors.add(section_loc(in), label(in) + " missing required key '" + s.key + "' (" +
                                          describe_expected(s) + ": " + s.help + ")");
      } else if (s.presence == P::kDefault) {
        auto lit = parse_literal(s.default_literal);
        const toml::node* dv = lit ? lit->get("v") : nullptr;
        std::unique_ptr<toml::node> out;
        if (!dv || !check_value(s, *dv, out).empty()) {
          // Plugins' defaults are checked when they load (registry); the core's by a test.
          errors.add(in.origin, label(in) + " the declared default of '" + s.key + "' (" +
                                    s.default_literal + ") is not " + describe_expected(s));
          continue;
        }
        impl->table.insert_or_assign(s.key, std::move(*out));
        impl->locations[s.key] = "<default>";
      }
      continue;
    }
    std::unique_ptr<toml::node> out;
    std::string problem = check_value(s, *v, out);
    if (!problem.empty()) {
      errors.add(loc_of(in, s.key, true), label(in) + " " + s.key + ": " + problem);
      continue;
    }
    impl->table.insert_or_assign(s.key, std::move(*out));
    // Overrides are located as "--set <text>" in messages; Config::location() says "--set".
    const std::string where = loc_of(in, s.key, true);
    impl->locations[s.key] = where.rfind("--set", 0) == 0 ? "--set" : where;
  }
  return impl;
}

}  // namespace ciuic::recipe
