// Recipe loading: files, includes, overrides, core-schema validation, plugin sections.
#include "recipe/recipe.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include <toml++/toml.h>

#include <ciuic/error.h>
#include <ciuic/files.h>

#include "base/text.h"
#include "recipe/schema.h"
#include "sdk/config_impl.h"
#include "sdk/toml_format.h"
#include "tokenizer/utf8.h"

namespace ciuic {

namespace fs = std::filesystem;
using recipe::ErrorList;
using recipe::KeySpec;
using recipe::LocationMap;

class Recipe::Impl {
 public:
  std::string path;    // as given; "" for parse()
  std::string origin;  // name used in messages for the top-level text
  std::string dir;     // absolute
  std::vector<std::string> files;
  std::vector<std::string> overrides;
  toml::table root;  // merged recipe as written (after includes and overrides)
  LocationMap locs;
  std::map<std::string, Config, std::less<>> sections;  // validated core sections
  std::vector<std::string> warnings;                    // deprecated spellings, rewritten

  const toml::table* written(std::string_view section) const {
    const toml::table* t = &root;
    for (const auto& part : text::split(section, '.')) {
      t = t->get_as<toml::table>(part);
      if (!t) return nullptr;
    }
    return t;
  }
  std::string key_location(const std::string& dotted) const {
    auto it = locs.find(dotted);
    return it == locs.end() ? origin : it->second.value;
  }
};

namespace {

constexpr std::string_view kSetLocation = "--set";

std::string region_text(const toml::source_region& r, const std::string& file) {
  if (!r.begin) return file;
  return file + ":" + std::to_string(r.begin.line) + ":" + std::to_string(r.begin.column);
}

// Records where every key of `t` (recursively) was written.
void record_locations(const toml::table& t, const std::string& prefix, const std::string& file,
                      LocationMap& locs) {
  for (auto&& [k, v] : t) {
    const std::string full =
        prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    locs[full] = {region_text(k.source(), file), region_text(v.source(), file)};
    if (const toml::table* sub = v.as_table()) record_locations(*sub, full, file, locs);
  }
}

void copy_locations(const LocationMap& from, const std::string& full, LocationMap& to) {
  for (auto it = from.lower_bound(full); it != from.end(); ++it) {
    if (it->first != full && it->first.rfind(full + ".", 0) != 0) break;
    to[it->first] = it->second;
  }
}

// A file that names another plugin for a slot than the file it includes (`[data] plugin = "b"`
// over an include's `plugin = "a"`) drops the included file's options of that slot:
// they belong to the old plugin and would be unknown keys of the new one. The slot's core keys
// ([optimizer] lr and weight_decay) stay. Only when both files name the plugin.
void drop_switched_plugin_options(toml::table& dst, LocationMap& dst_locs, const toml::table& src,
                                  const std::string& section) {
  const recipe::SectionSpec* spec = recipe::find_section(section);
  if (!spec || !spec->plugin_slot) return;
  const auto now = src.get_as<std::string>("plugin");
  const auto was = dst.get_as<std::string>("plugin");
  if (!now || !was || now->get() == was->get()) return;
  std::vector<std::string> drop;
  for (auto&& [k, _] : dst) {
    const std::string key(k.str());
    const bool core = std::any_of(spec->keys.begin(), spec->keys.end(),
                                  [&](const KeySpec& s) { return s.key == key; });
    if (!core) drop.push_back(key);
  }
  for (const std::string& key : drop) {
    dst.erase(key);
    const std::string full = section + "." + key;
    for (auto it = dst_locs.lower_bound(full);
         it != dst_locs.end() && it->first.rfind(full, 0) == 0;)
      it = (it->first.size() == full.size() || it->first[full.size()] == '.') ? dst_locs.erase(it)
                                                                              : std::next(it);
  }
}

// Merges `src` over `dst` key by key: tables merge recursively, every other value replaces.
void merge(toml::table& dst, LocationMap& dst_locs, const toml::table& src,
           const LocationMap& src_locs, const std::string& prefix) {
  for (auto&& [k, v] : src) {
    const std::string key(k.str());
    const std::string full = prefix.empty() ? key : prefix + "." + key;
    toml::table* dt = dst.get_as<toml::table>(key);
    if (dt && v.is_table() && prefix.empty())
      drop_switched_plugin_options(*dt, dst_locs, *v.as_table(), key);
    if (dt && v.is_table()) {
      auto it = src_locs.find(full);
      if (it != src_locs.end()) dst_locs[full] = it->second;
      merge(*dt, dst_locs, *v.as_table(), src_locs, full);
    } else {
      dst.insert_or_assign(key, v);
      copy_locations(src_locs, full, dst_locs);
    }
  }
}

struct Composed {
  toml::table table;
  LocationMap locs;
};

class Loader {
 public:
  ErrorList errors;
  bool incomplete = false;  // a file could not be read or parsed
  std::vector<std::string> files;

