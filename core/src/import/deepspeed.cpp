// DeepSpeed config -> ciuic recipe (see deepspeed.h and docs/deepspeed.md).
#include "import/deepspeed.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include <ciuic/error.h>
#include <ciuic/json.h>

#include "base/text.h"
#include "recipe/schema.h"
#include "sdk/printable.h"
#include "sdk/toml_format.h"

namespace ciuic::importer {

using recipe::find_section;
using recipe::parse_literal;
using recipe::section_names;

namespace {

using json = nlohmann::ordered_json;

// ---- output model --------------------------------------------------------------------------
struct Entry {
  std::string key, value, comment;  // value: a TOML literal
};

struct Section {
  std::string name;
  std::vector<std::string> comments;  // printed under the header
  std::vector<Entry> entries;
};

std::string float_lit(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, r.ptr);
  if (size_t e = s.find('e'); e != std::string::npos) {  // 2e+08 -> 2e8
    std::string mant = s.substr(0, e), exp = s.substr(e + 1);
    bool neg = !exp.empty() && exp[0] == '-';
    if (!exp.empty() && (exp[0] == '-' || exp[0] == '+')) exp.erase(0, 1);
    while (exp.size() > 1 && exp[0] == '0') exp.erase(0, 1);
    s = mant + "e" + (neg ? "-" : "") + exp;
  }
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

// A value for a message: its JSON text (strings quoted, control characters as \u001b), at most
// ~60 bytes, cut at a character boundary.
std::string short_json(const json& v) {
  std::string s = v.dump();
  if (s.size() <= 60) return s;
  size_t cut = 57;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return s.substr(0, cut) + "...";
}

// Text from the config (keys, paths, values) or the command line as it may appear in a message,
// a comment or a terminal line: one line, control bytes and invalid UTF-8 written \xNN
// (sdk/printable.h). The config is untrusted: a key holding "\n[run]\nplugin_paths = ..." must not
// become a line of the recipe (issue 27).
std::string shown(const std::string& s) { return printable_text(s, /*keep_lines=*/false); }

// "[a.b]" for the section "a.b", each part a bare or quoted TOML key.
std::string section_header(const std::string& name) {
  std::string h;
  for (const auto& part : text::split(name, '.')) h += (h.empty() ? "" : ".") + toml_key(part);
  return "[" + h + "]";
}

// ---- parsing in linear time --------------------------------------------------------------------
// nlohmann's ordered_json parser looks every key up in its object — a vector, to keep the order —
// before inserting it: quadratic in the keys of one object (300k keys took more than 30 s, issue
// 27). This SAX handler builds the same value with a hash index of each open object's keys:
// linear. A key given twice keeps its first place and its last value, as ordered_json's parser
// does (Python's json, which DeepSpeed reads with, keeps the last value too).
class OrderedBuilder {
 public:
  explicit OrderedBuilder(json& root) : root_(root) {}

