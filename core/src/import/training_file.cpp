// LLaMA-Factory / axolotl training files -> ciuic recipe (see training_file.h, docs/migrate.md).
#include "import/training_file.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <ciuic/error.h>
#include <ciuic/json.h>

#include "base/paths.h"
#include "base/text.h"
#include "import/yaml.h"
#include "sdk/printable.h"
#include "sdk/toml_format.h"

namespace ciuic::importer {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string shown(const std::string& s) { return printable_text(s, /*keep_lines=*/false); }

std::string read_file(const fs::path& p, const std::string& what) {
  std::error_code ec;
  if (!fs::is_regular_file(p, ec)) throw UsageError(what + ": no such file: " + shown(p.string()));
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  if (!f && !f.eof()) throw UsageError(what + ": cannot read " + shown(p.string()));
  return ss.str();
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// ---- datasets ----------------------------------------------------------------------------------
// One dataset as the tools describe it, and how its records become ciuic's JSONL.
struct Dataset {
  std::string name;             // for messages and the written file's name
  std::string origin;           // "train.yaml: dataset[0]" / "dataset_info.json: alpaca_en_demo"
  std::vector<fs::path> files;  // local JSON / JSONL files; empty: not local
  std::string remote;           // a hub name, when not local
  enum class Form { kAlpaca, kShareGpt, kText } form = Form::kAlpaca;
  // alpaca columns
  std::string prompt = "instruction", query = "input", response = "output", history, system;
  // sharegpt / messages
  std::string messages = "conversations", role_tag = "from", content_tag = "value";
  std::vector<std::string> user_tags = {"human"}, assistant_tags = {"gpt"},
                           system_tags = {"system"};
  std::string text = "text";  // text form
  std::optional<size_t> max_samples;
};

struct Converted {
  fs::path file;
  size_t records = 0;
};

class DataWriter {
 public:
  explicit DataWriter(const Dataset& d) : d_(d) {}

  // Converts every record of d_'s files into `out` (via a temporary file); returns the count.
  size_t write(const fs::path& out) {
    paths::create_folders(out.parent_path().string(), "the converted data's folder");
    const fs::path tmp = out.string() + ".tmp-" + std::to_string(::getpid());
    {
      std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
      if (!f) throw Error("cannot write " + shown(tmp.string()));
      out_ = &f;
      for (const fs::path& p : d_.files) {
        if (full()) break;
        read_source(p);
      }
      f.flush();
      if (!f) throw Error("cannot write " + shown(tmp.string()));
    }
    std::error_code ec;
    fs::rename(tmp, out, ec);
    if (ec)
      throw Error("cannot rename " + shown(tmp.string()) + " to " + shown(out.string()) + ": " +
                  ec.message());
    return count_;
  }

 private:
  bool full() const { return d_.max_samples && count_ >= *d_.max_samples; }

  void read_source(const fs::path& p) {
    const std::string text = read_file(p, d_.origin);
    size_t i = 0;
    while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
    if (i < text.size() && text[i] == '[') {  // a JSON array of records
      check_json_depth(text, shown(p.string()), kExitUsage);
      json all;
      try {
        all = json::parse(text);
      } catch (const json::exception& e) {
        throw UsageError(shown(p.string()) + ": not valid JSON: " + e.what());
      }
      for (size_t r = 0; r < all.size() && !full(); ++r)
        record(all[r], shown(p.string()) + ": record " + std::to_string(r));
      return;
    }
    size_t line_no = 0, start = 0;  // JSON lines
    while (start <= text.size() && !full()) {
      size_t end = text.find('\n', start);
      if (end == std::string::npos) end = text.size();
      ++line_no;
      const std::string line = text.substr(start, end - start);
      start = end + 1;
      if (line.find_first_not_of(" \t\r") == std::string::npos) {
        if (end == text.size()) break;
        continue;
      }
      const std::string where = shown(p.string()) + ":" + std::to_string(line_no);
      check_json_depth(line, where, kExitUsage);
      json j;
      try {
        j = json::parse(line);
      } catch (const json::exception& e) {
        throw UsageError(where + ": not valid JSON: " + e.what());
      }
      record(j, where);
      if (end == text.size()) break;
    }
  }

  [[noreturn]] void bad(const std::string& where, const std::string& what) const {
    throw UsageError(where + ": " + what + " (dataset " + shown(d_.name) + ", " + shown(d_.origin) +
                     ")");
  }

  std::string str(const json& r, const std::string& col, const std::string& where,
                  bool required) const {
    auto it = r.find(col);
    if (it == r.end() || it->is_null()) {
      if (required) bad(where, "no \"" + shown(col) + "\" field");
      return "";
    }
    if (!it->is_string()) bad(where, "\"" + shown(col) + "\" is not a string");
    return it->get<std::string>();
  }

  void record(const json& r, const std::string& where) {
    if (!r.is_object()) bad(where, "not a JSON object");
    json out;
    if (d_.form == Dataset::Form::kText) {
      out["text"] = str(r, d_.text, where, true);
    } else {
      json msgs = json::array();
      const auto add = [&](const char* role, const std::string& content) {
        msgs.push_back({{"role", role}, {"content", content}});
      };
      if (d_.form == Dataset::Form::kAlpaca) {
        if (!d_.system.empty()) {
          const std::string s = str(r, d_.system, where, false);
          if (!s.empty()) add("system", s);
        }
        if (!d_.history.empty() && r.contains(d_.history) && !r[d_.history].is_null()) {
          const json& h = r[d_.history];
          if (!h.is_array())
            bad(where, "\"" + shown(d_.history) + "\" is not a list of [prompt, response] pairs");
          for (const json& turn : h) {
            if (!turn.is_array() || turn.size() != 2 || !turn[0].is_string() ||
                !turn[1].is_string())
              bad(where, "\"" + shown(d_.history) + "\" is not a list of [prompt, response] pairs");
            add("user", turn[0].get<std::string>());
            add("assistant", turn[1].get<std::string>());
          }
        }
        std::string user = str(r, d_.prompt, where, true);
        const std::string q = d_.query.empty() ? "" : str(r, d_.query, where, false);
        if (!q.empty())
          user += (user.empty() ? "" : "\n") + q;  // LLaMA-Factory's and axolotl's join
        add("user", user);
        const json* resp = r.contains(d_.response) ? &r[d_.response] : nullptr;
        if (!resp || !resp->is_string())
          bad(where, "\"" + shown(d_.response) +
                         "\" is not a string (ranking / preference data is not supported)");
        add("assistant", resp->get<std::string>());
      } else {
        if (!d_.system.empty()) {
          const std::string s = str(r, d_.system, where, false);
          if (!s.empty()) add("system", s);
        }
        auto it = r.find(d_.messages);
        if (it == r.end() || !it->is_array())
          bad(where, "no \"" + shown(d_.messages) + "\" list of messages");
        const auto in = [](const std::vector<std::string>& v, const std::string& s) {
          return std::find(v.begin(), v.end(), s) != v.end();
        };
        for (size_t m = 0; m < it->size(); ++m) {
          const json& msg = (*it)[m];
          const std::string w = where + ": message " + std::to_string(m);
          if (!msg.is_object()) bad(w, "not an object");
          const std::string role = str(msg, d_.role_tag, w, true);
          const std::string content = str(msg, d_.content_tag, w, true);
          if (in(d_.user_tags, role))
            add("user", content);
          else if (in(d_.assistant_tags, role))
            add("assistant", content);
          else if (in(d_.system_tags, role))
            add("system", content);
          else
            bad(w,
                "role \"" + shown(role) +
                    "\" is not a user, assistant or system role (tool calls and observations are "
                    "not supported)");
        }
      }
      out["messages"] = std::move(msgs);
    }
    *out_ << out.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
    ++count_;
  }

  const Dataset& d_;
  std::ofstream* out_ = nullptr;
  size_t count_ = 0;
};

// ---- chat templates ----------------------------------------------------------------------------
// The tools' template names that are a model family's own chat format, with a text that family's
// own template (tokenizer_config.json) contains; "deepseek" is ciuic's built-in DeepSeek-LLM one.
struct TemplateFamily {
  std::vector<std::string> names;
  std::string signature;
  std::string family;
};
const std::vector<TemplateFamily>& families() {
  static const std::vector<TemplateFamily> f = {
      {{"llama3", "llama3_2_vision", "llama3.1", "llama3.2"}, "<|start_header_id|>", "Llama 3"},
      {{"llama4"}, "<|header_start|>", "Llama 4"},
      {{"llama2", "mistral", "mistral_v1", "mistral_v2v3", "mistral_v3_tekken", "ministral",
        "mistral_small"},
       "[INST]",
       "Llama 2 / Mistral"},
      {{"qwen", "qwen2", "qwen2_vl", "qwen_25", "qwen2_5", "qwen3", "chatml", "yi", "phi4",
        "openchat3.6", "chatml_de"},
       "<|im_start|>",
       "ChatML (Qwen, Yi, Phi-4)"},
      {{"gemma", "gemma2", "gemma3"}, "<start_of_turn>", "Gemma"},
      {{"phi", "phi_3", "phi_35", "zephyr"}, "<|user|>", "Phi-3 / Zephyr"},
      {{"deepseek3", "deepseek_v3", "deepseekr1"}, "<｜User｜>", "DeepSeek-V3"},
      {{"deepseekcoder", "deepseek_coder"}, "### Instruction", "deepseek-coder-instruct"},
      {{"cohere", "command_r"}, "<|START_OF_TURN_TOKEN|>", "Command R"},
      {{"glm4"}, "[gMASK]", "GLM-4"},
  };
  return f;
}

// ---- the reader of one training file -----------------------------------------------------------
class Reader {
 public:
  Reader(TrainingTool tool, const std::string& path, const std::vector<std::string>& overrides,
         const std::string& data_dir)
      : tool_(tool),
        path_(path),
        origin_(shown(fs::path(path).filename().string())),
        overrides_(overrides),
        data_dir_(data_dir) {
    tool_name_ = tool == TrainingTool::kLlamaFactory ? "LLaMA-Factory" : "axolotl";
    flag_ = tool == TrainingTool::kLlamaFactory ? "--from-llamafactory" : "--from-axolotl";
    for (const auto& o : overrides) {
      const size_t eq = o.find('=');
      if (eq == std::string::npos) continue;
      const std::string k = o.substr(0, eq), v = o.substr(eq + 1);
      set_keys_.insert(k);
      if (k == "cluster.nproc_per_node" || k == "cluster.nnodes") {
        try {
          (k == "cluster.nnodes" ? nnodes_ : nproc_) = std::stoll(v);
        } catch (const std::exception&) {
        }
      }
    }
  }

  TrainingImport run() {
    const std::string text = read_file(path_, flag_);
    root_ = parse_yaml(text, shown(path_.string()));
    if (root_.kind != YamlNode::Kind::kMap)
      throw UsageError(shown(path_.string()) + ": expected a mapping of " + tool_name_ +
                       " training keys");
    args_ = TrainerArgs::defaults();
    args_.from_file = true;
    if (tool_ == TrainingTool::kLlamaFactory)
      llamafactory();
    else
      axolotl();
    rest();
    return finish();
  }

 private:
  // ---- reading keys -----------------------------------------------------------------------------
  const YamlNode* get(const std::string& key) {
    read_.insert(key);
    const YamlNode* n = root_.find(key);
    return n && !n->is_null() ? n : nullptr;
  }
  std::string src(const std::string& key) const { return origin_ + ": " + key; }
  [[noreturn]] void type_error(const std::string& key, const YamlNode& n,
                               const std::string& want) const {
    throw UsageError(
        shown(path_.string()) + ": " + shown(key) + " (" + n.where() + "): expected " + want +
        (n.kind == YamlNode::Kind::kScalar ? ", found " + shown(n.text) : std::string()));
  }
  std::optional<double> num(const std::string& key) {
    const YamlNode* n = get(key);
    if (!n) return std::nullopt;
    if (auto d = n->as_number()) return d;
    type_error(key, *n, "a number");
  }
  std::optional<int64_t> whole(const std::string& key) {
    const YamlNode* n = get(key);
    if (!n) return std::nullopt;
    auto d = n->as_number();
    if (!d || *d != std::floor(*d) || std::fabs(*d) > 9e15) type_error(key, *n, "an integer");
    return static_cast<int64_t>(*d);
  }
  std::optional<bool> flag(const std::string& key) {
    const YamlNode* n = get(key);
    if (!n) return std::nullopt;
    if (auto b = n->as_bool()) return b;
    if (n->kind == YamlNode::Kind::kScalar) {  // pydantic / strtobool: "true", "1", ...
      const std::string l = lower(n->text);
      if (l == "true" || l == "1" || l == "yes" || l == "on" || l == "t" || l == "y") return true;
      if (l == "false" || l == "0" || l == "no" || l == "off" || l == "f" || l == "n") return false;
    }
    type_error(key, *n, "true or false");
  }
  std::optional<std::string> str(const std::string& key) {
    const YamlNode* n = get(key);
    if (!n) return std::nullopt;
    if (auto s = n->as_string()) return s;
    type_error(key, *n, "a string");
  }
  // A list of names written as a list or a comma-separated string (LLaMA-Factory's dataset).
  std::vector<std::string> names(const std::string& key) {
    const YamlNode* n = get(key);
    std::vector<std::string> out;
    if (!n) return out;
    if (n->kind == YamlNode::Kind::kSeq) {
      for (const auto& i : n->items)
        if (auto s = i.as_string())
          out.push_back(*s);
        else
          type_error(key, i, "a name");
    } else if (auto s = n->as_string()) {
      for (auto part : text::split(*s, ',')) {
        while (!part.empty() && std::isspace(static_cast<unsigned char>(part.front())))
          part.erase(0, 1);
        while (!part.empty() && std::isspace(static_cast<unsigned char>(part.back())))
          part.pop_back();
        if (!part.empty()) out.push_back(part);
      }
    } else {
      type_error(key, *n, "a name or a list of names");
    }
    return out;
  }

  void ignore(const std::string& key, const std::string& reason) {
    ignored_.push_back(key + ": " + reason);
  }
  void refuse(const std::string& key, const std::string& why) {
    refused_.push_back(origin_ + ": " + key + ": " + why);
  }
  void note(const std::string& n) { notes_.push_back(n); }
  void give(const std::string& key, const std::string& literal, const std::string& comment) {
    given_.push_back({key, literal, comment});
  }
  bool set_by_user(const std::string& key) const { return set_keys_.count(key) > 0; }

  // A TrainerValue from the file, when the key is there.
  void arg(TrainerValue& v, const std::string& key) {
    if (auto d = num(key)) v = TrainerValue{*d, true, src(key)};
  }
  void arg_flag(TrainerValue& v, const std::string& key) {
    if (auto b = flag(key)) v = TrainerValue{*b ? 1.0 : 0.0, true, src(key)};
  }

  // A path of the file: the working directory first (the tools run from their checkout), then
  // the file's folder.
  std::optional<fs::path> local(const std::string& p, bool directory) const {
    std::error_code ec;
    for (const fs::path& base : {fs::current_path(ec), path_.parent_path()}) {
      const fs::path c = fs::path(p).is_absolute() ? fs::path(p) : base / p;
      if (directory ? fs::is_directory(c, ec) : fs::exists(c, ec))
        return fs::absolute(c, ec).lexically_normal();
    }
    return std::nullopt;
  }

  // ---- the model and its template -----------------------------------------------------------
  void model(const std::string& key) {
    const std::optional<std::string> m = str(key);
    if (!m) {
      refuse(key, "missing: the model to fine-tune");
      return;
    }
    if (auto dir = local(*m, true)) {
      model_dir_ = *dir;
      give("model.path", toml_quote(dir->string()), src(key));
    } else {
      give("model.path", toml_quote(*m), src(key) + " (placeholder: not a local folder)");
      placeholders_.push_back("model.path");
      note(key + " = " + *m +
           " is not a local folder (a Hugging Face hub name?): ciuic reads a local model folder; "
           "download it (huggingface-cli download " +
           *m + " --local-dir DIR) and give --set model.path=DIR");
    }
  }

  // `name` (a tool's template name, from `key`) -> [model] chat_template.
  void chat_template(const std::optional<std::string>& name, const std::string& key) {
    if (set_by_user("model.chat_template")) return;
    if (!name || *name == "tokenizer_default" ||
        name->rfind("tokenizer_default_fallback_", 0) == 0) {
      give("model.chat_template", "\"auto\"",
           name ? src(key) +
                      ": the model's own template (tokenizer_config.json), else ciuic's plain one"
                : std::string("no template named: the model's own (tokenizer_config.json), else "
                              "ciuic's plain one"));
      return;
    }
    const std::string n = lower(*name);
    if (n == "deepseek") {
      give("model.chat_template", "\"deepseek\"",
           src(key) + " = deepseek: ciuic's built-in DeepSeek-LLM chat template");
      return;
    }
    for (const TemplateFamily& f : families()) {
      if (std::find(f.names.begin(), f.names.end(), n) == f.names.end()) continue;
      std::string own;
      if (!model_dir_.empty()) {
        for (const char* file : {"chat_template.jinja", "tokenizer_config.json"}) {
          std::error_code ec;
          if (fs::is_regular_file(model_dir_ / file, ec)) {
            own = read_file(model_dir_ / file, "the model's template");
            break;
          }
        }
        if (own.find(f.signature) == std::string::npos) {
          refuse(key,
                 *name + " is the " + f.family + " chat format, and the model's own template (" +
                     (own.empty()
                          ? std::string("none: no chat_template.jinja or tokenizer_config.json")
                          : "in its folder") +
                     ") is not; ciuic renders the model's own template or a built-in one "
                     "(deepseek, plain): give "
                     "--set model.chat_template=hf|deepseek|plain to import anyway");
          return;
        }
      }
      give("model.chat_template", "\"hf\"",
           src(key) + " = " + *name + ": the " + f.family +
               " format, the model's own template (tokenizer_config.json)" +
               (model_dir_.empty() ? " (not checked: the model is not a local folder)" : ""));
      return;
    }
    refuse(
        key,
        *name +
            ": ciuic has no such template; it renders the model's own template (hf) or a built-in "
            "one "
            "(deepseek, plain): give --set model.chat_template=hf|deepseek|plain to import anyway");
  }

  // ---- LLaMA-Factory
  // ------------------------------------------------------------------------------
  void llamafactory() {
    model("model_name_or_path");
    const std::string stage = str("stage").value_or("sft");
    if (stage != "sft" && stage != "pt")
      refuse("stage",
             stage +
                 ": ciuic fine-tunes with next-token loss (stage sft, or pt for plain text); "
                 "rm, ppo, dpo and kto are not supported");
    pretraining_ = stage == "pt";
    const std::string ft = str("finetuning_type").value_or("lora");
    if (ft != "full")
      refuse("finetuning_type",
             ft + (root_.find("finetuning_type") ? "" : " (LLaMA-Factory's default)") +
                 ": LoRA, freeze and OFT are not built in ciuic yet (it trains every parameter); "
                 "write finetuning_type: full to import this as a full fine-tune");
    lora_keys({"lora_rank",
               "lora_alpha",
               "lora_dropout",
               "lora_target",
               "additional_target",
               "loraplus_lr_ratio",
               "loraplus_lr_embedding",
               "use_rslora",
               "use_dora",
               "pissa_init",
               "pissa_iter",
               "pissa_convert",
               "create_new_adapter",
               "adapter_name_or_path",
               "freeze_trainable_layers",
               "freeze_trainable_modules",
               "freeze_extra_modules",
               "oft_rank",
               "oft_block_size",
               "oft_target"},
              ft);
    for (const char* k : {"quantization_bit", "quantization_method"})
      if (get(k)) refuse(k, "quantized models (QLoRA) are not supported");
    if (get("rope_scaling"))
      refuse("rope_scaling", "set the model's rope scaling in [model.config] instead");
    if (get("default_system"))
      refuse("default_system", "a default system prompt is not supported (write it in the data)");
    if (flag("mask_history").value_or(false))
      refuse("mask_history", "training on the last turn only is not supported");
    chat_template(str("template"), "template");
    // Data.
    const std::string ddir = str("dataset_dir").value_or("data");
    const auto max_samples = whole("max_samples");
    for (const auto& n : names("dataset")) lf_dataset(n, ddir, max_samples, datasets_);
    for (const auto& n : names("eval_dataset")) lf_dataset(n, ddir, max_samples, eval_datasets_);
    if (datasets_.empty()) refuse("dataset", "missing: the training data");
    if (auto v = num("val_size")) val_size_ = {*v, src("val_size")};
    if (auto t = flag("train_on_prompt")) train_on_prompt_ = {*t, src("train_on_prompt")};
    if (auto p = flag("packing")) packing_ = {*p, src("packing")};
    if (auto p = flag("neat_packing"); p && *p) packing_ = {true, src("neat_packing")};
    if (!packing_ && pretraining_) packing_ = {true, "LLaMA-Factory packs stage pt"};
    seq_len_ = {whole("cutoff_len").value_or(2048), root_.find("cutoff_len")
                                                        ? src("cutoff_len")
                                                        : "LLaMA-Factory's default cutoff_len"};
    // The Trainer's arguments.
    arg(args_.per_device_train_batch_size, "per_device_train_batch_size");
    common_trainer_args();
    epochs_ = {num("num_train_epochs").value_or(3.0),
               root_.find("num_train_epochs") ? src("num_train_epochs")
                                              : "HF TrainingArguments num_train_epochs default"};
    if (auto s = whole("max_steps"); s && *s > 0) max_steps_ = {*s, src("max_steps")};
    schedule(str("lr_scheduler_type").value_or("linear"),
             root_.find("lr_scheduler_type") ? "lr_scheduler_type" : "");
    optimizer(str("optim").value_or("adamw_torch"), "optim");
    const bool pure = flag("pure_bf16").value_or(false);
    arg_flag(args_.bf16, "bf16");
    arg_flag(args_.fp16, "fp16");
    if (pure) {
      args_.bf16 = TrainerValue{1, true, src("pure_bf16")};
      note(
          "pure_bf16 -> bf16: ciuic keeps fp32 master weights and optimizer state (LLaMA-Factory's "
          "pure_bf16 does not)");
    }
    const bool no_gc = flag("disable_gradient_checkpointing").value_or(false);
    give("model.activation_checkpointing", no_gc ? "false" : "true",
         no_gc ? src("disable_gradient_checkpointing")
               : "LLaMA-Factory checkpoints activations unless disable_gradient_checkpointing");
    output_and_logging();
    if (auto s = str("eval_strategy"); s && *s == "steps")
      if (auto e = whole("eval_steps"))
        give("train.eval_every_steps", std::to_string(*e), src("eval_steps"));
    const std::string save = str("save_strategy").value_or("steps");
    if (save == "no") {
      give("checkpoint.every_steps", "0", src("save_strategy") + " = no: at the end only");
    } else if (save == "steps") {
      const auto e = whole("save_steps");
      give("checkpoint.every_steps", std::to_string(e.value_or(500)),
           e ? src("save_steps") : "HF TrainingArguments save_steps default");
    } else {
      note("save_strategy = " + save +
           ": ciuic saves every checkpoint.every_steps (here at the end only)");
    }
    if (!root_.find("save_total_limit") || root_.find("save_total_limit")->is_null())
      give("checkpoint.keep_last", "0",
           "HF TrainingArguments save_total_limit default (None): keep every checkpoint");
    if (flag("disable_shuffling").value_or(false))
      give("data.shuffle", "false", src("disable_shuffling"));
    deepspeed("deepspeed");
    reasons_ = {
        {"do_train", "ciuic-run trains"},
        {"do_eval", "[train] eval_every_steps evaluates"},
        {"do_predict", "no prediction run"},
        {"predict_with_generate", "no prediction run"},
        {"trust_remote_code", "ciuic runs its own model code"},
        {"overwrite_cache", "ciuic tokenizes once into its own cache (docs/data.md)"},
        {"preprocessing_num_workers", "ciuic tokenizes with every core ([data] build_threads)"},
        {"preprocessing_batch_size", "ciuic tokenizes once into its own cache"},
        {"dataloader_num_workers", "ciuic's data plugin prefetches on its own thread"},
        {"tokenized_path", "ciuic tokenizes once into its own cache"},
        {"streaming", "ciuic reads the converted files"},
        {"overwrite_output_dir", "ciuic refuses another run's folder unless ciuic-run --overwrite"},
        {"plot_loss", "ciuic-run --plot RUN_DIR draws the loss"},
        {"save_only_model", "ciuic's checkpoints keep the optimizer state (resume needs it)"},
        {"ddp_timeout", "[cluster] timeout_s bounds rendezvous and collectives"},
        {"resume_from_checkpoint", "use ciuic-run --resume"},
        {"flash_attn", "ciuic's attention kernels are its own"},
        {"enable_liger_kernel", "ciuic's kernels are its own"},
        {"use_unsloth", "ciuic's kernels are its own"},
        {"upcast_layernorm", "ciuic computes norms in fp32"},
        {"use_reentrant_gc", "ciuic's checkpointing is its own"},
        {"tf32", "a kernel setting"},
        {"torch_compile", "ciuic's model is native C++"},
        {"ddp_find_unused_parameters", "every parameter gets a gradient"},
        {"per_device_eval_batch_size", "ciuic evaluates with the training micro-batch"},
        {"include_num_input_tokens_seen", "metrics.jsonl logs data_tokens"},
        {"logging_dir", "ciuic logs in run.output_dir"},
        {"run_name", "ciuic's [run] name is separate"},
        {"eval_steps", "eval_strategy is not steps: no evaluation"},
        {"save_steps", "save_strategy is no"},
        {"bf16_full_eval", "ciuic evaluates in the training precision"},
        {"fp16_full_eval", "ciuic evaluates in the training precision"},
        {"push_to_hub", "no hub upload"},
        {"hub_model_id", "no hub upload"},
        {"cache_dir", "ciuic reads a local folder"},
        {"model_revision", "ciuic reads a local folder"},
        {"hf_hub_token", "ciuic reads a local folder"},
        {"tool_format", "tool calls are not supported"},
        {"mix_strategy", "datasets are concatenated and shuffled"},
        {"eval_on_start", "ciuic evaluates every eval_every_steps"},
        {"lr_scheduler_kwargs",
         "only min_lr_rate / min_lr of a cosine schedule have a ciuic meaning"},
        {"logging_strategy", "steps"},
        {"save_safetensors", "ciuic --export-hf writes safetensors"},
    };
    // lr_scheduler_kwargs is read by schedule().
  }

  void lora_keys(const std::vector<std::string>& keys, const std::string& ft) {
    for (const auto& k : keys)
      if (root_.find(k)) {
        read_.insert(k);
        ignore(
            k,
            ft == "full"
                ? "a LoRA/freeze key: LoRA is not built in ciuic yet, and finetuning_type is full"
                : "a LoRA/freeze key: LoRA is not built in ciuic yet (finetuning_type is refused)");
      }
  }

  // One LLaMA-Factory dataset name, through <dataset_dir>/dataset_info.json.
  void lf_dataset(const std::string& name, const std::string& ddir,
                  std::optional<int64_t> max_samples, std::vector<Dataset>& out) {
    Dataset d;
    d.name = name;
    d.origin = "dataset_info.json: " + name;
    if (max_samples && *max_samples > 0) d.max_samples = static_cast<size_t>(*max_samples);
    const std::optional<fs::path> dir = local(ddir, true);
    if (!dir) {
      refuse("dataset_dir",
             ddir + ": no such folder (it holds dataset_info.json and the data files)");
      return;
    }
    if (!info_loaded_) {
      info_loaded_ = true;
      const fs::path ip = *dir / "dataset_info.json";
      const std::string t = read_file(ip, "dataset " + name);
      check_json_depth(t, shown(ip.string()), kExitUsage);
      try {
        info_ = json::parse(t);
      } catch (const json::exception& e) {
        throw UsageError(shown(ip.string()) + ": not valid JSON: " + e.what());
      }
      if (!info_.is_object())
        throw UsageError(shown(ip.string()) + ": expected an object of datasets");
    }
    auto it = info_.find(name);
    if (it == info_.end() || !it->is_object()) {
      refuse("dataset", name + ": not in " + (*dir / "dataset_info.json").string());
      return;
    }
    const json& e = *it;
    const auto s = [&](const json& o, const char* k, const std::string& dflt) {
      auto f = o.find(k);
      return f != o.end() && f->is_string() ? f->get<std::string>() : dflt;
    };
    if (e.value("ranking", false))
      refuse("dataset", name + ": ranking (preference) data is for rm/dpo stages, not supported");
    const std::string formatting = s(e, "formatting", "alpaca");
    const json cols =
        e.contains("columns") && e["columns"].is_object() ? e["columns"] : json::object();
    const json tags = e.contains("tags") && e["tags"].is_object() ? e["tags"] : json::object();
    for (const char* media : {"images", "videos", "audios"})
      if (cols.contains(media))
        refuse("dataset", name + ": multimodal data (" + media + ") is not supported");
    if (cols.contains("tools"))
      note("dataset " + name + ": its tools column is left out (tool calls are not supported)");
    if (pretraining_) {
      d.form = Dataset::Form::kText;
      d.text = s(cols, "prompt", "text");
    } else if (formatting == "alpaca") {
      d.form = Dataset::Form::kAlpaca;
      d.prompt = s(cols, "prompt", "instruction");
      d.query = s(cols, "query", "input");
      d.response = s(cols, "response", "output");
      d.history = s(cols, "history", "");
      d.system = s(cols, "system", "");
    } else if (formatting == "sharegpt") {
      d.form = Dataset::Form::kShareGpt;
      d.messages = s(cols, "messages", "conversations");
      d.system = s(cols, "system", "");
      d.role_tag = s(tags, "role_tag", "from");
      d.content_tag = s(tags, "content_tag", "value");
      d.user_tags = {s(tags, "user_tag", "human")};
      d.assistant_tags = {s(tags, "assistant_tag", "gpt")};
      d.system_tags = {s(tags, "system_tag", "system")};
    } else {
      refuse("dataset", name + ": formatting " + formatting + " (expected alpaca or sharegpt)");
      return;
    }
    if (e.contains("file_name")) {
      const std::string fname = s(e, "file_name", "");
      const fs::path p = *dir / fname;
      d.files = data_files(p, "dataset " + name);
      if (d.files.empty()) return;
    } else {
      for (const char* k :
           {"hf_hub_url", "ms_hub_url", "om_hub_url", "script_url", "cloud_file_name"})
        if (e.contains(k) && e[k].is_string()) d.remote = e[k].get<std::string>();
      if (d.remote.empty()) d.remote = name;
    }
    out.push_back(std::move(d));
  }

  // The JSON / JSONL files of a dataset path (a file, or a folder of them).
  std::vector<fs::path> data_files(const fs::path& p, const std::string& what) {
    std::error_code ec;
    std::vector<fs::path> files;
    if (fs::is_directory(p, ec)) {
      for (const auto& e : fs::directory_iterator(p, ec))
        if (e.is_regular_file()) files.push_back(e.path());
      std::sort(files.begin(), files.end());
    } else if (fs::is_regular_file(p, ec)) {
      files.push_back(p);
    } else {
      refuse("dataset", what + ": no such file or folder: " + p.string());
      return {};
    }
    for (const auto& f : files) {
      const std::string ext = lower(f.extension().string());
      if (ext != ".json" && ext != ".jsonl") {
        refuse("dataset", what + ": " + f.string() +
                              ": ciuic converts JSON and JSON lines files (not " + ext + ")");
        return {};
      }
    }
    return files;
  }

  // ---- axolotl ----------------------------------------------------------------------------------
  void axolotl() {
    model("base_model");
    if (auto a = str("adapter"))
      refuse(
          "adapter",
          *a + ": LoRA and QLoRA adapters are not built in ciuic yet (it trains every parameter); "
               "remove adapter to import this as a full fine-tune");
    lora_keys(
        {"lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "lora_target_linear",
         "lora_fan_in_fan_out", "lora_modules_to_save", "lora_model_dir", "peft_use_dora",
         "peft_use_rslora", "peft_layers_to_transform", "relora_steps", "relora_warmup_steps"},
        root_.find("adapter") && !root_.find("adapter")->is_null() ? "lora" : "full");
    for (const char* k : {"load_in_8bit", "load_in_4bit", "gptq"})
      if (flag(k).value_or(false)) refuse(k, "quantized models are not supported");
    if (const YamlNode* f = get("fsdp");
        f && !(f->kind == YamlNode::Kind::kSeq && f->items.empty()))
      refuse("fsdp",
             "FSDP is not supported: give a DeepSpeed config (deepspeed:) or set [sharding] in the "
             "recipe");
    if (get("fsdp_config")) ignore("fsdp_config", "no FSDP");
    if (get("tokens")) refuse("tokens", "adding tokens to the vocabulary is not supported");
    if (const YamlNode* st = get("special_tokens"); st && st->kind == YamlNode::Kind::kMap) {
      ignore(
          "special_tokens",
          "ciuic uses the tokenizer's own special tokens (tokenizer.json, tokenizer_config.json)");
    }
    if (get("default_system_message"))
      refuse("default_system_message", "a default system prompt is not supported");
    if (auto ct = str("chat_template"); ct && *ct == "jinja")
      refuse(
          "chat_template",
          "jinja (chat_template_jinja): ciuic renders the model's own template or a built-in one");
    else
      chat_template(ct, "chat_template");
    read_.insert("chat_template_jinja");
    // Data.
    ax_datasets("datasets", datasets_);
    ax_datasets("test_datasets", eval_datasets_);
    if (datasets_.empty()) refuse("datasets", "missing: the training data");
    if (auto v = num("val_set_size"); v && *v > 0) val_size_ = {*v, src("val_set_size")};
    if (auto t = flag("train_on_inputs")) train_on_prompt_ = {*t, src("train_on_inputs")};
    if (auto p = flag("sample_packing")) packing_ = {*p, src("sample_packing")};
    seq_len_ = {whole("sequence_len").value_or(2048), root_.find("sequence_len")
                                                          ? src("sequence_len")
                                                          : "axolotl's default sequence_len"};
    // The Trainer's arguments (axolotl's names and defaults).
    args_.per_device_train_batch_size = TrainerValue{1, true, "axolotl's default micro_batch_size"};
    arg(args_.per_device_train_batch_size, "micro_batch_size");
    if (auto b = whole("batch_size"); b && !root_.find("gradient_accumulation_steps")) {
      const auto m = static_cast<int64_t>(args_.per_device_train_batch_size.value);
      args_.gradient_accumulation_steps =
          TrainerValue{static_cast<double>(std::max<int64_t>(1, *b / m)), true,
                       src("batch_size") + " / micro_batch_size"};
    }
    common_trainer_args();
    epochs_ = {num("num_epochs").value_or(1.0),
               root_.find("num_epochs") ? src("num_epochs") : "axolotl's default num_epochs"};
    if (auto s = whole("max_steps"); s && *s > 0) max_steps_ = {*s, src("max_steps")};
    schedule(str("lr_scheduler").value_or("cosine"),
             root_.find("lr_scheduler") ? "lr_scheduler" : "");
    optimizer(str("optimizer").value_or("adamw_torch_fused"), "optimizer");
    for (const char* k : {"bf16", "fp16"}) {
      const YamlNode* n = get(k);
      if (!n) continue;
      TrainerValue& v = std::string(k) == "bf16" ? args_.bf16 : args_.fp16;
      if (n->kind == YamlNode::Kind::kScalar && n->text == "auto") {
        if (std::string(k) == "bf16") {
          v = TrainerValue{
              1, true,
              src("bf16") +
                  " = auto: bf16 (axolotl's choice where the device has it; ciuic's too)"};
        }
        continue;
      }
      arg_flag(v, k);
    }
    for (const char* k : {"bfloat16", "float16"})
      if (flag(k).value_or(false)) {
        (std::string(k) == "bfloat16" ? args_.bf16 : args_.fp16) = TrainerValue{1, true, src(k)};
        note(std::string(k) + " (weights in half precision) -> the " +
             (std::string(k) == "bfloat16" ? "bf16" : "fp16") +
             " plugin: ciuic keeps fp32 master weights and optimizer state");
      }
    if (auto g = flag("gradient_checkpointing"))
      give("model.activation_checkpointing", *g ? "true" : "false", src("gradient_checkpointing"));
    output_and_logging();
    if (flag("use_tensorboard").value_or(false))
      give("log.tensorboard", "true", src("use_tensorboard"));
    if (auto e = whole("eval_steps"))
      give("train.eval_every_steps", std::to_string(*e), src("eval_steps"));
    if (auto e = whole("save_steps"))
      give("checkpoint.every_steps", std::to_string(*e), src("save_steps"));
    per_epoch_ = {whole("evals_per_epoch"), whole("saves_per_epoch")};
    deepspeed("deepspeed");
    reasons_ = {
        {"strict", "ciuic reads the whole file"},
        {"dataset_prepared_path", "ciuic tokenizes once into its own cache"},
        {"push_dataset_to_hub", "no hub upload"},
        {"hub_model_id", "no hub upload"},
        {"hub_strategy", "no hub upload"},
        {"dataset_processes", "ciuic tokenizes with every core"},
        {"shuffle_merged_datasets", "ciuic shuffles every epoch"},
        {"pad_to_sequence_len", "ciuic's rows are always seq_len long"},
        {"group_by_length", "ciuic packs or pads rows"},
        {"tf32", "a kernel setting"},
        {"xformers_attention", "ciuic's attention kernels are its own"},
        {"flash_attention", "ciuic's attention kernels are its own"},
        {"sdp_attention", "ciuic's attention kernels are its own"},
        {"flash_attn_cross_entropy", "ciuic's loss is its own"},
        {"flash_attn_rms_norm", "ciuic's norms are its own"},
        {"flash_attn_fuse_qkv", "ciuic's kernels are its own"},
        {"flash_attn_fuse_mlp", "ciuic's kernels are its own"},
        {"s2_attention", "ciuic's attention kernels are its own"},
        {"liger_rope", "ciuic's kernels are its own"},
        {"liger_rms_norm", "ciuic's kernels are its own"},
        {"liger_glu_activation", "ciuic's kernels are its own"},
        {"liger_fused_linear_cross_entropy", "ciuic's loss is chunked on its own"},
        {"plugins", "ciuic's kernels are its own"},
        {"early_stopping_patience", "no early stopping"},
        {"resume_from_checkpoint", "use ciuic-run --resume"},
        {"auto_resume_from_checkpoints", "use ciuic-run --resume auto"},
        {"local_rank", "set by the launcher"},
        {"debug", "no debug mode"},
        {"gradient_checkpointing_kwargs", "ciuic's checkpointing is its own"},
        {"eval_table_size", "no sample table"},
        {"eval_max_new_tokens", "[train] exact_match_max_new_tokens"},
        {"eval_sample_packing", "ciuic evaluates as it trains"},
        {"model_type", "ciuic reads config.json"},
        {"tokenizer_type", "ciuic reads tokenizer.json"},
        {"base_model_config", "ciuic reads the model folder's config.json"},
        {"trust_remote_code", "ciuic runs its own model code"},
        {"torch_compile", "ciuic's model is native C++"},
        {"wandb_project", "use [log] tensorboard or metrics.jsonl"},
        {"wandb_entity", "use [log] tensorboard or metrics.jsonl"},
        {"wandb_watch", "use [log] tensorboard or metrics.jsonl"},
        {"wandb_name", "use [log] tensorboard or metrics.jsonl"},
        {"wandb_log_model", "use [log] tensorboard or metrics.jsonl"},
        {"wandb_run_id", "use [log] tensorboard or metrics.jsonl"},
        {"mlflow_tracking_uri", "use [log] tensorboard or metrics.jsonl"},
        {"mlflow_experiment_name", "use [log] tensorboard"},
        {"cosine_min_lr_ratio", "only a cosine schedule has a minimum"},
        {"save_safetensors", "ciuic --export-hf writes safetensors"},
        {"train_on_eos", "ciuic trains on each reply's end-of-turn token"},
        {"is_llama_derived_model", "ciuic reads config.json"},
        {"is_mistral_derived_model", "ciuic reads config.json"},
        {"is_qwen_derived_model", "ciuic reads config.json"},
        {"ddp_timeout", "[cluster] timeout_s bounds collectives"},
        {"unfrozen_parameters", "ciuic trains every parameter"},
        {"save_strategy", "ciuic saves every checkpoint.every_steps"},
        {"eval_strategy", "ciuic evaluates every eval_every_steps"},
    };
  }

  void ax_datasets(const std::string& key, std::vector<Dataset>& out) {
    const YamlNode* list = get(key);
    if (!list) return;
    if (list->kind != YamlNode::Kind::kSeq) type_error(key, *list, "a list of datasets");
    for (size_t i = 0; i < list->items.size(); ++i) {
      const YamlNode& e = list->items[i];
      const std::string at = key + "[" + std::to_string(i) + "]";
      if (e.kind != YamlNode::Kind::kMap) type_error(at, e, "a dataset mapping (path, type, ...)");
      const auto s = [&](const char* k, const std::string& dflt) {
        const YamlNode* n = e.find(k);
        if (!n || n->is_null()) return dflt;
        if (auto v = n->as_string()) return *v;
        type_error(at + "." + k, *n, "a string");
      };
      Dataset d;
      d.origin = origin_ + ": " + at;
      d.name = s("path", "");
      if (d.name.empty()) {
        refuse(at, "no path");
        continue;
      }
      const YamlNode* type_node = e.find("type");
      if (type_node && type_node->kind == YamlNode::Kind::kMap) {
        refuse(at + ".type",
               "a custom prompt format is not supported (alpaca, chat_template, sharegpt, "
               "completion are)");
        continue;
      }
      const std::string type = s("type", "");
      if (type == "alpaca" || type == "alpaca_chat" || type == "alpaca:chat") {
        d.form = Dataset::Form::kAlpaca;
        if (type == "alpaca")
          note(at +
               " type alpaca: axolotl writes these rows in its Alpaca prompt (### Instruction / "
               "### Response); "
               "ciuic converts them to conversations and renders them with the recipe's chat "
               "template");
      } else if (type == "chat_template") {
        d.form = Dataset::Form::kShareGpt;
        d.messages = s("field_messages", "messages");
        d.role_tag = "role";
        d.content_tag = "content";
        if (const YamlNode* mp = e.find("message_property_mappings");
            mp && mp->kind == YamlNode::Kind::kMap) {
          if (const YamlNode* r = mp->find("role"); r && r->as_string())
            d.role_tag = *r->as_string();
          if (const YamlNode* c = mp->find("content"); c && c->as_string())
            d.content_tag = *c->as_string();
        }
        d.role_tag = s("message_field_role", d.role_tag);
        d.content_tag = s("message_field_content", d.content_tag);
        d.user_tags = {"user", "human"};
        d.assistant_tags = {"assistant", "gpt"};
        d.system_tags = {"system"};
        if (const YamlNode* roles = e.find("roles"); roles && roles->kind == YamlNode::Kind::kMap) {
          for (const auto& [role, names] : roles->map) {
            std::vector<std::string>* dst = role == "user"        ? &d.user_tags
                                            : role == "assistant" ? &d.assistant_tags
                                            : role == "system"    ? &d.system_tags
                                                                  : nullptr;
            if (!dst) {
              refuse(at + ".roles." + role, "only user, assistant and system roles are supported");
              continue;
            }
            dst->clear();
            for (const auto& n : names.items)
              if (auto v = n.as_string()) dst->push_back(*v);
          }
        }
        if (const YamlNode* ct = e.find("chat_template"); ct && !ct->is_null())
          note(at + ".chat_template: the recipe has one chat template ([model] chat_template)");
      } else if (type.rfind("sharegpt", 0) == 0) {
        d.form = Dataset::Form::kShareGpt;
        d.messages = s("field_messages", "conversations");
        d.user_tags = {"human", "user"};
        d.assistant_tags = {"gpt", "assistant"};
      } else if (type == "completion") {
        d.form = Dataset::Form::kText;
        d.text = s("field", "text");
        text_datasets_ = true;
      } else {
        refuse(at + ".type",
               (type.empty() ? std::string("missing") : type) +
                   ": ciuic converts the types alpaca, chat_template, sharegpt and completion");
        continue;
      }
      if (d.form != Dataset::Form::kText) chat_datasets_ = true;
      for (const auto& [k, v] : e.map)
        if (k != "path" && k != "type" && k != "ds_type" && k != "data_files" &&
            k != "field_messages" && k != "message_property_mappings" &&
            k != "message_field_role" && k != "message_field_content" && k != "roles" &&
            k != "chat_template" && k != "field" && k != "split" && k != "name" &&
            k != "conversation")
          ignore(at + "." + k, "not a dataset key ciuic knows");
      const std::string ds_type = s("ds_type", "");
      if (!ds_type.empty() && ds_type != "json")
        refuse(at + ".ds_type", ds_type + ": ciuic converts JSON and JSON lines files");
      if (const YamlNode* df = e.find("data_files"); df && !df->is_null()) {
        std::vector<std::string> files;
        if (df->kind == YamlNode::Kind::kSeq) {
          for (const auto& n : df->items)
            if (auto v = n.as_string()) files.push_back(*v);
        } else if (auto v = df->as_string()) {
          files.push_back(*v);
        }
        for (const auto& f : files) {
          auto p = local(f, false);
          if (!p) p = local((fs::path(d.name) / f).string(), false);
          if (!p) {
            refuse(at + ".data_files", f + ": no such file");
            continue;
          }
          for (const auto& x : data_files(*p, at)) d.files.push_back(x);
        }
      } else if (auto p = local(d.name, false)) {
        d.files = data_files(*p, at);
        if (d.files.empty()) continue;
      } else {
        d.remote = d.name;
      }
      out.push_back(std::move(d));
    }
    if (text_datasets_ && chat_datasets_)
      refuse(key,
             "mixes completion (text) and conversation datasets; a recipe trains on one format");
    pretraining_ = text_datasets_ && !chat_datasets_;
  }

  // ---- shared ---------------------------------------------------------------------------------
  void common_trainer_args() {
    arg(args_.gradient_accumulation_steps, "gradient_accumulation_steps");
    arg(args_.learning_rate, "learning_rate");
    arg(args_.weight_decay, "weight_decay");
    arg(args_.adam_beta1, "adam_beta1");
    arg(args_.adam_beta2, "adam_beta2");
    arg(args_.adam_epsilon, "adam_epsilon");
    arg(args_.max_grad_norm, "max_grad_norm");
    arg(args_.warmup_steps, "warmup_steps");
    arg(args_.warmup_ratio, "warmup_ratio");
  }

  void output_and_logging() {
    if (auto o = str("output_dir")) give("run.output_dir", toml_quote(*o), src("output_dir"));
    if (auto s = whole("seed")) give("run.seed", std::to_string(*s), src("seed"));
    if (auto l = whole("logging_steps"); l && *l >= 1)
      give("log.every_steps", std::to_string(*l), src("logging_steps"));
    if (auto k = whole("save_total_limit"); k && *k >= 0)
      give("checkpoint.keep_last", std::to_string(*k), src("save_total_limit"));
    if (const YamlNode* r = get("report_to")) {
      bool tb = false;
      if (r->kind == YamlNode::Kind::kSeq) {
        for (const auto& i : r->items) tb = tb || i.text == "tensorboard" || i.text == "all";
      } else {
        tb = r->text == "tensorboard" || r->text == "all";
      }
      if (tb) give("log.tensorboard", "true", src("report_to"));
    }
  }

  void schedule(const std::string& type, const std::string& key) {
    sched_type_ = type;
    sched_key_ = key;
    if (type == "cosine_with_min_lr" || type == "cosine") {
      if (const YamlNode* kw = get("lr_scheduler_kwargs"); kw && kw->kind == YamlNode::Kind::kMap) {
        if (const YamlNode* r = kw->find("min_lr_rate"); r && r->as_number())
          min_ratio_ = {*r->as_number(), src("lr_scheduler_kwargs.min_lr_rate")};
        if (const YamlNode* m = kw->find("min_lr"); m && m->as_number())
          min_lr_ = {*m->as_number(), src("lr_scheduler_kwargs.min_lr")};
      }
      if (auto r = num("cosine_min_lr_ratio")) min_ratio_ = {*r, src("cosine_min_lr_ratio")};
    }
    if (type != "linear" && type != "cosine" && type != "cosine_with_min_lr" &&
        type != "constant" && type != "constant_with_warmup")
      refuse(key.empty() ? "lr_scheduler" : key,
             type +
                 ": ciuic's schedules are linear, cosine (also with a minimum), "
                 "constant and constant_with_warmup");
  }

  void optimizer(const std::string& name, const std::string& key) {
    const std::string n = lower(name);
    static const std::set<std::string> same = {
        "adamw_torch",     "adamw_torch_fused",    "adamw_hf", "adamw_apex_fused", "adamw",
        "adamw_torch_xla", "adamw_torch_npu_fused"};
    static const std::set<std::string> quantized = {
        "adamw_bnb_8bit",   "adamw_8bit",       "paged_adamw_8bit", "paged_adamw_32bit",
        "adamw_torch_4bit", "adamw_torch_8bit", "paged_adamw",      "adamw_anyprecision"};
    if (same.count(n)) {
      optimizer_source_ =
          root_.find(key) ? src(key) : tool_name_ + "'s default optimizer (" + name + ")";
      return;
    }
    if (quantized.count(n)) {
      optimizer_source_ = src(key);
      note(key + " = " + name +
           " -> ciuic's AdamW: the same update, with the moments kept in fp32 (8-bit and paged "
           "states are a memory saving ciuic does not have; ciuic-run --plan shows the memory)");
      return;
    }
    refuse(key,
           name + ": ciuic implements AdamW (adamw_torch and its fused, 8-bit and paged variants)");
  }

  void deepspeed(const std::string& key) {
    const std::optional<std::string> ds = str(key);
    if (!ds) return;
    const std::optional<fs::path> p = local(*ds, false);
    if (!p) {
      refuse(key,
             *ds + ": no such file (looked in the working directory and next to " + origin_ + ")");
      return;
    }
    ds_path_ = *p;
    ds_text_ = read_file(*p, src(key));
  }

  void rest() {
    for (const auto& [k, v] : root_.map) {
      if (read_.count(k)) continue;
      auto r = reasons_.find(k);
      ignore(k, r != reasons_.end() ? r->second : "not a " + tool_name_ + " key ciuic knows");
    }
  }

  // ---- the recipe -----------------------------------------------------------------------------
  TrainingImport finish() {
    ImportOptions o;
    o.tool = std::string(flag_) + " " + path_.filename().string();
    o.deepspeed_origin = ds_path_.empty() ? "" : ds_path_.filename().string();
    o.trainer = args_;
    o.refused = refused_;
    const std::string ds_text = ds_path_.empty() ? "{}" : ds_text_;
    const std::string ds_origin =
        ds_path_.empty() ? shown(path_.string()) : shown(ds_path_.string());
    // 1. Check the DeepSpeed config (and refuse what is refused) before writing any data.
    {
      ImportOptions check = o;
      check.trainer.num_training_steps.reset();
      (void)import_deepspeed(ds_text, ds_origin, overrides_, check);
    }
    // 2. The data.
    TrainingImport out;
    const int64_t world = nproc_.value_or(1) * nnodes_.value_or(1);
    if (!nproc_ && !nnodes_)
      note(
          "the world size is 1, the recipe's [cluster] default (no --nproc or --nnodes given): the "
          "steps per epoch "
          "below are for one process; import again with --nproc N for N");
    const auto write_all = [&](std::vector<Dataset>& list, const char* kind,
                               std::vector<std::string>& files, size_t& n, bool& all_local) {
      for (size_t i = 0; i < list.size(); ++i) {
        Dataset& d = list[i];
        if (d.files.empty()) {
          all_local = false;
          placeholders_.push_back(std::string("data.") + kind);
          note("dataset " + d.name + " is not a local file (" + d.remote +
               "): download it as JSON or JSON lines, "
               "convert it with ciuic-run " +
               flag_ + " again, or give --set data." + kind + "=[...] (ciuic chat JSONL)");
          continue;
        }
        std::string safe;
        for (char c : d.name)
          safe += std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.'
                      ? c
                      : '_';
        if (safe.size() > 80) safe.resize(80);
        const fs::path file = fs::absolute(fs::path(data_dir_)) /
                              (std::string(kind == std::string("eval_sources") ? "eval-" : "") +
                               (i < 9 ? "0" : "") + std::to_string(i + 1) + "-" + safe + ".jsonl");
        const size_t count = DataWriter(d).write(file);
        if (count == 0)
          throw UsageError(shown(d.origin) + ": dataset " + shown(d.name) + " has no records");
        n += count;
        files.push_back(file.string());
        out.written.push_back(file.string());
        note("dataset " + d.name + ": " + std::to_string(count) + " records -> " + file.string());
      }
    };
    std::vector<std::string> sources, eval_sources;
    size_t n_train = 0, n_eval = 0;
    bool train_local = true, eval_local = true;
    write_all(datasets_, "sources", sources, n_train, train_local);
    write_all(eval_datasets_, "eval_sources", eval_sources, n_eval, eval_local);
    const auto list = [](const std::vector<std::string>& v) {
      std::string s = "[";
      for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + toml_quote(v[i]);
      return s + "]";
    };
    give("data.plugin", "\"cached_ssd\"", "ciuic's JSONL data plugin (docs/data.md)");
    give("data.format", pretraining_ ? "\"text\"" : "\"chat\"",
         pretraining_ ? "plain text documents"
                      : "conversations {messages: [{role, content}]}, converted");
    give("data.sources", sources.empty() ? "[\"train.jsonl\"]" : list(sources),
         train_local ? "the datasets, converted" : "placeholder: a dataset is not a local file");
    if (!eval_sources.empty())
      give("data.eval_sources", list(eval_sources), "the eval datasets, converted");
    double eval_fraction = 0;
    if (val_size_ && eval_sources.empty()) {
      eval_fraction =
          val_size_->first < 1 ? val_size_->first : val_size_->first / std::max<double>(1, n_train);
      if (eval_fraction > 0.5)
        refuse_now("val_size", "held out " + format_number(eval_fraction) +
                                   " of the data; ciuic holds out at most 0.5");
      give("data.eval_fraction", float_literal(eval_fraction),
           val_size_->second +
               (val_size_->first >= 1 ? " records of " + std::to_string(n_train) : std::string()) +
               " (ciuic picks the held-out records by a hash: about this fraction)");
    }
    if (!pretraining_) {
      const bool on_prompt = train_on_prompt_ && train_on_prompt_->first;
      give("data.assistant_only_loss", on_prompt ? "false" : "true",
           train_on_prompt_ ? train_on_prompt_->second
                            : tool_name_ + "'s default: loss on the replies only");
    }
    const bool packing = packing_ && packing_->first;
    give("data.packing", packing ? "true" : "false",
         packing_ ? packing_->second +
                        (packing ? " (ciuic's packing masks attention between documents)" : "")
                  : tool_name_ + "'s default: one example per row");
    give("train.seq_len", std::to_string(seq_len_.first), seq_len_.second);
    // 3. The run's length: max_steps, or epochs over the data as the HF Trainer counts them.
    const auto micro = static_cast<int64_t>(args_.per_device_train_batch_size.value);
    const auto acc =
        std::max<int64_t>(1, static_cast<int64_t>(args_.gradient_accumulation_steps.value));
    std::optional<int64_t> steps;
    std::string steps_source;
    if (max_steps_) {
      steps = max_steps_->first;
      steps_source = max_steps_->second;
    } else if (train_local && !packing && micro > 0) {
      const double kept = static_cast<double>(n_train) * (1.0 - eval_fraction);
      const auto n = static_cast<int64_t>(std::ceil(kept - 1e-9));
      const int64_t batches = (n + micro * world - 1) / (micro * world);
      const int64_t per_epoch = std::max<int64_t>(1, (batches + acc - 1) / acc);
      steps =
          static_cast<int64_t>(std::ceil(epochs_.first * static_cast<double>(per_epoch) - 1e-9));
      steps_source = "epochs " + format_number(epochs_.first) + " (" + epochs_.second + ") x " +
                     std::to_string(per_epoch) + " steps per epoch: ceil(ceil(" +
                     std::to_string(n) + " records / (micro-batch " + std::to_string(micro) +
                     " x world " + std::to_string(world) + ")) / accumulation " +
                     std::to_string(acc) + "), as the HF Trainer counts";
      steps_per_epoch_ = per_epoch;
    } else {
      placeholders_.push_back("train.max_steps");
      note(std::string("the run's length: ") + format_number(epochs_.first) + " epochs (" +
           epochs_.second + ") cannot be " +
           (packing ? "counted before the data is packed into rows (the rows depend on the tokens)"
                    : "counted: a dataset is not a local file") +
           "; give --set train.max_steps=N");
    }
    if (steps) {
      give("train.max_steps", std::to_string(*steps), steps_source);
      args_.num_training_steps = *steps;
      args_.num_training_steps_source = "[train] max_steps, " + steps_source;
      o.trainer = args_;
    } else if (!set_by_user("train.max_steps")) {
      give("train.max_steps", "1000",
           "placeholder: the run's length (give --set train.max_steps=N)");
    }
    if (steps_per_epoch_) {
      if (per_epoch_.first && *per_epoch_.first > 0)
        give("train.eval_every_steps",
             std::to_string(std::max<int64_t>(1, *steps_per_epoch_ / *per_epoch_.first)),
             src("evals_per_epoch") + ": steps per epoch / evals per epoch");
      if (per_epoch_.second && *per_epoch_.second > 0)
        give("checkpoint.every_steps",
             std::to_string(std::max<int64_t>(1, *steps_per_epoch_ / *per_epoch_.second)),
             src("saves_per_epoch") + ": steps per epoch / saves per epoch");
    }
    // 4. What the Trainer builds itself when the DeepSpeed config (or its absence) leaves it out.
    trainer_groups(o, steps);
    o.given = given_;
    o.ignored = ignored_;
    o.notes = notes_;
    o.placeholders = placeholders_;
    o.refused = refused_;
    out.recipe = import_deepspeed(ds_text, ds_origin, overrides_, o);
    return out;
  }

  void refuse_now(const std::string& key, const std::string& why) {
    throw UsageError(origin_ + ": " + key + ": " + why);
  }

  void trainer_groups(ImportOptions& o, std::optional<int64_t> steps) {
    const TrainerValue& lr = args_.learning_rate;
    // The optimizer (the Trainer's AdamW) when the config has no optimizer section.
    o.given_unless.push_back(
        {{"optimizer"},
         {{"optimizer.lr", float_literal(lr.value), lr.source},
          {"optimizer.weight_decay", float_literal(args_.weight_decay.value),
           args_.weight_decay.source},
          {"optimizer.betas",
           "[" + float_literal(args_.adam_beta1.value) + ", " +
               float_literal(args_.adam_beta2.value) + "]",
           args_.adam_beta1.source + ", " + args_.adam_beta2.source},
          {"optimizer.eps", float_literal(args_.adam_epsilon.value), args_.adam_epsilon.source}}});
    // The schedule (the Trainer's lr_scheduler_type) when the config has no scheduler section.
    std::vector<RecipeValue> sched;
    const std::string skey = sched_key_.empty() ? tool_name_ + "'s default schedule " + sched_type_
                                                : src(sched_key_) + " = " + sched_type_;
    int64_t warmup = 0;
    std::string wsrc;
    const TrainerValue &ws = args_.warmup_steps, &wr = args_.warmup_ratio;
    if (ws.value >= 1) {
      warmup = static_cast<int64_t>(ws.value);
      wsrc = ws.source;
    } else if (ws.value > 0 || wr.value > 0) {
      const double r = ws.value > 0 ? ws.value : wr.value;
      if (steps) {
        warmup = static_cast<int64_t>(std::ceil(r * static_cast<double>(*steps)));
        wsrc = "ceil(" + format_number(r) + " x " + std::to_string(*steps) + " steps), " +
               (ws.value > 0 ? ws.source : wr.source);
      } else {
        placeholders_.push_back("scheduler.warmup_num_steps");
        wsrc = "placeholder: a warmup ratio needs the run's length";
      }
    } else {
      wsrc = "no warmup (" + ws.source + " 0)";
    }
    const std::string wlit = std::to_string(warmup);
    if (sched_type_ == "linear") {
      sched = {
          {"scheduler.type", "\"warmup_decay\"", skey + ": linear warmup, then linear decay to 0"},
          {"scheduler.warmup_type", "\"linear\"", "the HF Trainer's warmup is linear"},
          {"scheduler.warmup_min_lr", "0.0", "the HF Trainer's warmup starts at 0"},
          {"scheduler.warmup_max_lr", float_literal(lr.value), lr.source},
          {"scheduler.warmup_num_steps", wlit, wsrc},
          {"scheduler.total_num_steps", "0", "[train] max_steps"}};
    } else if (sched_type_ == "cosine" || sched_type_ == "cosine_with_min_lr") {
      double ratio = 0;
      std::string rsrc = "the HF Trainer's cosine ends at 0";
      if (min_ratio_) {
        ratio = min_ratio_->first;
        rsrc = min_ratio_->second;
      } else if (min_lr_ && lr.value > 0) {
        ratio = min_lr_->first / lr.value;
        rsrc = min_lr_->second + " / learning_rate";
      }
      sched = {{"scheduler.type", "\"warmup_cosine\"", skey + ": linear warmup, then cosine decay"},
               {"scheduler.warmup_type", "\"linear\"", "the HF Trainer's warmup is linear"},
               {"scheduler.warmup_min_ratio", "0.0", "the HF Trainer's warmup starts at 0"},
               {"scheduler.cos_min_ratio", float_literal(ratio), rsrc},
               {"scheduler.warmup_num_steps", wlit, wsrc},
               {"scheduler.total_num_steps", "0", "[train] max_steps"}};
    } else if (sched_type_ == "constant_with_warmup") {
      sched = {{"scheduler.type", "\"warmup\"", skey + ": linear warmup, then constant"},
               {"scheduler.warmup_type", "\"linear\"", "the HF Trainer's warmup is linear"},
               {"scheduler.warmup_min_lr", "0.0", "the HF Trainer's warmup starts at 0"},
               {"scheduler.warmup_max_lr", float_literal(lr.value), lr.source},
               {"scheduler.warmup_num_steps", wlit, wsrc}};
    } else {
      sched = {
          {"scheduler.type", "\"constant\"", skey + " (the HF Trainer's constant has no warmup)"}};
    }
    o.given_unless.push_back({{"scheduler"}, sched});
    // The batch, as the Trainer's dataloader makes it; the planner when the file leaves the
    // micro-batch to TrainingArguments' default.
    const TrainerValue& pd = args_.per_device_train_batch_size;
    const TrainerValue& ga = args_.gradient_accumulation_steps;
    if (pd.given) {
      o.given_unless.push_back({{"train_micro_batch_size_per_gpu", "train_batch_size"},
                                {{"train.micro_batch_size",
                                  std::to_string(static_cast<int64_t>(pd.value)), pd.source}}});
      o.given_unless.push_back({{"gradient_accumulation_steps", "train_batch_size"},
                                {{"train.gradient_accumulation_steps",
                                  std::to_string(static_cast<int64_t>(ga.value)), ga.source}}});
    } else {
      const int64_t world = nproc_.value_or(1) * nnodes_.value_or(1);
      o.given_unless.push_back(
          {{"train_micro_batch_size_per_gpu", "train_batch_size"},
           {{"train.micro_batch_size", "\"auto\"",
             "ciuic's planner: the largest micro-batch that fits, for global_batch_size"},
            {"train.global_batch_size",
             std::to_string(static_cast<int64_t>(pd.value) * static_cast<int64_t>(ga.value) *
                            world),
             pd.source + " " + std::to_string(static_cast<int64_t>(pd.value)) + " x accumulation " +
                 std::to_string(static_cast<int64_t>(ga.value)) + " (" + ga.source + ") x world " +
                 std::to_string(world)}}});
    }
    // Mixed precision (accelerate adds the section to the config when the arguments ask for it).
    const TrainerValue &bf = args_.bf16, &fp = args_.fp16;
    if (bf.value != 0 && fp.value != 0) refuse_now("bf16", "bf16 and fp16 are both on");
    o.given_unless.push_back(
        {{"fp16", "bf16", "bfloat16"},
         {{"precision.plugin",
           bf.value != 0   ? "\"bf16\""
           : fp.value != 0 ? "\"fp16\""
                           : "\"fp32\"",
           bf.value != 0   ? bf.source
           : fp.value != 0 ? fp.source
                           : "neither bf16 nor fp16 (HF TrainingArguments default: fp32)"}}});
    // Clipping: without a DeepSpeed config the Trainer clips to max_grad_norm; with one, DeepSpeed
    // clips to its gradient_clipping (filled from max_grad_norm when "auto").
    if (ds_path_.empty())
      given_.push_back({"train.gradient_clipping", float_literal(args_.max_grad_norm.value),
                        args_.max_grad_norm.source});
  }

  TrainingTool tool_;
  fs::path path_;
  std::string origin_, tool_name_, flag_;
  std::vector<std::string> overrides_;
  std::string data_dir_;
  std::set<std::string> set_keys_;
  std::optional<int64_t> nproc_, nnodes_;
  YamlNode root_;
  std::set<std::string> read_;
  std::map<std::string, std::string> reasons_;
  std::vector<std::string> ignored_, refused_, notes_, placeholders_;
  std::vector<RecipeValue> given_;
  TrainerArgs args_;
  fs::path model_dir_, ds_path_;
  std::string ds_text_;
  std::vector<Dataset> datasets_, eval_datasets_;
  bool info_loaded_ = false, pretraining_ = false, text_datasets_ = false, chat_datasets_ = false;
  json info_;
  std::optional<std::pair<double, std::string>> val_size_;
  std::optional<std::pair<bool, std::string>> train_on_prompt_, packing_;
  std::pair<int64_t, std::string> seq_len_{2048, ""};
  std::pair<double, std::string> epochs_{3.0, ""};
  std::optional<std::pair<int64_t, std::string>> max_steps_;
  std::optional<int64_t> steps_per_epoch_;
  std::pair<std::optional<int64_t>, std::optional<int64_t>> per_epoch_;
  std::string sched_type_, sched_key_, optimizer_source_;
  std::optional<std::pair<double, std::string>> min_ratio_, min_lr_;
};

}  // namespace

TrainingImport import_training_file(TrainingTool tool, const std::string& path,
                                    const std::vector<std::string>& overrides,
                                    const std::string& data_dir) {
  Reader r(tool, path, overrides, data_dir);
  return r.run();
}

}  // namespace ciuic::importer