  // Loads the file at `display` (a path as the user would write it). `stack` holds the
  // canonical paths of the files including it (cycle detection) with their display names.
  Composed load_file(const std::string& display, const std::string& included_at,
                     std::vector<std::pair<std::string, std::string>>& stack) {
    std::error_code ec;
    const std::string canon = fs::weakly_canonical(fs::path(display), ec).string();
    for (size_t i = 0; i < stack.size(); ++i) {
      if (stack[i].first == canon) {
        std::string chain;
        for (size_t j = i; j < stack.size(); ++j) chain += stack[j].second + " -> ";
        errors.add(included_at, "include cycle: " + chain + display);
        incomplete = true;
        return {};
      }
    }
    // read_input refuses FIFOs and devices (/dev/zero) without blocking, and bounds the size.
    std::string text;
    try {
      text = read_input(display, included_at.empty() ? "recipe" : "included file", kMaxRecipeBytes);
    } catch (const Error& e) {
      errors.add(included_at, e.what());
      incomplete = true;
      return {};
    }
    stack.emplace_back(canon, display);
    Composed c = load_text(text, display, fs::path(display).parent_path(), stack);
    stack.pop_back();
    return c;
  }

  Composed load_text(std::string_view text, const std::string& display, const fs::path& base,
                     std::vector<std::pair<std::string, std::string>>& stack) {
    files.push_back(display);
    toml::table t;
    try {
      t = toml::parse(text, std::string(display));
    } catch (const toml::parse_error& e) {
      errors.add(region_text(e.source(), display),
                 "malformed TOML: " + std::string(e.description()));
      incomplete = true;
      return {};
    }
    LocationMap locs;
    record_locations(t, "", display, locs);
    Composed out;
    if (const toml::node* inc = t.get("include")) {
      std::vector<std::pair<std::string, std::string>> targets;  // (path, location)
      auto bad = [&] {
        errors.add(
            locs["include"].value,
            "include: expected a list of recipe files (e.g. include = [\"base.toml\"]), found " +
                recipe::describe_found(*inc));
      };
      if (const toml::array* a = inc->as_array()) {
        for (const auto& e : *a) {
          if (!e.is_string()) {
            bad();
            targets.clear();
            break;
          }
          targets.emplace_back(*e.value_exact<std::string>(), region_text(e.source(), display));
        }
      } else if (auto s = inc->value_exact<std::string>()) {
        targets.emplace_back(*s, locs["include"].value);
      } else {
        bad();
      }
      for (const auto& [target, where] : targets) {
        fs::path p(target);
        std::string shown = p.is_absolute() ? p.lexically_normal().string()
                                            : (base / p).lexically_normal().string();
        Composed sub = load_file(shown, where, stack);
        merge(out.table, out.locs, sub.table, sub.locs, "");
      }
      t.erase("include");
    }
    merge(out.table, out.locs, t, locs, "");
    return out;
  }
};

// A --set value taken as a string without quotes (comm.plugin=gloo): printable, valid UTF-8 text
// without TOML syntax, so that --print-recipe writes it back as a string TOML accepts.
bool is_bare_word(std::string_view v) {
  if (v.empty() || std::isspace(static_cast<unsigned char>(v.front())) ||
      std::isspace(static_cast<unsigned char>(v.back())))
    return false;
  for (unsigned char c : v)
    if (c < 0x20 || c == 0x7F) return false;
  return v.find_first_of("\"'[]{}=#") == std::string_view::npos &&
         tok::utf8::find_invalid(v) == std::string_view::npos;
}

// Where a key written without (or in the wrong) section belongs, among the core sections.
std::string section_of_key(std::string_view key, std::string_view except = "") {
  for (const auto& s : recipe::core_schema()) {
    if (s.name == except) continue;
    for (const auto& k : s.keys)
      if (k.key == key) return s.name;
  }
  return "";
}

void apply_override(const std::string& text, toml::table& root, LocationMap& locs,
                    ErrorList& errors) {
  const std::string where = std::string(kSetLocation) + " " + text;
  const size_t eq = text.find('=');
  if (eq == std::string::npos) {
    errors.add(where, "expected section.key=value");
    return;
  }
  std::string lhs = text.substr(0, eq), rhs = text.substr(eq + 1);
  while (!lhs.empty() && std::isspace(static_cast<unsigned char>(lhs.back()))) lhs.pop_back();
  while (!rhs.empty() && std::isspace(static_cast<unsigned char>(rhs.front()))) rhs.erase(0, 1);
  const size_t dot = lhs.rfind('.');
  if (dot == std::string::npos || dot == 0 || dot + 1 == lhs.size()) {
    std::string m = "expected section.key=value, found key '" + lhs + "' without a section";
    std::string s = section_of_key(lhs);
    if (!s.empty()) m += "; did you mean " + s + "." + lhs + "?";
    errors.add(where, m);
    return;
  }
  const std::string section = lhs.substr(0, dot), key = lhs.substr(dot + 1);
  // Bare TOML keys only (what every ciuic key is): a control byte or a quote in a key would be
  // kept in plugin sections (checked later) and written into --print-recipe's output.
  for (const auto& part : text::split(lhs, '.'))
    if (part.empty() || part.find_first_not_of(
                            "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-") !=
                            std::string::npos) {
      errors.add(where, "a key has letters, digits, '_' and '-' only (section.key=value)");
      return;
    }
  if (!recipe::find_section(section) && section != "offload") {  // [offload]: deprecated, rewritten
    std::string m = "unknown section [" + section + "]";
    std::string near = text::closest(section, recipe::section_names());
    if (!near.empty()) m += "; did you mean [" + near + "]?";
    errors.add(where, m);
    return;
  }
  if (rhs.empty()) {
    errors.add(where, "empty value (write '\"\"' for an empty string)");
    return;
  }
  toml::table holder;
  if (auto lit = recipe::parse_literal(rhs)) {
    holder = std::move(*lit);
  } else if (is_bare_word(rhs)) {
    holder.insert_or_assign("v", rhs);
  } else {
    errors.add(where, "the value is not a TOML value (strings need quotes: '\"text\"')");
    return;
  }
  toml::table* t = &root;
  std::string path;
  for (const auto& part : text::split(section, '.')) {
    path = path.empty() ? part : path + "." + part;
    toml::node* n = t->get(part);
    if (!n) {
      t->insert_or_assign(part, toml::table{});
      locs[path] = {where, where};
      n = t->get(part);
    }
    t = n->as_table();
    if (!t) {
      errors.add(where, "[" + path + "] is not a section in the recipe (found " +
                            recipe::describe_found(*n) + ")");
      return;
    }
  }
  t->insert_or_assign(key, *holder.get("v"));
  locs[lhs] = {where, where};
}

// Top level: only sections (and `include`, removed by the loader).
void check_top_level(const toml::table& root, const LocationMap& locs, const std::string& origin,
                     ErrorList& errors) {
  std::vector<std::string> tops;
  for (const auto& s : recipe::core_schema())
    if (s.name.find('.') == std::string::npos) tops.push_back(s.name);
  for (auto&& [k, v] : root) {
    const std::string key(k.str());
    auto it = locs.find(key);
    const std::string where = it == locs.end() ? origin : it->second.key;
    const bool known = std::find(tops.begin(), tops.end(), key) != tops.end();
    if (!v.is_table()) {
      std::string m = known ? "'" + key + "' must be a section ([" + key + "]), found " +
                                  recipe::describe_found(v)
                            : "key '" + key + "' is outside any section";
      if (!known) {
        std::string s = section_of_key(key);
        if (!s.empty()) m += "; did you mean section [" + s + "]?";
      }
      errors.add(where, m);
    } else if (!known) {
      std::string m = "unknown section [" + key + "]";
      std::string near = text::closest(key, tops);
      if (!near.empty())
        m += "; did you mean [" + near + "]?";
      else
        m += " (sections: " + text::join(tops, ", ") + ")";
      errors.add(where, m);
    }
  }
}

// A plugin section's `plugin` key: a non-empty string.
void check_plugin_key(const recipe::SectionSpec& spec, const toml::table* t,
                      const LocationMap& locs, const std::string& origin, bool report_missing,
                      ErrorList& errors) {
  const toml::node* p = t ? t->get("plugin") : nullptr;
  auto loc = [&](const std::string& dotted, bool value) {
    auto it = locs.find(dotted);
    return it == locs.end() ? origin : value ? it->second.value : it->second.key;
  };
  if (!p) {
    if (spec.name == "data" && report_missing)
      errors.add(loc("data", false),
                 std::string("[data] missing required key 'plugin' (a string: the data ") +
                     "source plugin, e.g. plugin = \"synthetic\"; see ciuic-run --list-plugins)");
    return;
  }
  if (!p->is_string()) {
    errors.add(loc(spec.name + ".plugin", true),
               "[" + spec.name + "] plugin: expected a string (a plugin name), found " +
                   recipe::describe_found(*p));
  } else if (p->value_exact<std::string>()->empty()) {
    errors.add(loc(spec.name + ".plugin", true),
               "[" + spec.name + "] plugin: expected a plugin name, found an empty string");
  }
}

const std::vector<std::string>& slot_names() {
  static const std::vector<std::string> v = [] {
    std::vector<std::string> out;
    for (int i = 0; i < kNumSlots; ++i) out.emplace_back(slot_name(static_cast<Slot>(i)));
    return out;
  }();
  return v;
}

bool is_slot(std::string_view name) {
  for (const auto& s : slot_names())
    if (s == name) return true;
  return false;
}

}  // namespace

// ---- loading --------------------------------------------------------------------------------
namespace {

// Spellings of earlier versions, rewritten to today's with a warning that says what to write:
//   [offload] plugin = <name> (+ options)  ->  [optimizer] plugin = <name> (+ options)
//   [optimizer] type = <name>              ->  [optimizer] plugin = <name>
void rewrite_deprecated(Recipe::Impl& r, ErrorList& errors) {
  if (toml::table* off = r.root.get_as<toml::table>("offload")) {
    const std::string where = r.key_location("offload");
    toml::table* opt = r.root.get_as<toml::table>("optimizer");
    if (!opt) {
      r.root.insert_or_assign("optimizer", toml::table{});
      opt = r.root.get_as<toml::table>("optimizer");
      r.locs["optimizer"] = r.locs["offload"];
    }
    const auto plugin = off->get_as<std::string>("plugin");
    if (plugin && opt->contains("plugin")) {
      errors.add(where,
                 "[offload] and [optimizer] both choose a plugin: [offload] is the old name of "
                 "[optimizer]; write only [optimizer] plugin = \"" +
                     plugin->get() + "\"");
    } else if (plugin && plugin->get().empty()) {
      r.warnings.push_back(where +
                           ": [offload] plugin = \"\" is deprecated: the default optimizer "
                           "(adamw, on the device) needs no section; remove [offload]");
    } else {
      for (auto&& [k, v] : *off) {
        const std::string key(k.str());
        if (opt->contains(key)) {
          errors.add(r.key_location("offload." + key),
                     "[offload] " + key +
                         " is also set in [optimizer]: [offload] is the old name "
                         "of [optimizer]; keep one");
          continue;
        }
        opt->insert_or_assign(key, v);
        if (auto it = r.locs.find("offload." + key); it != r.locs.end())
          r.locs["optimizer." + key] = it->second;
      }
      r.warnings.push_back(where + ": [offload] is deprecated: write [optimizer] plugin = \"" +
                           (plugin ? plugin->get() : std::string("<name>")) +
                           "\" (with the same options) instead");
    }
    r.root.erase("offload");
  }
  if (toml::table* opt = r.root.get_as<toml::table>("optimizer")) {
    if (const toml::node* type = opt->get("type")) {
      const std::string where = r.key_location("optimizer.type");
      const auto name = type->value_exact<std::string>();
      if (!name || name->empty()) {
        errors.add(where, "[optimizer] type: expected an optimizer name, found " +
                              recipe::describe_found(*type) +
                              " ('type' is deprecated: write [optimizer] plugin = \"<name>\")");
      } else if (opt->contains("plugin")) {
        errors.add(where,
                   "[optimizer] type is the old name of [optimizer] plugin: keep only plugin");
      } else {
        r.warnings.push_back(where +
                             ": [optimizer] type is deprecated: write [optimizer] plugin = \"" +
                             *name + "\" instead");
        opt->insert_or_assign("plugin", *name);
        r.locs["optimizer.plugin"] = r.locs["optimizer.type"];
      }
      opt->erase("type");
    }
  }
}

std::shared_ptr<Recipe::Impl> finish(std::shared_ptr<Recipe::Impl> impl, Loader& loader,
                                     const std::vector<std::string>& overrides,
                                     ErrorList* problems = nullptr) {
  impl->files = loader.files;
  impl->overrides = overrides;
  ErrorList& errors = loader.errors;
  for (const auto& o : overrides) apply_override(o, impl->root, impl->locs, errors);
  rewrite_deprecated(*impl, errors);
  check_top_level(impl->root, impl->locs, impl->origin, errors);
  const auto known = recipe::core_known_sections();
  for (const auto& spec : recipe::core_schema()) {
    const toml::table* t = impl->written(spec.name);
    recipe::SectionInput in;
    in.section = spec.name;
    in.written = t;
    in.locations = &impl->locs;
    in.origin = impl->origin;
    in.report_missing = !loader.incomplete;
    if (spec.plugin_slot) {
      check_plugin_key(spec, t, impl->locs, impl->origin, !loader.incomplete, errors);
      if (spec.keys.size() > 1) {  // core keys besides `plugin` ([optimizer] lr, weight_decay)
        in.skip = {"plugin"};
        in.others_ok = true;  // the plugin's options: validated once the plugin is known
        std::vector<KeySpec> core(spec.keys.begin() + 1, spec.keys.end());
        impl->sections.emplace(spec.name,
                               Config(recipe::validate_section(in, core, known, errors)));
      }
      continue;
    }
    for (const auto& other : recipe::core_schema()) {  // sub-sections are validated on their own
      if (other.name.rfind(spec.name + ".", 0) != 0) continue;
      const std::string sub = other.name.substr(spec.name.size() + 1);
      in.skip.push_back(sub);
      if (const toml::node* n = t ? t->get(sub) : nullptr; n && !n->is_table())
        errors.add(impl->key_location(other.name), "[" + spec.name + "] " + sub +
                                                       ": expected a section [" + other.name +
                                                       "], found " + recipe::describe_found(*n));
    }
    auto data = recipe::validate_section(in, spec.keys, known, errors);
    if (spec.name == "run" && !data->table.contains("output_dir")) {
      auto name = data->table["name"].value_exact<std::string>();
      data->table.insert_or_assign("output_dir", "runs/" + name.value_or("run"));
      data->locations["output_dir"] = "<default>";
    }
    impl->sections.emplace(spec.name, Config(std::move(data)));
  }
  if (problems)
    problems->append(errors);
  else
    errors.throw_if_any("recipe " + impl->origin);
  return impl;
}

}  // namespace

PluginCatalog::~PluginCatalog() = default;

Recipe::Recipe(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

Recipe Recipe::load(const std::string& path, const std::vector<std::string>& overrides) {
  return load(path, overrides, nullptr);
}

Recipe Recipe::load(const std::string& path, const std::vector<std::string>& overrides,
                    ErrorList* problems) {
  auto impl = std::make_shared<Impl>();
  impl->path = path;
  impl->origin = path;
  std::error_code ec;
  impl->dir = fs::absolute(fs::path(path), ec).parent_path().lexically_normal().string();
  Loader loader;
  std::vector<std::pair<std::string, std::string>> stack;
  Composed c = loader.load_file(path, "", stack);
  impl->root = std::move(c.table);
  impl->locs = std::move(c.locs);
  return Recipe(finish(std::move(impl), loader, overrides, problems));
}

Recipe Recipe::parse(std::string_view toml_text, std::string_view origin,
                     const std::vector<std::string>& overrides) {
  auto impl = std::make_shared<Impl>();
  impl->origin = std::string(origin);
  std::error_code ec;
  impl->dir = fs::current_path(ec).string();
  Loader loader;
  std::vector<std::pair<std::string, std::string>> stack;
  Composed c = loader.load_text(toml_text, impl->origin, fs::path(), stack);
  impl->root = std::move(c.table);
  impl->locs = std::move(c.locs);
  return Recipe(finish(std::move(impl), loader, overrides));
}

const std::string& Recipe::path() const { return impl_->path; }
std::string Recipe::dir() const { return impl_->dir; }
const std::vector<std::string>& Recipe::files() const { return impl_->files; }
const std::vector<std::string>& Recipe::overrides() const { return impl_->overrides; }

Config Recipe::section(std::string_view name) const {
  auto it = impl_->sections.find(name);
  if (it == impl_->sections.end()) {
    if (is_slot(name))
      throw Error("internal error: Recipe::section(\"" + std::string(name) +
                  "\"): this plugin section has no core keys; read it through "
                  "Recipe::plugin_config()");
    throw Error("internal error: Recipe::section(\"" + std::string(name) +
                "\"): no such core section");
  }
  return it->second;
}

bool Recipe::has_section(std::string_view name) const { return impl_->written(name) != nullptr; }
const std::vector<std::string>& Recipe::warnings() const { return impl_->warnings; }

// ---- plugins --------------------------------------------------------------------------------
namespace {
// The one table of default plugins: what a recipe gets for a slot it does not choose, on a CPU
// and on a CUDA run. (data has none: [data] plugin is required.)
struct DefaultPlugin {
  Slot slot;
  const char* cpu;
  const char* cuda;
};
constexpr DefaultPlugin kDefaultPlugins[] = {
    {Slot::kComm, "gloo", "nccl"},
    {Slot::kSharding, "ddp", "ddp"},
    {Slot::kOptimizer, "adamw", "adamw"},
    {Slot::kPrecision, "fp32", "fp32"},
};
}  // namespace

std::string Recipe::plugin_name(Slot slot) const {
  if (const toml::table* t = impl_->written(slot_name(slot)))
    if (auto p = t->get_as<std::string>("plugin")) return p->get();
  const bool cuda = section("cluster").get_string("device") == "cuda";
  for (const DefaultPlugin& d : kDefaultPlugins)
    if (d.slot == slot) return cuda ? d.cuda : d.cpu;
  return "";  // data: required, load() has failed without it
}

std::string Recipe::plugin_location(Slot slot) const {
  const std::string dotted = std::string(slot_name(slot)) + ".plugin";
  auto it = impl_->locs.find(dotted);
  if (it == impl_->locs.end()) return "<default>";
  return it->second.value.rfind(kSetLocation, 0) == 0 ? std::string(kSetLocation)
                                                      : it->second.value;
}

namespace {

recipe::SectionInput plugin_input(const Recipe::Impl& r, Slot slot, const PluginInfo& info) {
  recipe::SectionInput in;
  in.section = slot_name(slot);
  in.written = r.written(in.section);
  in.locations = &r.locs;
  in.origin = r.origin;
  if (const recipe::SectionSpec* spec = recipe::find_section(in.section))
    for (const KeySpec& k : spec->keys) in.skip.push_back(k.key);  // the core's keys
  in.owner = std::string("plugin ") + (info.name ? info.name : "?");
  return in;
}

std::vector<KeySpec> plugin_keys(const PluginInfo& info) {
  std::vector<KeySpec> keys;
  for (uint32_t i = 0; i < info.num_options; ++i)
    keys.push_back(recipe::key_from_option(info.options[i]));
  return keys;
}

}  // namespace

Config Recipe::plugin_config(Slot slot, const PluginInfo& info) const {
  ErrorList errors;
  auto data = recipe::validate_section(plugin_input(*impl_, slot, info), plugin_keys(info),
                                       recipe::core_known_sections(), errors);
  errors.throw_if_any("recipe " + impl_->origin);
  return Config(std::move(data));
}

Config Recipe::plugin_defaults(Slot slot, const PluginInfo& info) {
  recipe::SectionInput in;
  in.section = slot_name(slot);
  in.origin = "<default>";
  in.owner = std::string("plugin ") + (info.name ? info.name : "?");
  ErrorList errors;
  auto data = recipe::validate_section(in, plugin_keys(info), {}, errors);
  errors.throw_if_any(std::string("defaults of plugin ") + (info.name ? info.name : "?"));
  return Config(std::move(data));
}

void Recipe::validate_plugins(const PluginCatalog& registry) const {
  validate_plugins(registry, nullptr);
}

void Recipe::validate_plugins(const PluginCatalog& registry, ErrorList* problems) const {
  ErrorList errors;
  auto known = recipe::core_known_sections();
  // Options of the chosen plugins, so a key in the wrong plugin section gets "did you mean [x]".
  for (int i = 0; i < kNumSlots; ++i) {
    const Slot slot = static_cast<Slot>(i);
    const std::string name = plugin_name(slot);
    if (name.empty()) continue;
    if (const PluginInfo* info = registry.find_info(slot, name)) {
      recipe::KnownSection k{slot_name(slot), {}};
      for (const auto& key : plugin_keys(*info)) k.keys.push_back(key.key);
      known.push_back(std::move(k));
    }
  }
  for (int i = 0; i < kNumSlots; ++i) {
    const Slot slot = static_cast<Slot>(i);
    const std::string s = slot_name(slot);
    const std::string name = plugin_name(slot);
    if (name.empty()) continue;  // data without a plugin: reported by load()
    const PluginInfo* info = registry.find_info(slot, name);
    if (!info) {
      const std::string where =
          impl_->locs.count(s + ".plugin") ? impl_->key_location(s + ".plugin") : "<default>";
      std::string msg = registry.why_missing(slot, name);
      if (where == "<default>") msg = "[" + s + "] default plugin: " + msg;
      errors.add(where == "<default>" ? impl_->origin : where, msg);
      continue;
    }
    recipe::validate_section(plugin_input(*impl_, slot, *info), plugin_keys(*info), known, errors);
  }
  if (problems)
    problems->append(errors);
  else
    errors.throw_if_any("recipe " + impl_->origin);
}

// ---- printing -------------------------------------------------------------------------------
namespace {

// Prints `values` in the order of `order` (keys missing from it follow, alphabetically).
void print_section(std::ostringstream& os, const std::string& name, const toml::table& values,
                   std::vector<std::string> order,
                   const std::function<std::string(const std::string&)>& where) {
  for (auto&& [k, v] : values)
    if (std::find(order.begin(), order.end(), k.str()) == order.end()) order.emplace_back(k.str());
  os << "\n[" << name << "]\n";
  for (const auto& key : order) {
    const toml::node* v = values.get(key);
    if (!v || v->is_table()) continue;
    std::string line = key + " = " + ciuic::format_value(*v);
    if (line.size() < 44) line.resize(44, ' ');
    os << line << "  # " << where(key) << "\n";
  }
}

std::vector<std::string> key_order(const std::vector<KeySpec>& keys) {
  std::vector<std::string> out;
  for (const auto& k : keys) out.push_back(k.key);
  return out;
}

std::string resolved(const Recipe& r, const Recipe::Impl& impl, const PluginCatalog* registry) {
  std::ostringstream os;
  os << "# ciuic resolved recipe: " << impl.origin;
  if (impl.files.size() > 1) {
    std::vector<std::string> inc(impl.files.begin() + 1, impl.files.end());
    os << " (includes " << text::join(inc, ", ") << ")";
  }
  os << "\n";
  if (!impl.overrides.empty()) os << "# overrides: " << text::join(impl.overrides, " ") << "\n";
  os << "# every value with where it comes from: <file>:<line>:<col>, --set, or <default>\n";
  for (const auto& spec : recipe::core_schema()) {
    if (!spec.plugin_slot) {
      Config c = r.section(spec.name);
      if (c.keys().empty() && spec.name == "model.config") continue;
      print_section(os, spec.name, c.impl().table, key_order(spec.keys),
                    [&](const std::string& k) { return c.location(k); });
      continue;
    }
    Slot slot{};
    for (int i = 0; i < kNumSlots; ++i)
      if (spec.name == slot_name(static_cast<Slot>(i))) slot = static_cast<Slot>(i);
    const std::string name = r.plugin_name(slot);
    toml::table values;
    std::map<std::string, std::string> where;
    values.insert_or_assign("plugin", name);
    where["plugin"] = r.plugin_location(slot);
    std::vector<std::string> order{"plugin"};
    if (spec.keys.size() > 1) {  // the slot's core keys ([optimizer] lr, weight_decay)
      Config c = r.section(spec.name);
      for (const auto& k : key_order(spec.keys))
        if (k != "plugin") order.push_back(k);
      for (auto&& [k, v] : c.impl().table) {
        values.insert_or_assign(k.str(), v);
        where[std::string(k.str())] = c.location(k.str());
      }
    }
    const PluginInfo* d = registry && !name.empty() ? registry->find_info(slot, name) : nullptr;
    if (d) {
      for (const auto& k : key_order(plugin_keys(*d))) order.push_back(k);
      Config c = r.plugin_config(slot, *d);
      for (auto&& [k, v] : c.impl().table) {
        values.insert_or_assign(k.str(), v);
        where[std::string(k.str())] = c.location(k.str());
      }
    } else if (const toml::table* t = impl.written(spec.name)) {
      for (auto&& [k, v] : *t) {
        if (k.str() == "plugin" || values.contains(k.str())) continue;
        values.insert_or_assign(k.str(), v);
        where[std::string(k.str())] = impl.key_location(spec.name + "." + std::string(k.str()));
      }
    }
    print_section(os, spec.name, values, order, [&](const std::string& k) { return where[k]; });
  }
  return os.str();
}

}  // namespace

std::string Recipe::resolved_toml() const { return resolved(*this, *impl_, nullptr); }
std::string Recipe::resolved_toml(const PluginCatalog& registry) const {
  return resolved(*this, *impl_, &registry);
}

bool is_auto(const Config& section, std::string_view key) {
  const toml::node* n = section.impl().table.get(key);
  return n && n->is_string() && *n->value_exact<std::string>() == "auto";
}

namespace {
template <class T>
Config with_value(const Config& options, std::string_view key, T value) {
  if (!options.has(key))
    throw Error("internal error: replacing \"" + std::string(key) + "\": no such key in [" +
                options.section() + "]");
  auto impl = std::make_shared<Config::Impl>(options.impl());
  impl->table.insert_or_assign(key, std::move(value));
  return Config(std::move(impl));
}
}  // namespace

Config with_string(const Config& options, std::string_view key, std::string value) {
  return with_value(options, key, std::move(value));
}
Config with_int(const Config& options, std::string_view key, int64_t value) {
  return with_value(options, key, value);
}

}  // namespace ciuic