  bool null() { return put(nullptr); }
  bool boolean(bool v) { return put(v); }
  bool number_integer(json::number_integer_t v) { return put(v); }
  bool number_unsigned(json::number_unsigned_t v) { return put(v); }
  bool number_float(json::number_float_t v, const json::string_t&) { return put(v); }
  bool string(json::string_t& v) { return put(std::move(v)); }
  bool binary(json::binary_t& v) { return put(json::binary(std::move(v))); }
  bool start_object(std::size_t) { return open(json::object()); }
  bool start_array(std::size_t) { return open(json::array()); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(json::string_t& k) {
    Open& o = open_.back();
    auto& items = static_cast<json::object_t::Container&>(o.value->get_ref<json::object_t&>());
    const auto [at, inserted] = o.index.try_emplace(k, items.size());
    if (inserted) items.emplace_back(std::move(k), nullptr);
    o.slot = &items[at->second].second;
    return true;
  }
  template <class Exception>
  bool parse_error(std::size_t, const std::string&, const Exception& e) {
    throw e;  // parse_error or out_of_range, with nlohmann's position and text
  }

 private:
  struct Open {
    json* value;                                    // the array or object being filled
    std::unordered_map<std::string, size_t> index;  // an object's keys -> their place
    json* slot = nullptr;                           // an object's value after key()
  };

  // Stores `v` where the next value goes; returns where it went.
  json* place(json&& v) {
    if (open_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    Open& o = open_.back();
    if (o.value->is_array()) {
      auto& items = o.value->get_ref<json::array_t&>();
      items.push_back(std::move(v));
      return &items.back();
    }
    *o.slot = std::move(v);
    return o.slot;
  }
  bool put(json&& v) {
    place(std::move(v));
    return true;
  }
  bool open(json&& container) {
    open_.push_back(Open{place(std::move(container)), {}, nullptr});
    return true;
  }
  bool close() {
    open_.pop_back();
    return true;
  }

  json& root_;
  std::vector<Open> open_;
};

// `text` as JSON with its objects' keys in file order; checked against kMaxJsonDepth first (a
// UsageError naming `origin`), so nothing below walks deeper.
json parse_ordered(const std::string& text, const std::string& origin) {
  check_json_depth(text, origin, kExitUsage);
  json root;
  OrderedBuilder builder(root);
  json::sax_parse(text, &builder);
  return root;
}

class Importer {
 public:
  Importer(const std::string& origin, const std::vector<std::string>& overrides,
           const ImportOptions& options)
      : origin_(shown(origin)), options_(options), args_(options.trainer) {
    for (const auto& g : options.given) sets_.push_back({g.key, g.literal, shown(g.comment)});
    for (const auto& o : overrides) parse_override(o);
  }

  DeepSpeedImport run(const std::string& text) {
    json root;
    try {
      root = parse_ordered(text, origin_);
    } catch (const json::exception& e) {  // parse_error, or out_of_range (a number that overflows)
      throw UsageError(origin_ + ": not valid JSON: " + std::string(e.what()) +
                       " (ciuic-run --from-deepspeed reads a DeepSpeed config .json)");
    }
    if (!root.is_object())
      throw UsageError(origin_ + ": expected a JSON object (a DeepSpeed config)");
    // The Trainer's own values for what the config leaves out, before --set (which wins).
    {
      std::vector<Set> conditional;
      for (const auto& c : options_.given_unless) {
        bool present = false;
        for (const auto& k : c.unless) present = present || root.contains(k);
        if (!present)
          for (const auto& g : c.values)
            conditional.push_back({g.key, g.literal, shown(g.comment)});
      }
      sets_.insert(sets_.begin() + static_cast<std::ptrdiff_t>(options_.given.size()),
                   conditional.begin(), conditional.end());
    }

    batch(root);
    clipping(root);
    precision(root);
    zero(root);
    optimizer(root);
    scheduler(root);
    monitoring(root);
    top_level_rest(root);
    finish_placeholders();

    if (!mismatches_.empty()) {
      std::string m = origin_ + ": " + std::to_string(mismatches_.size()) +
                      " value(s) differ from the training arguments (the HF Trainer refuses this "
                      "too; write \"auto\" "
                      "in the DeepSpeed config, or the same value):";
      for (const auto& a : mismatches_) m += "\n  " + a;
      throw UsageError(m);
    }
    if (!missing_auto_.empty()) {
      std::string m =
          origin_ + ": " + std::to_string(missing_auto_.size()) +
          " value(s) are \"auto\" (the HF Trainer fills them in; ciuic needs them given):";
      for (const auto& a : missing_auto_) m += "\n  " + a;
      throw UsageError(m);
    }
    if (!options_.refused.empty()) {
      std::vector<std::string> all;
      for (const auto& r : options_.refused) all.push_back(shown(r));
      if (!options_.deepspeed_origin.empty())
        for (const auto& r : refused_) all.push_back(shown(options_.deepspeed_origin) + ": " + r);
      refused_ = all;
    }
    if (!refused_.empty()) {
      std::string m = (options_.tool.empty() ? origin_ : shown(options_.tool)) + ": " +
                      (refused_.size() == 1
                           ? std::string("uses a feature ciuic does not support:")
                           : std::to_string(refused_.size()) + " features ciuic does not support:");
      for (const auto& r : refused_) m += "\n  " + r;
      throw UsageError(m);
    }
    apply_overrides();
    if (!options_.tool.empty()) {  // a training file's import: its own lists first
      std::vector<std::string> ig, no, ph;
      for (const auto& i : options_.ignored) ig.push_back(shown(i));
      for (const auto& i : ignored_) ig.push_back(shown(options_.deepspeed_origin) + ": " + i);
      for (const auto& n : options_.notes) no.push_back(shown(n));
      if (!options_.deepspeed_origin.empty()) no.insert(no.end(), notes_.begin(), notes_.end());
      for (const auto& p : options_.placeholders) ph.push_back(shown(p));
      for (const auto& p : placeholders_)
        if (std::find(ph.begin(), ph.end(), p) == ph.end()) ph.push_back(p);
      ignored_ = ig;
      notes_ = no;
      placeholders_ = ph;
    }
    DeepSpeedImport out;
    out.toml = render();
    out.ignored = ignored_;
    out.notes = notes_;
    out.placeholders = placeholders_;
    return out;
  }

 private:
  // ---- --set ------------------------------------------------------------------------------
  void parse_override(const std::string& o) {
    const size_t eq = o.find('=');
    if (eq == std::string::npos)
      throw UsageError("--set " + shown(o) + ": expected section.key=value");
    std::string lhs = o.substr(0, eq), rhs = o.substr(eq + 1);
    while (!lhs.empty() && std::isspace(static_cast<unsigned char>(lhs.back()))) lhs.pop_back();
    while (!rhs.empty() && std::isspace(static_cast<unsigned char>(rhs.front()))) rhs.erase(0, 1);
    const size_t dot = lhs.rfind('.');
    if (dot == std::string::npos || dot == 0 || dot + 1 == lhs.size())
      throw UsageError("--set " + shown(o) +
                       ": expected section.key=value (recipe keys, e.g. optimizer.lr=3e-5)");
    // Bare keys only, as for a run's --set (every recipe key is one).
    for (const auto& part : text::split(lhs, '.'))
      if (!is_bare_key(part))
        throw UsageError("--set " + shown(o) +
                         ": a key has letters, digits, '_' and '-' only (section.key=value)");
    const std::string sec = lhs.substr(0, dot);
    if (!find_section(sec)) {
      std::string m = "--set " + shown(o) + ": unknown recipe section [" + sec + "]";
      const std::string near = text::closest(sec, section_names());
      if (!near.empty()) m += "; did you mean [" + near + "]?";
      m += " (--set names recipe keys, not DeepSpeed keys)";
      throw UsageError(m);
    }
    std::string lit;
    if (auto t = parse_literal(rhs)) {
      lit = format_value(*t->get("v"));
    } else if (!rhs.empty() && rhs.find_first_of("\"'[]{}=#") == std::string::npos &&
               shown(rhs) == rhs) {
      lit = toml_quote(rhs);  // a bare word: printable UTF-8 text, as for a run's --set
    } else {
      throw UsageError("--set " + shown(o) +
                       ": the value is not a TOML value (strings need quotes: '\"text\"')");
    }
    sets_.push_back({lhs, lit, "--set"});
  }

  const std::string* set_value(const std::string& recipe_key) const {
    const std::string* v = nullptr;
    for (const auto& e : sets_)
      if (e.key == recipe_key) v = &e.literal;
    return v;
  }

  // The --set value of `recipe_key` when it is a string (a plugin name), else nullopt.
  std::optional<std::string> set_string(const std::string& recipe_key) const {
    const std::string* v = set_value(recipe_key);
    if (!v) return std::nullopt;
    auto t = parse_literal(*v);
    if (!t) return std::nullopt;
    return t->get("v")->value_exact<std::string>();
  }

  std::optional<double> set_number(const std::string& recipe_key) const {
    const std::string* v = set_value(recipe_key);
    if (!v) return std::nullopt;
    auto t = parse_literal(*v);
    if (!t) return std::nullopt;
    const toml::node* n = t->get("v");
    if (auto i = n->value_exact<int64_t>()) return static_cast<double>(*i);
    if (auto f = n->value_exact<double>()) return *f;
    return std::nullopt;
  }

  void apply_overrides() {
    for (const auto& [lhs, lit, comment] : sets_) {
      const size_t dot = lhs.rfind('.');
      Section& s = sec(lhs.substr(0, dot));
      const std::string key = lhs.substr(dot + 1);
      bool done = false;
      for (auto& e : s.entries)
        if (e.key == key) {
          e.value = lit;
          e.comment = comment;
          done = true;
        }
      if (!done) s.entries.push_back({key, lit, comment});
      placeholders_.erase(std::remove(placeholders_.begin(), placeholders_.end(), lhs),
                          placeholders_.end());
    }
  }

  // ---- output -------------------------------------------------------------------------------
  Section& sec(const std::string& name) {
    for (auto& s : sections_)
      if (s.name == name) return s;
    sections_.push_back(Section{name, {}, {}});
    return sections_.back();
  }

  void put(const std::string& section, const std::string& key, const std::string& value,
           const std::string& comment_in) {
    const std::string comment = from(comment_in);
    Section& s = sec(section);
    for (auto& e : s.entries)
      if (e.key == key) {
        e.value = value;
        e.comment = comment;
        return;
      }
    s.entries.push_back({key, value, comment});
  }

  // Every list entry is made printable here, once: they quote keys and values of the config.
  void ignore(const std::string& path, const std::string& reason) {
    ignored_.push_back(shown(path + ": " + reason));
  }
  void note(const std::string& n) { notes_.push_back(shown(n)); }
  void refuse(const std::string& path, const std::string& why) {
    refused_.push_back(shown(path + ": " + why));
  }

  std::string render() const {
    static const char* kOrder[] = {
        "run",       "cluster", "model",    "model.config", "train",      "optimizer", "scheduler",
        "precision", "comm",    "sharding", "data",         "checkpoint", "log"};
    // Data, never code: every comment goes through toml_comment() (one line, whatever it quotes),
    // every key through toml_key(), every value is a literal made by toml_quote()/format_value()
    // or a number (tests: DeepSpeedImport.HostileKeysAndValuesStayData).
    std::string o;
    if (options_.tool.empty()) {
      o = toml_comment("Imported from " + origin_ +
                       " by ciuic-run --from-deepspeed (docs/deepspeed.md).") +
          "\n";
      o += "# Each value says where it comes from: a DeepSpeed key, DeepSpeed's default, \"auto\" "
           "and the value the HF\n"
           "# Trainer (or ciuic) gives it, --set, or a placeholder.\n";
    } else {
      o = toml_comment("Imported by ciuic-run " + options_.tool +
                       (options_.deepspeed_origin.empty()
                            ? ""
                            : " with the DeepSpeed config " + options_.deepspeed_origin) +
                       " (docs/migrate.md).") +
          "\n";
      o += "# Each value says where it comes from: a key of the training file or of the DeepSpeed "
           "config, a default of\n"
           "# the HF Trainer or DeepSpeed, --set, or a placeholder.\n";
    }
    const auto list = [&](const char* title, const std::vector<std::string>& items) {
      if (items.empty()) return;
      o += "#\n" + toml_comment(title) + "\n";
      for (const auto& i : items) o += toml_comment("  " + i) + "\n";
    };
    list("Notes:", notes_);
    if (options_.tool.empty()) {
      list("DeepSpeed keys without a ciuic meaning (ignored):", ignored_);
      list("Placeholders (a DeepSpeed config does not say them; edit, or give them with --set):",
           placeholders_);
    } else {
      list("Keys without a ciuic meaning (ignored):", ignored_);
      list("Placeholders (edit, or give them with --set):", placeholders_);
    }
    std::vector<const Section*> order;
    for (const char* n : kOrder)
      for (const auto& s : sections_)
        if (s.name == n) order.push_back(&s);
    for (const auto& s : sections_) {
      bool known = false;
      for (const char* n : kOrder) known = known || s.name == n;
      if (!known) order.push_back(&s);
    }
    for (const Section* s : order) {
      if (s->entries.empty() && s->comments.empty()) continue;
      o += "\n" + section_header(s->name) + "\n";
      for (const auto& c : s->comments) o += toml_comment(c) + "\n";
      size_t w = 0;
      for (const auto& e : s->entries) w = std::max(w, toml_key(e.key).size() + 3 + e.value.size());
      for (const auto& e : s->entries) {
        std::string line = toml_key(e.key) + " = " + e.value;
        if (!e.comment.empty())
          line += std::string(w + 2 - line.size(), ' ') + toml_comment(e.comment);
        o += line + "\n";
      }
    }
    return o;
  }

  // ---- reading JSON -------------------------------------------------------------------------
  // Marks `key` of `obj` (at `path`) as read; returns null when absent. "auto" is what the HF
  // Trainer fills in (hf_auto), unless --set (or the training file) gives recipe_key: then null is
  // returned and that value is used. An "auto" without an HF value is recorded as missing.
  const json* take(const json& obj, const std::string& path, const std::string& key,
                   const std::string& recipe_key) {
    const std::string p = join(path, key);
    read_.insert(p);
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return nullptr;
    if (it->is_string() && it->get<std::string>() == "auto") {
      if (!recipe_key.empty() && set_value(recipe_key)) return nullptr;
      if (std::optional<Filled> f = hf_auto(p)) {
        resolved_.push_back(std::move(f->value));
        auto_[p] = "\"auto\" -> " + f->text + ": " + f->source;
        return &resolved_.back();
      }
      if (recipe_key.empty()) {
        refuse(p, "\"auto\" has no ciuic equivalent here; write the value");
      } else {
        missing_auto_.push_back(shown(p) + " = \"auto\": give it with --set " + recipe_key +
                                "=<value>");
      }
      return nullptr;
    }
    if (args_.from_file) check_match(p, *it);
    return &*it;
  }

  static bool is_auto(const json& obj, const std::string& key) {
    auto it = obj.find(key);
    return it != obj.end() && it->is_string() && it->get<std::string>() == "auto";
  }

  // What the HF Trainer writes for an "auto" (transformers' integrations/deepspeed.py:
  // trainer_config_process fills the batch, clipping, optimizer and warmup bounds from its
  // TrainingArguments; trainer_config_finalize the bucket from the model's hidden size and the
  // step counts from the run's length). The micro-batch and fp16/bf16 are decided by their
  // sections (ciuic's planner and choice). nullopt: no HF value.
  struct Filled {
    json value;
    std::string text, source;
  };
  std::optional<Filled> hf_auto(const std::string& p) {
    const auto num = [](const TrainerValue& v) {
      return Filled{v.value, float_lit(v.value), v.source};
    };
    const auto whole = [](const TrainerValue& v) {
      const auto n = static_cast<int64_t>(v.value);
      return Filled{n, std::to_string(n), v.source};
    };
    if (p == "gradient_accumulation_steps") return whole(args_.gradient_accumulation_steps);
    if (p == "gradient_clipping") return num(args_.max_grad_norm);
    if (p == "optimizer.params.lr" || p == "scheduler.params.warmup_max_lr")
      return num(args_.learning_rate);
    if (p == "optimizer.params.betas")
      return Filled{
          json::array({args_.adam_beta1.value, args_.adam_beta2.value}),
          "[" + float_lit(args_.adam_beta1.value) + ", " + float_lit(args_.adam_beta2.value) + "]",
          args_.adam_beta1.source + ", " + args_.adam_beta2.source};
    if (p == "optimizer.params.eps") return num(args_.adam_epsilon);
    if (p == "optimizer.params.weight_decay") return num(args_.weight_decay);
    if (p == "scheduler.params.warmup_min_lr")
      return Filled{0.0, "0.0", "the HF Trainer's fixed value (no TrainingArguments field)"};
    if (p == "scheduler.params.total_num_steps") {
      if (args_.num_training_steps)
        return Filled{*args_.num_training_steps, std::to_string(*args_.num_training_steps),
                      args_.num_training_steps_source};
      return Filled{0, "0",
                    "[train] max_steps, the run's length (the HF Trainer's num_training_steps)"};
    }
    if (p == "scheduler.params.warmup_num_steps") {
      // TrainingArguments.get_warmup_steps: warmup_steps when > 0, else ceil(warmup_ratio x steps).
      // transformers 5 reads warmup_steps < 1 as a ratio, and fills max(1, that): DeepSpeed >=
      // 0.19.6 rejects 0 (older releases made it 2, as ciuic's schedule does).
      const TrainerValue &ws = args_.warmup_steps, &wr = args_.warmup_ratio;
      if (ws.value >= 1) return whole(ws);
      const double ratio = ws.value > 0 ? ws.value : wr.value;
      const std::string& rs = ws.value > 0 ? ws.source : wr.source;
      if (ratio == 0)
        return Filled{1, "1", "max(1, 0): " + ws.source + " 0 (the HF Trainer's smallest warmup)"};
      if (!args_.num_training_steps) return std::nullopt;  // the ratio needs the run's length
      const auto n = std::max<int64_t>(
          1,
          static_cast<int64_t>(std::ceil(ratio * static_cast<double>(*args_.num_training_steps))));
      return Filled{n, std::to_string(n),
                    "ceil(warmup ratio " + float_lit(ratio) + " x " +
                        std::to_string(*args_.num_training_steps) + " steps), " + rs};
    }
    if (p == "zero_optimization.reduce_bucket_size") {
      if (std::optional<int64_t> h = model_hidden_size()) {
        const double v = static_cast<double>(*h) * static_cast<double>(*h);
        return Filled{v, float_lit(v),
                      "hidden_size x hidden_size = " + std::to_string(*h) +
                          "^2 of the model's config.json (the HF Trainer's rule)"};
      }
      return Filled{
          5e8, "5e8",
          "DeepSpeed's default; the HF Trainer takes hidden_size^2 of the model, whose config.json "
          "is not readable here (give --set model.path=DIR)"};
    }
    // ZeRO-3's buckets (for the stage 3 mapping): the HF Trainer's rules, with a readable model.
    if (p == "zero_optimization.stage3_prefetch_bucket_size" ||
        p == "zero_optimization.stage3_param_persistence_threshold") {
      const std::optional<int64_t> h = model_hidden_size();
      const bool prefetch = p == "zero_optimization.stage3_prefetch_bucket_size";
      if (!h)
        return prefetch
                   ? Filled{5e7, "5e7",
                            "DeepSpeed's default; the HF Trainer takes int(0.9 x hidden_size^2) of "
                            "the "
                            "model, whose config.json is not readable here (give --set "
                            "model.path=DIR)"}
                   : Filled{
                         1e5, "1e5",
                         "DeepSpeed's default; the HF Trainer takes 10 x hidden_size of the model, "
                         "whose config.json is not readable here (give --set model.path=DIR)"};
      const auto v =
          prefetch ? static_cast<int64_t>(0.9 * static_cast<double>(*h) * static_cast<double>(*h))
                   : 10 * *h;
      return Filled{v, std::to_string(v),
                    (prefetch ? "int(0.9 x hidden_size^2)" : std::string("10 x hidden_size")) +
                        ", hidden_size " + std::to_string(*h) +
                        " of the model's config.json (the HF Trainer's rule)"};
    }
    return std::nullopt;
  }

  // hidden_size (or the largest of hidden_sizes) of <model.path>/config.json, when the recipe names
  // a readable model folder.
  std::optional<int64_t> model_hidden_size() const {
    const std::optional<std::string> dir = set_string("model.path");
    if (!dir || dir->empty()) return std::nullopt;
    std::ifstream f(std::filesystem::path(*dir) / "config.json", std::ios::binary);
    if (!f) return std::nullopt;
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string text = ss.str();
    if (!json_depth_problem(text).empty()) return std::nullopt;
    const nlohmann::json c = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!c.is_object()) return std::nullopt;
    for (const nlohmann::json* node :
         {&c, c.contains("text_config") ? &c["text_config"] : nullptr}) {
      if (!node || !node->is_object()) continue;
      if (auto it = node->find("hidden_size");
          it != node->end() && it->is_number_integer() && it->get<int64_t>() > 0)
        return it->get<int64_t>();
      if (auto it = node->find("hidden_sizes"); it != node->end() && it->is_array()) {
        int64_t best = 0;
        for (const auto& v : *it)
          if (v.is_number_integer()) best = std::max(best, v.get<int64_t>());
        if (best > 0) return best;
      }
    }
    return std::nullopt;
  }

  // A comment that starts with a DeepSpeed path filled from "auto" says so instead.
  std::string from(const std::string& comment) const {
    if (auto_.empty()) return comment;
    const size_t end = comment.find_first_of(" ;(");
    auto it = auto_.find(comment.substr(0, end));
    if (it == auto_.end()) return comment;
    return it->second + (end == std::string::npos ? "" : comment.substr(end));
  }

  // The HF Trainer's fill_match: with a training file's arguments, a value written in the config
  // (not "auto") must equal the argument it stands for.
  void check_match(const std::string& p, const json& v) {
    const auto differs = [&](double ds, const TrainerValue& hf, const std::string& name) {
      if (ds != hf.value)
        mismatches_.push_back(shown(p) + " = " + short_json(v) + " but " + name + " = " +
                              format_number(hf.value) + " (" + shown(hf.source) + ")");
    };
    const auto num = [&](const json& x) -> std::optional<double> {
      if (x.is_number()) return x.get<double>();
      if (x.is_string()) {
        const std::string s = x.get<std::string>();
        double d = 0;
        auto r = std::from_chars(s.data(), s.data() + s.size(), d);
        if (r.ec == std::errc() && r.ptr == s.data() + s.size()) return d;
      }
      return std::nullopt;
    };
    const std::map<std::string, std::pair<const TrainerValue*, const char*>> match = {
        {"train_micro_batch_size_per_gpu",
         {&args_.per_device_train_batch_size, "per_device_train_batch_size"}},
        {"gradient_accumulation_steps",
         {&args_.gradient_accumulation_steps, "gradient_accumulation_steps"}},
        {"gradient_clipping", {&args_.max_grad_norm, "max_grad_norm"}},
        {"optimizer.params.lr", {&args_.learning_rate, "learning_rate"}},
        {"optimizer.params.eps", {&args_.adam_epsilon, "adam_epsilon"}},
        {"optimizer.params.weight_decay", {&args_.weight_decay, "weight_decay"}},
        {"scheduler.params.warmup_max_lr", {&args_.learning_rate, "learning_rate"}},
    };
    if (auto it = match.find(p); it != match.end()) {
      if (auto d = num(v)) differs(*d, *it->second.first, it->second.second);
    } else if (p == "optimizer.params.betas" && v.is_array() && v.size() == 2) {
      if (auto b = num(v[0])) differs(*b, args_.adam_beta1, "adam_beta1");
      if (auto b = num(v[1])) differs(*b, args_.adam_beta2, "adam_beta2");
    } else if (p == "scheduler.params.total_num_steps" && args_.num_training_steps) {
      if (auto d = num(v))
        differs(*d,
                TrainerValue{static_cast<double>(*args_.num_training_steps), true,
                             args_.num_training_steps_source},
                "num_training_steps");
    } else if (p == "fp16.enabled" || p == "bf16.enabled") {
      const TrainerValue& hf = p == "fp16.enabled" ? args_.fp16 : args_.bf16;
      if (auto b = lax_bool(v); b && *b != (hf.value != 0))
        mismatches_.push_back(shown(p) + " = " + short_json(v) + " but " + p.substr(0, 4) + " = " +
                              (hf.value != 0 ? "true" : "false") + " (" + shown(hf.source) + ")");
    }
  }

  // A boolean as pydantic reads one (its "lax" mode, which DeepSpeed's config models use): true,
  // false, 0, 1, 0.0, 1.0 and the strings 0/1, true/false, t/f, yes/no, y/n, on/off in any case.
  static std::optional<bool> lax_bool(const json& v) {
    if (v.is_boolean()) return v.get<bool>();
    if (v.is_number()) {
      const double d = v.get<double>();
      if (d == 0) return false;
      if (d == 1) return true;
      return std::nullopt;
    }
    if (v.is_string()) {
      std::string s = v.get<std::string>();
      for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      for (const char* t : {"1", "true", "t", "yes", "y", "on"})
        if (s == t) return true;
      for (const char* f : {"0", "false", "f", "no", "n", "off"})
        if (s == f) return false;
    }
    return std::nullopt;
  }

  static std::string join(const std::string& path, const std::string& key) {
    return path.empty() ? key : path + "." + key;
  }

  [[noreturn]] void type_error(const std::string& path, const std::string& want,
                               const json& v) const {
    throw UsageError(origin_ + ": " + shown(path) + ": expected " + want + ", found " +
                     short_json(v));
  }

  double number(const json& v, const std::string& path) const {
    if (v.is_number()) return v.get<double>();
    if (v.is_string()) {  // DeepSpeed configs sometimes quote numbers ("2e8")
      const std::string s = v.get<std::string>();
      double d = 0;
      auto r = std::from_chars(s.data(), s.data() + s.size(), d);
      if (r.ec == std::errc() && r.ptr == s.data() + s.size()) return d;
    }
    type_error(path, "a number", v);
  }

  int64_t integer(const json& v, const std::string& path) const {
    const double d = number(v, path);
    if (d != std::floor(d) || std::fabs(d) > 9e15) type_error(path, "an integer", v);
    return static_cast<int64_t>(d);
  }

  bool boolean(const json& v, const std::string& path) const {
    if (auto b = lax_bool(v)) return *b;
    type_error(path, "true or false", v);
  }

  std::string string(const json& v, const std::string& path) const {
    if (v.is_string()) return v.get<std::string>();
    type_error(path, "a string", v);
  }

  const json& object(const json& v, const std::string& path) const {
    if (!v.is_object()) type_error(path, "an object", v);
    return v;
  }

  // Keys of `obj` not read: ignored with a reason from `reasons` (key -> reason), else refused
  // when `unknown_refused`, else ignored as unknown.
  // `prefixed` (prefix, reason) ignores every key that starts with the prefix (ZeRO's "stage3_*").
  void rest(const json& obj, const std::string& path,
            const std::map<std::string, std::string>& reasons,
            const std::map<std::string, std::function<void(const json&, const std::string&)>>&
                special = {},
            const std::pair<std::string, std::string>& prefixed = {}) {
    for (auto it = obj.begin(); it != obj.end(); ++it) {
      const std::string p = join(path, it.key());
      if (!read_.insert(p).second) continue;
      if (auto s = special.find(it.key()); s != special.end()) {
        s->second(it.value(), p);
        continue;
      }
      if (auto r = reasons.find(it.key()); r != reasons.end()) {
        ignore(p, r->second);
        continue;
      }
      if (!prefixed.first.empty() && it.key().rfind(prefixed.first, 0) == 0) {
        ignore(p, prefixed.second);
        continue;
      }
      ignore(p, "not a DeepSpeed key ciuic knows (DeepSpeed would ignore or reject it)");
    }
  }

  // A feature that is off unless enabled: refused when enabled.
  std::function<void(const json&, const std::string&)> refuse_if_enabled(const std::string& what) {
    return [this, what](const json& v, const std::string& p) {
      bool on = false;
      if (v.is_boolean() || v.is_string())
        on = lax_bool(v).value_or(false);
      else if (v.is_object())
        on = v.contains("enabled") && lax_bool(v["enabled"]).value_or(false);
      else if (v.is_number())
        on = v.get<double>() > 1;
      if (on)
        refuse(p, what);
      else
        ignore(p, "disabled");
    };
  }

  // ---- sections -----------------------------------------------------------------------------
  void batch(const json& root) {
    // "auto" micro-batch: the training file's per_device_train_batch_size, DeepSpeed's arithmetic
    // when the other two and the world size decide it, else ciuic's planner for the global batch.
    const bool mb_auto =
        is_auto(root, "train_micro_batch_size_per_gpu") && !set_value("train.micro_batch_size");
    if (mb_auto) read_.insert("train_micro_batch_size_per_gpu");
    const json* mb =
        mb_auto ? nullptr
                : take(root, "", "train_micro_batch_size_per_gpu", "train.micro_batch_size");
    const json* gas =
        take(root, "", "gradient_accumulation_steps", "train.gradient_accumulation_steps");
    const json* tbs = nullptr;
    if (is_auto(root, "train_batch_size")) {
      read_.insert(
          "train_batch_size");  // the HF Trainer's product of the other two: nothing to check
      ignore("train_batch_size", "\"auto\": micro-batch x accumulation x world size");
    } else {
      tbs = take(root, "", "train_batch_size", "");
    }
    std::optional<int64_t> m, g, t;
    if (mb)
      m = integer(*mb, "train_micro_batch_size_per_gpu");
    else if (auto v = set_number("train.micro_batch_size"))
      m = static_cast<int64_t>(*v);
    if (gas)
      g = integer(*gas, "gradient_accumulation_steps");
    else if (auto v = set_number("train.gradient_accumulation_steps"))
      g = static_cast<int64_t>(*v);
    if (tbs) t = integer(*tbs, "train_batch_size");
    for (auto [v, name] :
         {std::pair{m, "train_micro_batch_size_per_gpu"},
          std::pair{g, "gradient_accumulation_steps"}, std::pair{t, "train_batch_size"}})
      if (v && *v < 1)
        throw UsageError(origin_ + ": " + name + " = " + std::to_string(*v) + ": expected >= 1");
    std::optional<int64_t> world;
    const auto nproc = set_number("cluster.nproc_per_node"), nnodes = set_number("cluster.nnodes");
    if (nproc || nnodes) world = static_cast<int64_t>(nproc.value_or(1) * nnodes.value_or(1));
    std::string world_text = world ? std::to_string(*world) : "";
    bool mb_filled = false;
    if (mb_auto) {
      const TrainerValue& pd = args_.per_device_train_batch_size;
      if (pd.given) {
        m = static_cast<int64_t>(pd.value);
        mb_filled = true;
        auto_["train_micro_batch_size_per_gpu"] =
            "\"auto\" -> " + std::to_string(*m) + ": " + pd.source;
      } else if (t && g && world) {
        if (*t % (*g * *world) != 0)
          throw UsageError(origin_ + ": train_batch_size = " + std::to_string(*t) +
                           " is not divisible by "
                           "gradient_accumulation_steps x world size = " +
                           std::to_string(*g) + " x " + world_text);
        m = *t / (*g * *world);
        mb_filled = true;
        auto_["train_micro_batch_size_per_gpu"] = "\"auto\" -> " + std::to_string(*m) +
                                                  ": train_batch_size / (accumulation x world " +
                                                  world_text + ")";
        t.reset();  // used
      } else {
        // ciuic's planner: the largest micro-batch whose memory plan fits, for this global batch.
        const int64_t w = world.value_or(1), acc = g.value_or(1);
        const int64_t global = t ? *t : static_cast<int64_t>(pd.value) * acc * w;
        put("train", "micro_batch_size", "\"auto\"",
            "\"auto\" -> \"auto\": ciuic's planner picks the largest micro-batch that fits, for "
            "global_batch_size "
            "(the HF Trainer would take per_device_train_batch_size, default 8)");
        put("train", "global_batch_size", std::to_string(global),
            t ? std::string("train_batch_size")
              : pd.source + " " + std::to_string(static_cast<int64_t>(pd.value)) +
                    " x accumulation " + std::to_string(acc) + " x world size " +
                    std::to_string(w) +
                    (world ? "" : " (the recipe's [cluster] default: no --nproc given)"));
        if (gas || set_value("train.gradient_accumulation_steps"))
          note(
              "train_micro_batch_size_per_gpu = \"auto\" -> the planner: "
              "gradient_accumulation_steps = " +
              std::to_string(acc) +
              " is not written, the planner derives it from global_batch_size / (micro-batch x "
              "ranks)");
        return;
      }
    }
    // Without --nproc/--nnodes the world size is the recipe's [cluster] default, 1; said in a note.
    auto need_world = [&](const std::string& what) {
      world = 1;
      world_text = "1";
      note("train_batch_size = " + std::to_string(*t) +
           " with world size 1, the recipe's [cluster] default (no --nproc or "
           "--nnodes given): " +
           what +
           " is derived for one process; give --nproc N (and --nnodes N) to derive it for N");
    };
    // DeepSpeed: train_batch_size = micro x accumulation x world; any two give the third.
    if (t) {
      if (m && g) {
        if (world) {
          if (*m * *g * *world != *t)
            throw UsageError(origin_ + ": train_batch_size = " + std::to_string(*t) +
                             " but train_micro_batch_size_per_gpu x "
                             "gradient_accumulation_steps x world size = " +
                             std::to_string(*m) + " x " + std::to_string(*g) + " x " + world_text +
                             " = " + std::to_string(*m * *g * *world));
        } else {
          if (*t % (*m * *g) != 0)
            throw UsageError(origin_ + ": train_batch_size = " + std::to_string(*t) +
                             " is not a multiple of "
                             "train_micro_batch_size_per_gpu x gradient_accumulation_steps = " +
                             std::to_string(*m * *g));
          world = *t / (*m * *g);
          put("cluster", "nproc_per_node", std::to_string(*world),
              "train_batch_size / (micro x accumulation); set nnodes if these ranks span nodes");
        }
      } else if (m) {
        if (!world) need_world("gradient_accumulation_steps");
        if (*t % (*m * *world) != 0)
          throw UsageError(origin_ + ": train_batch_size = " + std::to_string(*t) +
                           " is not divisible by "
                           "train_micro_batch_size_per_gpu x world size = " +
                           std::to_string(*m) + " x " + world_text);
        g = *t / (*m * *world);
        put("train", "gradient_accumulation_steps", std::to_string(*g),
            "train_batch_size / (micro x world " + world_text + ")");
      } else if (g) {
        if (!world) need_world("train_micro_batch_size_per_gpu");
        if (*t % (*g * *world) != 0)
          throw UsageError(origin_ + ": train_batch_size = " + std::to_string(*t) +
                           " is not divisible by "
                           "gradient_accumulation_steps x world size = " +
                           std::to_string(*g) + " x " + world_text);
        m = *t / (*g * *world);
        put("train", "micro_batch_size", std::to_string(*m),
            "train_batch_size / (accumulation x world " + world_text + ")");
      } else {
        if (!world) need_world("train_micro_batch_size_per_gpu");
        if (*t % *world != 0)
          throw UsageError(origin_ + ": train_batch_size = " + std::to_string(*t) +
                           " is not divisible by the world size " + world_text);
        m = *t / *world;
        g = 1;
        put("train", "micro_batch_size", std::to_string(*m),
            "train_batch_size / world " + world_text + " (DeepSpeed)");
        put("train", "gradient_accumulation_steps", "1",
            "DeepSpeed's default when only train_batch_size is given");
      }
    }
    if (mb || mb_filled)
      put("train", "micro_batch_size", std::to_string(*m), "train_micro_batch_size_per_gpu");
    if (gas)
      put("train", "gradient_accumulation_steps", std::to_string(*g),
          "gradient_accumulation_steps");
    if (!m && !t && !set_value("train.micro_batch_size")) {
      put("train", "micro_batch_size", "1", "placeholder: the config gives no batch size");
      placeholders_.push_back("train.micro_batch_size");
    }
    if (m && !g && !t && !set_value("train.gradient_accumulation_steps"))
      put("train", "gradient_accumulation_steps", "1", "DeepSpeed's default");
  }

  void clipping(const json& root) {
    if (const json* v = take(root, "", "gradient_clipping", "train.gradient_clipping")) {
      put("train", "gradient_clipping", float_lit(number(*v, "gradient_clipping")),
          "gradient_clipping");
    } else if (!set_value("train.gradient_clipping")) {
      put("train", "gradient_clipping", "0.0",
          "DeepSpeed's default: no clipping (ciuic's own default is 1.0)");
    }
  }

  bool enabled(const json& obj, const std::string& path, const std::string& recipe_key = "") {
    const json* e = take(obj, path, "enabled", recipe_key);
    return e && boolean(*e, path + ".enabled");
  }

  void precision(const json& root) {
    read_.insert("fp16");
    read_.insert("bf16");
    read_.insert("bfloat16");
    const json* fp16 = root.contains("fp16") ? &object(root["fp16"], "fp16") : nullptr;
    const json* bf16 = root.contains("bf16")       ? &object(root["bf16"], "bf16")
                       : root.contains("bfloat16") ? &object(root["bfloat16"], "bfloat16")
                                                   : nullptr;
    const std::string bf_path = root.contains("bf16") ? "bf16" : "bfloat16";
    // "enabled": "auto" is the training arguments' fp16 / bf16 when a training file gives them;
    // with TrainingArguments' defaults (both False: fp32) ciuic chooses bf16.
    const bool given = set_value("precision.plugin") != nullptr;
    const bool fp16_auto = fp16 && !given && is_auto(*fp16, "enabled");
    const bool bf16_auto = bf16 && !given && is_auto(*bf16, "enabled");
    if (fp16_auto) read_.insert("fp16.enabled");
    if (bf16_auto) read_.insert(bf_path + ".enabled");
    bool fp16_on = fp16 && !fp16_auto && enabled(*fp16, "fp16", "precision.plugin");
    bool bf16_on = bf16 && !bf16_auto && enabled(*bf16, bf_path, "precision.plugin");
    std::string auto_why;
    if (fp16_auto || bf16_auto) {
      if (args_.fp16.given || args_.bf16.given) {
        if (fp16_auto) fp16_on = args_.fp16.value != 0;
        if (bf16_auto) bf16_on = args_.bf16.value != 0;
        const TrainerValue& src = fp16_on ? args_.fp16 : args_.bf16;
        auto_why = std::string("\"auto\" -> ") +
                   (fp16_on   ? "fp16"
                    : bf16_on ? "bf16"
                              : "fp32") +
                   ": " + src.source;
      } else if (!fp16_on && !bf16_on) {
        bf16_on = true;
        auto_why =
            "\"auto\" -> bf16: ciuic's choice (the HF TrainingArguments defaults fp16 = bf16 = "
            "False would train in "
            "fp32); on a GPU without bf16 (V100, T4) --set precision.plugin=fp16";
      } else {
        auto_why = std::string("\"auto\" -> ") +
                   (fp16_on ? "bf16 off: fp16.enabled" : "fp16 off: " + bf_path + ".enabled") +
                   " is true (HF TrainingArguments defaults fp16 = bf16 = False)";
      }
    }
    if (fp16_on && bf16_on)
      throw UsageError(origin_ + ": fp16 and bf16 are both enabled (DeepSpeed refuses this too)");
    std::string plugin = fp16_on ? "fp16" : bf16_on ? "bf16" : "fp32";
    if (auto s = set_string("precision.plugin")) plugin = *s;
    put("precision", "plugin", toml_quote(plugin),
        !auto_why.empty() ? auto_why
        : fp16_on         ? std::string("fp16.enabled")
        : bf16_on         ? bf_path + ".enabled"
                          : std::string("neither fp16 nor bf16 enabled"));
    if (fp16) {
      const std::map<std::string, std::string> ignored_fp16 = {
          {"auto_cast", "ciuic computes the whole model in the precision's dtype (no autocast)"},
          {"fp16_master_weights_and_grads", "ciuic keeps fp32 master weights"},
      };
      if (plugin == "fp16") {
        struct K {
          const char* ds;
          const char* key;
          bool is_int;
          const char* dflt;
        };
        for (const K& k : {K{"loss_scale", "loss_scale", false, "0.0"},
                           K{"initial_scale_power", "initial_scale_power", true, "16"},
                           K{"loss_scale_window", "loss_scale_window", true, "1000"},
                           K{"hysteresis", "hysteresis", true, "2"},
                           K{"consecutive_hysteresis", "consecutive_hysteresis", false, "false"},
                           K{"min_loss_scale", "min_loss_scale", false, "1.0"}}) {
          const std::string p = std::string("fp16.") + k.ds;
          if (const json* v = take(*fp16, "fp16", k.ds, std::string("precision.") + k.key)) {
            std::string lit = std::string(k.key) == "consecutive_hysteresis"
                                  ? (boolean(*v, p) ? "true" : "false")
                              : k.is_int ? std::to_string(integer(*v, p))
                                         : float_lit(number(*v, p));
            put("precision", k.key, lit, p);
          } else if (!set_value(std::string("precision.") + k.key)) {
            put("precision", k.key, k.dflt, "DeepSpeed's default");
          }
        }
        if (const json* v = take(*fp16, "fp16", "fp16_master_weights_and_grads", "");
            v && boolean(*v, "fp16.fp16_master_weights_and_grads"))
          refuse("fp16.fp16_master_weights_and_grads",
                 "ciuic keeps fp32 master weights and gradients");
        rest(*fp16, "fp16", ignored_fp16);
      } else {
        for (auto it = fp16->begin(); it != fp16->end(); ++it)
          if (!read_.count("fp16." + it.key())) ignore("fp16." + it.key(), "fp16 is not enabled");
      }
    }
    if (bf16 && !bf16_on) {
      for (auto it = bf16->begin(); it != bf16->end(); ++it)
        if (!read_.count(bf_path + "." + it.key()))
          ignore(bf_path + "." + it.key(), "bf16 is not enabled");
    } else if (bf16) {
      rest(*bf16, bf_path,
           {{"immediate_grad_update", "ciuic applies gradients at the step"},
            {"check_grad_overflow", "bf16 needs no overflow check"},
            {"bf16_master_weights_and_grads", "ciuic keeps fp32 master weights"},
            {"bf16_optimizer_states", "ciuic keeps fp32 optimizer state"}});
    }
    // Gradient reduction dtype.
    if (const json* v = take(root, "", "communication_data_type", "precision.reduce_dtype")) {
      std::string d = string(*v, "communication_data_type");
      if (d == "fp32" || d == "float32" || d == "float")
        d = "fp32";
      else if (d == "fp16" || d == "float16" || d == "half")
        d = "fp16";
      else if (d == "bf16" || d == "bfloat16")
        d = "bf16";
      else
        throw UsageError(origin_ + ": communication_data_type = " + short_json(*v) +
                         ": expected fp32, fp16 or bf16");
      if (plugin == "fp32") {
        if (d != "fp32")
          ignore("communication_data_type", "with fp32 training ciuic reduces gradients in fp32");
      } else if (d != "fp32" && d != plugin) {
        refuse("communication_data_type",
               "\"" + d + "\" with " + plugin +
                   " training (ciuic reduces in fp32 or the training dtype)");
      } else {
        put("precision", "reduce_dtype", toml_quote(d), "communication_data_type");
      }
    } else if (plugin != "fp32" && !set_value("precision.reduce_dtype")) {
      put("precision", "reduce_dtype", "\"fp32\"",
          "ciuic's default: exact fp32 sums; DeepSpeed reduces in " + plugin +
              " when communication_data_type is unset (\"" + plugin + "\" halves the traffic)");
    }
  }

  void zero(const json& root) {
    read_.insert("zero_optimization");
    int64_t stage = 0;
    const json* z = nullptr;
    if (root.contains("zero_optimization")) {
      if (root["zero_optimization"].is_boolean()) {  // legacy "zero_optimization": true = stage 1
        stage = root["zero_optimization"].get<bool>() ? 1 : 0;
      } else {
        z = &object(root["zero_optimization"], "zero_optimization");
        if (const json* s = take(*z, "zero_optimization", "stage", "sharding.plugin"))
          stage = integer(*s, "zero_optimization.stage");
      }
    }
    const std::string P = "zero_optimization";
    std::string plugin;
    if (stage == 0) {
      plugin = "ddp";
    } else if (stage == 1 || stage == 2) {
      plugin = "zero2";
      if (stage == 1)
        note(
            "zero_optimization.stage = 1 -> sharding \"zero2\": ciuic shards gradients as well as "
            "optimizer state "
            "(ZeRO-2); the updates are the same, memory is lower, reductions are reduce-scatters");
    } else if (stage == 3) {
      plugin = "zero3";
    } else {
      throw UsageError(origin_ + ": zero_optimization.stage = " + std::to_string(stage) +
                       ": expected 0, 1, 2 or 3");
    }
    put("sharding", "plugin", toml_quote(plugin),
        z ? "zero_optimization.stage = " + std::to_string(stage)
          : "no zero_optimization: plain data parallelism");
    std::optional<double> reduce_bucket;
    if (stage == 3) {
      stage3(z);
    } else if (z) {
      if (const json* v = take(*z, P, "reduce_bucket_size", "sharding.reduce_bucket_size")) {
        reduce_bucket = number(*v, P + ".reduce_bucket_size");
        put("sharding", "reduce_bucket_size", float_lit(*reduce_bucket),
            "zero_optimization.reduce_bucket_size (elements)");
      }
      if (const json* v = take(*z, P, "overlap_comm", "sharding.overlap_comm"))
        put("sharding", "overlap_comm", boolean(*v, P + ".overlap_comm") ? "true" : "false",
            "zero_optimization.overlap_comm");
    }
    if (stage != 3 && !reduce_bucket && !set_value("sharding.reduce_bucket_size"))
      put("sharding", "reduce_bucket_size", "5e8", "DeepSpeed's default (elements)");
    bool have_overlap = false;
    for (const auto& e : sec("sharding").entries)
      have_overlap = have_overlap || e.key == "overlap_comm";
    if (stage != 3 && !have_overlap && !set_value("sharding.overlap_comm"))
      put("sharding", "overlap_comm", "true",
          "ciuic overlaps by default (DeepSpeed's default is false below stage 3; the results are "
          "the same)");
    // Optimizer offload.
    offload_ = "none";
    if (z) {
      if (z->contains("offload_optimizer")) {
        read_.insert(P + ".offload_optimizer");
        const json& o = object((*z)["offload_optimizer"], P + ".offload_optimizer");
        const std::string OP = P + ".offload_optimizer";
        if (const json* d = take(o, OP, "device", "optimizer.plugin"))
          offload_ = string(*d, OP + ".device");
        if (offload_ == "nvme")
          refuse(OP + ".device = \"nvme\"",
                 "NVMe offload is not implemented (use \"cpu\": optimizer state in host memory)");
        else if (offload_ != "cpu" && offload_ != "none")
          throw UsageError(origin_ + ": " + OP + ".device = " + short_json(o["device"]) +
                           ": expected \"cpu\", \"nvme\" or \"none\"");
        if (offload_ == "cpu") {
          if (const json* v = take(o, OP, "pin_memory", "optimizer.pin_memory"))
            pin_memory_ = boolean(*v, OP + ".pin_memory");
          if (const json* v = take(o, OP, "ratio", "")) {
            const double r = number(*v, OP + ".ratio");
            if (r < 1)
              refuse(OP + ".ratio", "partial offload (ratio " + float_lit(r) +
                                        ") is not implemented; ciuic offloads all optimizer state");
          }
        }
        rest(o, OP,
             {{"nvme_path", "NVMe only"},
              {"buffer_count", "NVMe only"},
              {"fast_init", "NVMe only"},
              {"pipeline", "NVMe only"},
              {"pipeline_read", "NVMe only"},
              {"pipeline_write", "NVMe only"},
              {"pin_memory", "no offload"},
              {"ratio", "no offload"}});
      }
      if (const json* v = take(*z, P, "cpu_offload", "optimizer.plugin");
          v && boolean(*v, P + ".cpu_offload")) {
        offload_ = "cpu";
        note("zero_optimization.cpu_offload (legacy) = true -> [optimizer] plugin = \"cpu_adam\"");
      }
      if (stage != 3 && z->contains("offload_param")) {
        read_.insert(P + ".offload_param");
        const json& o = (*z)["offload_param"];
        if (o.is_object() && o.value("device", "none") != "none")
          refuse(P + ".offload_param",
                 "parameter offload is a ZeRO-3 feature: set stage 3 (ciuic's zero3) to use it");
        else
          ignore(P + ".offload_param", "device none");
      }
      const std::string allgather_reason =
          "ciuic all-gathers each reduce bucket in one call: its size is reduce_bucket_size" +
          (reduce_bucket ? std::string(" (") + float_lit(*reduce_bucket) + ")" : std::string());
      std::map<std::string, std::string> reasons = {
          {"allgather_bucket_size", allgather_reason},
          {"allgather_partitions",
           "ciuic always all-gathers the updated shards (no broadcast variant)"},
          {"reduce_scatter",
           "ciuic's zero2 always reduce-scatters into the shard owners (same result as "
           "all-reduce)"},
          {"contiguous_gradients", "ciuic always packs gradients into contiguous flat buckets"},
          {"round_robin_gradients", "ciuic's shards own a chunk of every bucket, already balanced"},
          {"elastic_checkpoint", "ciuic checkpoints load at any world size"},
          {"load_from_fp32_weights", "ciuic resumes from its fp32 master weights"},
          {"ignore_unused_parameters", "every parameter of ciuic's models gets a gradient"},
          {"legacy_stage1", "no legacy mode"},
          {"sub_group_size", "ZeRO-3 only"},
          {"use_multi_rank_bucket_allreduce", "no such option: one collective per bucket"},
          {"memory_efficient_linear", "ZeRO-3 only"},
          {"gather_16bit_weights_on_model_save",
           "ciuic exports from fp32 master weights (--export-hf)"},
          {"log_trace_cache_warnings", "ZeRO-3 only"},
      };
      std::map<std::string, std::function<void(const json&, const std::string&)>> special;
      special["zero_quantized_weights"] =
          refuse_if_enabled("ZeRO++ quantized weights are not implemented");
      special["zero_quantized_gradients"] =
          refuse_if_enabled("ZeRO++ quantized gradients are not implemented");
      special["zero_quantized_nontrainable_weights"] =
          refuse_if_enabled("ZeRO++ quantized weights are not implemented");
      special["zero_hpz_partition_size"] =
          refuse_if_enabled("ZeRO++ hierarchical partitioning is not implemented");
      special["mics_shard_size"] = [this](const json& v, const std::string& p) {
        if (v.is_number() && v.get<double>() > 0)
          refuse(p, "MiCS is not implemented");
        else
          ignore(p, "disabled");
      };
      special["mics_hierarchical_params_gather"] = refuse_if_enabled("MiCS is not implemented");
      rest(*z, P, reasons, special,
           {"stage3_", stage == 3 ? "a DeepSpeed ZeRO-3 tuning knob zero3 has no counterpart for"
                                  : "ZeRO-3 only"});
    }
  }

  // ZeRO stage 3 -> [sharding] plugin = "zero3": its stage3_* keys, offload_param and the keys
  // whose meaning changes with parameter partitioning. What stage 2 shares (offload_optimizer, the
  // ZeRO++/MiCS refusals, the other keys' reasons) is read after this by zero().
  void stage3(const json* z) {
    const std::string P = "zero_optimization";
    if (!z) return;
    auto elements = [&](const char* key, const char* option, const std::string& what) {
      if (const json* v = take(*z, P, key, std::string("sharding.") + option)) {
        const double n = number(*v, P + "." + key);
        if (n < 0 || n != std::floor(n))
          type_error(P + "." + key, "a whole number of elements >= 0", *v);
        put("sharding", option, float_lit(n), P + "." + key + " (" + what + ")");
      }
    };
    elements("stage3_max_live_parameters", "max_live_parameters",
             "gathered elements a prefetch may reach");
    elements("stage3_prefetch_bucket_size", "prefetch_bucket_size", "elements gathered ahead");
    elements("stage3_param_persistence_threshold", "param_persistence_threshold",
             "smaller parameters stay gathered");
    if (z->contains("offload_param")) {
      read_.insert(P + ".offload_param");
      const json& o = object((*z)["offload_param"], P + ".offload_param");
      const std::string OP = P + ".offload_param";
      std::string device = "none";
      if (const json* d = take(o, OP, "device", "sharding.offload_params"))
        device = string(*d, OP + ".device");
      if (device == "nvme")
        refuse(OP + ".device = \"nvme\"",
               "NVMe parameter offload is not implemented (use \"cpu\": the parameter "
               "shard in host memory)");
      else if (device != "cpu" && device != "none")
        throw UsageError(origin_ + ": " + OP + ".device = " + short_json(o["device"]) +
                         ": expected \"cpu\", \"nvme\" or \"none\"");
      put("sharding", "offload_params", device == "cpu" ? "true" : "false",
          OP + ".device = \"" + device + "\"" +
              (device == "cpu" ? ": the parameter shard in host memory" : ""));
      rest(o, OP,
           {{"pin_memory", "zero3 pins its host shard on GPUs"},
            {"nvme_path", "NVMe only"},
            {"buffer_count", "NVMe only"},
            {"buffer_size", "NVMe only"},
            {"max_in_cpu", "NVMe only"}});
    }
    const std::map<std::string, std::string> stage3_reasons = {
        {"reduce_bucket_size",
         "zero3 reduce-scatters each layer's gradient in one call as its backward ends"},
        {"overlap_comm",
         "zero3 always overlaps: reductions and prefetched gathers run beside the compute"},
        {"allgather_bucket_size", "zero3 all-gathers each layer group in one call"},
        {"sub_group_size",
         "the optimizer updates the whole shard in one pass (cpu_adam's threads split it); no "
         "sub-groups"},
        {"stage3_gather_16bit_weights_on_model_save",
         "ciuic exports from the fp32 master weights (--export-hf, [checkpoint] export_hf), one "
         "slice at a time"},
        {"gather_16bit_weights_on_model_save",
         "ciuic exports from the fp32 master weights (--export-hf, [checkpoint] export_hf), one "
         "slice at a time"},
        {"stage3_max_reuse_distance",
         "zero3 frees a layer after each pass unless the next group computes with it"},
        {"memory_efficient_linear", "ciuic's linear layers keep no extra copy of the weight"},
    };
    for (const auto& [key, reason] : stage3_reasons)
      if (z->contains(key) && read_.insert(join(P, key)).second) ignore(join(P, key), reason);
  }

  void optimizer(const json& root) {
    read_.insert("optimizer");
    std::string plugin = offload_ == "cpu" ? "cpu_adam" : "adamw";
    if (auto s = set_string("optimizer.plugin")) plugin = *s;
    put("optimizer", "plugin", toml_quote(plugin),
        offload_ == "cpu"
            ? "zero_optimization.offload_optimizer.device = \"cpu\": AdamW in host memory"
            : "AdamW on the device (no optimizer offload)");
    if (plugin == "cpu_adam" && pin_memory_)
      put("optimizer", "pin_memory", *pin_memory_ ? "true" : "false",
          "offload_optimizer.pin_memory");
    if (!root.contains("optimizer")) {
      note(
          "no optimizer section: DeepSpeed then uses the client's optimizer; ciuic uses AdamW with "
          "the values below");
      if (!set_value("optimizer.lr")) {
        put("optimizer", "lr", "1e-4", "placeholder: the config gives no learning rate");
        placeholders_.push_back("optimizer.lr");
      }
      return;
    }
    const std::string P = "optimizer";
    const json& o = object(root["optimizer"], P);
    std::string type = "AdamW";
    if (const json* t = take(o, P, "type", "")) type = string(*t, "optimizer.type");
    std::string lower;
    for (char c : type) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    const json* params = nullptr;
    if (o.contains("params")) {
      read_.insert("optimizer.params");
      params = &object(o["params"], "optimizer.params");
    }
    const std::string PP = "optimizer.params";
    bool adam_w_mode = true;
    if (params)
      if (const json* v = take(*params, PP, "adam_w_mode", ""))
        adam_w_mode = boolean(*v, PP + ".adam_w_mode");
    if (lower != "adam" && lower != "adamw") {
      refuse("optimizer.type = \"" + type + "\"",
             "ciuic implements AdamW (types Adam and AdamW); "
             "1-bit Adam/LAMB, LAMB, Lion, SGD, Adagrad and others are not available");
    }
    if (params) {
      if (const json* v = take(*params, PP, "lr", "optimizer.lr"))
        put("optimizer", "lr", float_lit(number(*v, PP + ".lr")), "optimizer.params.lr");
      if (const json* v = take(*params, PP, "betas", "optimizer.betas")) {
        if (!v->is_array() || v->size() != 2)
          type_error(PP + ".betas", "a list of two numbers", *v);
        put("optimizer", "betas",
            "[" + float_lit(number((*v)[0], PP + ".betas[0]")) + ", " +
                float_lit(number((*v)[1], PP + ".betas[1]")) + "]",
            "optimizer.params.betas");
      } else if (!set_value("optimizer.betas")) {
        put("optimizer", "betas", "[0.9, 0.999]", "DeepSpeed's default");
      }
      if (const json* v = take(*params, PP, "eps", "optimizer.eps"))
        put("optimizer", "eps", float_lit(number(*v, PP + ".eps")), "optimizer.params.eps");
      else if (!set_value("optimizer.eps"))
        put("optimizer", "eps", "1e-8", "DeepSpeed's default");
      double wd = 0;
      if (const json* v = take(*params, PP, "weight_decay", "optimizer.weight_decay")) {
        wd = number(*v, PP + ".weight_decay");
        put("optimizer", "weight_decay", float_lit(wd),
            "optimizer.params.weight_decay; ciuic decays matrices only, as the HF Trainer's groups "
            "do");
      } else if (!set_value("optimizer.weight_decay")) {
        put("optimizer", "weight_decay", "0.0", "DeepSpeed's default");
      }
      if (lower == "adam" && !adam_w_mode && wd != 0)
        refuse("optimizer.params.adam_w_mode = false",
               "Adam with L2 weight decay is not implemented (ciuic's decay is decoupled, AdamW)");
      if (const json* v = take(*params, PP, "amsgrad", ""); v && boolean(*v, PP + ".amsgrad"))
        refuse("optimizer.params.amsgrad", "AMSGrad is not implemented");
      if (const json* v = take(*params, PP, "bias_correction", "");
          v && !boolean(*v, PP + ".bias_correction"))
        refuse("optimizer.params.bias_correction = false",
               "ciuic's AdamW always corrects the moments' bias");
      rest(*params, PP,
           {{"torch_adam", "an implementation choice; ciuic has its own kernels"},
            {"fused", "an implementation choice"},
            {"foreach", "an implementation choice"},
            {"capturable", "an implementation choice"},
            {"set_grad_none", "no meaning"},
            {"adam_w_mode", "AdamW either way"},
            {"amsgrad", "off"},
            {"bias_correction", "on, as ciuic"}});
    } else if (!set_value("optimizer.lr")) {
      put("optimizer", "lr", "1e-3", "DeepSpeed's Adam default");
    }
    rest(o, P, {});
    if (lower == "adam")
      note("optimizer.type = \"Adam\" with adam_w_mode (DeepSpeed's default) is AdamW");
  }

  void scheduler(const json& root) {
    read_.insert("scheduler");
    if (!root.contains("scheduler")) {
      put("scheduler", "type", "\"constant\"", "no scheduler: the optimizer's lr throughout");
      return;
    }
    const std::string P = "scheduler";
    const json& s = object(root["scheduler"], P);
    const json* t = take(s, P, "type", "scheduler.type");
    const std::string type = t ? string(*t, "scheduler.type") : "";
    const json empty = json::object();
    const json* params = &empty;
    if (s.contains("params")) {
      read_.insert("scheduler.params");
      params = &object(s["params"], "scheduler.params");
    }
    const std::string PP = "scheduler.params";
    auto num_key = [&](const char* ds, const char* key, const char* dflt, bool is_int) {
      if (const json* v = take(*params, PP, ds, std::string("scheduler.") + key)) {
        const std::string p = PP + "." + ds;
        put("scheduler", key, is_int ? std::to_string(integer(*v, p)) : float_lit(number(*v, p)),
            p);
        return true;
      }
      if (!set_value(std::string("scheduler.") + key) && dflt)
        put("scheduler", key, dflt, "DeepSpeed's default");
      return false;
    };
    auto warmup_type = [&] {
      if (const json* v = take(*params, PP, "warmup_type", "scheduler.warmup_type")) {
        const std::string w = string(*v, PP + ".warmup_type");
        if (w != "log" && w != "linear")
          throw UsageError(origin_ + ": " + PP + ".warmup_type = " + short_json(*v) +
                           ": expected \"log\" or \"linear\"");
        put("scheduler", "warmup_type", toml_quote(w), PP + ".warmup_type");
      } else if (!set_value("scheduler.warmup_type")) {
        put("scheduler", "warmup_type", "\"log\"", "DeepSpeed's default");
      }
    };
    auto total_steps = [&] {
      if (const json* v = take(*params, PP, "total_num_steps", "scheduler.total_num_steps")) {
        const int64_t n = integer(*v, PP + ".total_num_steps");
        put("scheduler", "total_num_steps", std::to_string(n), PP + ".total_num_steps");
        if (n > 0) total_steps_ = n;  // 0: "auto" without a known length, = [train] max_steps
      } else if (set_value("scheduler.total_num_steps")) {
        if (auto n = set_number("scheduler.total_num_steps"))
          total_steps_ = static_cast<int64_t>(*n);
      } else if (!missing_auto_.empty() &&
                 missing_auto_.back().rfind(PP + ".total_num_steps", 0) == 0) {
        // reported as "auto"
      } else {
        throw UsageError(origin_ + ": " + type + " needs scheduler.params.total_num_steps");
      }
    };
    if (type == "WarmupLR" || type == "WarmupDecayLR") {
      put("scheduler", "type", type == "WarmupLR" ? "\"warmup\"" : "\"warmup_decay\"",
          "scheduler.type = \"" + type + "\"");
      num_key("warmup_min_lr", "warmup_min_lr", "0.0", false);
      num_key("warmup_max_lr", "warmup_max_lr", "0.001", false);
      num_key("warmup_num_steps", "warmup_num_steps", "1000", true);
      warmup_type();
      if (type == "WarmupDecayLR") total_steps();
    } else if (type == "WarmupCosineLR") {
      put("scheduler", "type", "\"warmup_cosine\"",
          "scheduler.type = \"WarmupCosineLR\" (ratios of [optimizer] lr)");
      num_key("warmup_min_ratio", "warmup_min_ratio", "0.0", false);
      num_key("warmup_num_steps", "warmup_num_steps", "1000", true);
      num_key("cos_min_ratio", "cos_min_ratio", "1e-4", false);
      warmup_type();
      total_steps();
    } else if (type == "OneCycle" || type == "LRRangeTest") {
      refuse("scheduler.type = \"" + type + "\"",
             "not implemented; ciuic has WarmupLR, WarmupDecayLR and WarmupCosineLR (or no "
             "scheduler)");
      return;
    } else if (t) {
      throw UsageError(origin_ + ": scheduler.type = " + short_json(*t) +
                       ": expected WarmupLR, WarmupDecayLR, WarmupCosineLR (OneCycle and "
                       "LRRangeTest are not supported)");
    } else {
      return;  // "auto" type, reported
    }
    if (type != "WarmupCosineLR") {
      // The optimizer's lr is not what WarmupLR/WarmupDecayLR reach: say so when they differ.
      for (const auto& e : sec("optimizer").entries)
        for (const auto& f : sec("scheduler").entries)
          if (e.key == "lr" && f.key == "warmup_max_lr" && e.value != f.value)
            note("DeepSpeed's " + type + " sets the learning rate itself: warmup_max_lr (" +
                 f.value + ") is the peak, not optimizer.params.lr (" + e.value +
                 "); ciuic does the same");
    }
    rest(*params, PP,
         {{"last_batch_iteration",
           "ciuic's schedule is a function of the step counter (resume restores it)"}});
    rest(s, P, {});
  }

  void monitoring(const json& root) {
    if (root.contains("tensorboard")) {
      read_.insert("tensorboard");
      const json& t = root["tensorboard"];
      if (t.is_object() && t.contains("enabled") && lax_bool(t["enabled"]).value_or(false)) {
        put("log", "tensorboard", "true", "tensorboard.enabled (event files in <output_dir>/tb)");
        for (auto it = t.begin(); it != t.end(); ++it)
          if (it.key() != "enabled")
            ignore("tensorboard." + it.key(), "ciuic writes <run.output_dir>/tb");
        read_.insert("tensorboard.enabled");
      } else {
        ignore("tensorboard", "disabled");
      }
    }
    if (const json* v = take(root, "", "steps_per_print", "log.every_steps"))
      put("log", "every_steps", std::to_string(integer(*v, "steps_per_print")), "steps_per_print");
  }

  void top_level_rest(const json& root) {
    std::map<std::string, std::string> reasons = {
        {"wall_clock_breakdown", "ciuic always times the phases of a step (metrics.jsonl)"},
        {"memory_breakdown",
         "ciuic logs peak memory in metrics.jsonl; `ciuic-run --plan` predicts it"},
        {"dump_state", "no meaning"},
        {"prescale_gradients", "ciuic normalises the loss exactly by the global token count"},
        {"gradient_predivide_factor",
         "ciuic normalises the loss exactly by the global token count"},
        {"sparse_gradients", "ciuic's embeddings have dense gradients"},
        {"zero_allow_untested_optimizer", "ciuic's optimizers are its own"},
        {"zero_force_ds_cpu_optimizer", "ciuic's optimizers are its own"},
        {"flops_profiler", "ciuic logs MFU in metrics.jsonl"},
        {"wandb", "not supported: use [log] tensorboard or metrics.jsonl"},
        {"csv_monitor", "metrics.jsonl holds every metric"},
        {"comms_logger",
         "the comm plugin reports comm_calls/comm_bytes/comm_busy_s in metrics.jsonl"},
        {"checkpoint", "ciuic's checkpoints are always universal; see [checkpoint]"},
        {"aio", "NVMe only"},
        {"activation_checkpointing",
         "configures DeepSpeed's checkpointing API that model code calls; set [model] "
         "activation_checkpointing = true to recompute layer activations"},
        {"gradient_accumulation_dtype", "ciuic accumulates gradients in fp32"},
        {"data_types", "ciuic accumulates gradients in fp32"},
        {"seq_parallel_communication_data_type", "no sequence parallelism"},
        {"communication_data_type_scaler", "no meaning"},
        {"train_batch_size", "derived"},
        {"timers", "ciuic always times the phases of a step"},
        {"dataloader_drop_last", "ciuic's data plugins never yield partial batches"},
        {"disable_allgather", "no meaning"},
        {"use_data_before_expert_parallel_", "no meaning"},
        {"graph_harvesting", "no meaning"},
        {"zero_optimization", "read"},
        {"compile", "ciuic's model is native C++"},
    };
    std::map<std::string, std::function<void(const json&, const std::string&)>> special = {
        {"amp", refuse_if_enabled("Apex AMP is not supported (use fp16 or bf16)")},
        {"elasticity",
         refuse_if_enabled(
             "DeepSpeed elasticity is not supported (ciuic resumes at any world size)")},
        {"pipeline",
         [this](const json& v, const std::string& p) {
           if (v.is_object() && v.contains("stages") && number(v["stages"], p + ".stages") > 1)
             refuse(p, "pipeline parallelism is not implemented");
           else
             ignore(p, "no pipeline stages");
         }},
        {"tensor_parallel",
         [this](const json& v, const std::string& p) {
           double n = 1;
           if (v.is_object())
             for (const char* k : {"tp_size", "autotp_size"})
               if (v.contains(k) && !v[k].is_null()) n = number(v[k], p + "." + k);
           if (n > 1)
             refuse(p, "tensor parallelism is not implemented");
           else
             ignore(p, "no tensor parallelism");
         }},
        {"sequence_parallel_size",
         [this](const json& v, const std::string& p) {
           if ((v.is_number() || v.is_string()) && number(v, p) > 1)
             refuse(p, "sequence parallelism is not implemented");
           else
             ignore(p, "1");
         }},
        {"hybrid_engine", refuse_if_enabled("the hybrid (RLHF) engine is not supported")},
        {"compression_training", refuse_if_enabled("compression training is not supported")},
        {"data_efficiency",
         refuse_if_enabled("data efficiency (curriculum, random-LTD) is not supported")},
        {"curriculum_learning", refuse_if_enabled("curriculum learning is not supported")},
        {"progressive_layer_drop", refuse_if_enabled("progressive layer drop is not supported")},
        {"eigenvalue", refuse_if_enabled("eigenvalue computation is not supported")},
        {"quantize_training", refuse_if_enabled("quantized training is not supported")},
        {"weight_quantization", refuse_if_enabled("weight quantization is not supported")},
        {"moe", refuse_if_enabled("mixture of experts is not supported")},
    };
    rest(root, "", reasons, special);
  }

  void finish_placeholders() {
    if (!set_value("train.max_steps")) {
      if (total_steps_) {
        put("train", "max_steps", std::to_string(*total_steps_),
            "scheduler.params.total_num_steps");
      } else {
        put("train", "max_steps", "1000",
            "placeholder: a DeepSpeed config does not say how long to train");
        placeholders_.push_back("train.max_steps");
      }
    }
    if (!set_value("model.path") && !set_value("model.config.hidden_size")) {
      put("model", "path", "\"model\"", "placeholder: the Hugging Face model folder");
      placeholders_.push_back("model.path");
    }
    if (!set_value("model.chat_template"))
      put("model", "chat_template", "\"auto\"", "the model's own template (tokenizer_config.json)");
    if (!set_value("data.plugin")) {
      put("data", "plugin", "\"cached_ssd\"",
          "placeholder: a DeepSpeed config names no data (docs/data.md)");
      if (!set_value("data.sources"))
        put("data", "sources", "[\"train.jsonl\"]", "placeholder: JSONL files or globs");
      if (!set_value("data.format"))
        put("data", "format", "\"chat\"", "placeholder: {messages: [{role, content}]}");
      placeholders_.push_back("data.plugin");
    }
  }

  std::string origin_;
  // Recipe values decided outside the config, in order (the last of a key wins): a training file's
  // (options_.given, then the groups of given_unless that apply), then --set.
  struct Set {
    std::string key, literal, comment;
  };
  std::vector<Set> sets_;
  const ImportOptions& options_;
  TrainerArgs args_;
  std::deque<json> resolved_;                          // "auto" values filled in (stable addresses)
  std::unordered_map<std::string, std::string> auto_;  // DeepSpeed path -> '"auto" -> v: source'
  std::vector<std::string> mismatches_;
  std::vector<Section> sections_;
  std::vector<std::string> ignored_, notes_, placeholders_, refused_, missing_auto_;
  std::unordered_set<std::string> read_;  // paths read: a hash set, linear in the keys
  std::string offload_ = "none";
  std::optional<bool> pin_memory_;
  std::optional<int64_t> total_steps_;
};

}  // namespace

TrainerArgs TrainerArgs::defaults() {
  // TrainingArguments' field defaults (transformers training_args.py).
  const auto d = [](double v, const char* name) {
    return TrainerValue{v, false, std::string("HF TrainingArguments ") + name + " default"};
  };
  TrainerArgs a;
  a.per_device_train_batch_size = d(8, "per_device_train_batch_size");
  a.gradient_accumulation_steps = d(1, "gradient_accumulation_steps");
  a.max_grad_norm = d(1.0, "max_grad_norm");
  a.learning_rate = d(5e-5, "learning_rate");
  a.adam_beta1 = d(0.9, "adam_beta1");
  a.adam_beta2 = d(0.999, "adam_beta2");
  a.adam_epsilon = d(1e-8, "adam_epsilon");
  a.weight_decay = d(0.0, "weight_decay");
  a.warmup_steps = d(0, "warmup_steps");
  a.warmup_ratio = d(0.0, "warmup_ratio");
  a.fp16 = d(0, "fp16");
  a.bf16 = d(0, "bf16");
  return a;
}

DeepSpeedImport import_deepspeed(const std::string& json_text, const std::string& origin,
                                 const std::vector<std::string>& overrides) {
  const ImportOptions options;
  Importer im(origin, overrides, options);
  return im.run(json_text);
}

DeepSpeedImport import_deepspeed(const std::string& json_text, const std::string& origin,
                                 const std::vector<std::string>& overrides,
                                 const ImportOptions& options) {
  Importer im(origin, overrides, options);
  return im.run(json_text);
}

}  // namespace ciuic::importer
