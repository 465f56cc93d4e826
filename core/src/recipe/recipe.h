// Internal: the recipe — a TOML file (plus includes and --set overrides) that chooses and
// configures everything a run does (DESIGN §5; reference: docs/recipe.md).
//
// Loading is strict: unknown sections and keys, wrong types (exact: an integer where a float is
// expected is fine, a float where an integer is expected is not, a quoted "1e-4" is a string),
// values out of range or outside their choices, missing required keys, malformed TOML, missing
// include files and include cycles are errors naming <file>:<line>:<col>, the key, what was
// expected and, for unknown keys, the closest known key or the section the key belongs to. All
// problems are collected and thrown together as one ciuic::UsageError (exit code 2), one per line.
//
// Composition: a top-level `include = ["base.toml", ...]` loads those files first (relative to
// the including file), in order; later files override earlier ones and the including file
// overrides its includes, key by key (arrays are replaced, not concatenated). Then every
// `--set section.key=value` override is applied in order; its value is a TOML value
// (`train.seq_len=128`, `run.name="x"`, `optimizer.betas=[0.9,0.95]`), or, when it is not valid
// TOML and contains no quotes, brackets, braces, '=' or '#', a bare word taken as a string
// (`comm.plugin=gloo`, `model.path=/models/x`).
//
// Plugin sections ([comm] [sharding] [optimizer] [precision] [data]) hold `plugin = "<name>"` plus
// that plugin's options ([optimizer] also the core keys lr and weight_decay, read through
// section("optimizer")); the options are validated against the plugin's declared OptionSpec list
// by plugin_config() / validate_plugins(), once the plugins are known (a PluginCatalog: the
// registry; recipe/ does not depend on registry/).
//
// Deprecated spellings are rewritten with a warning (warnings()): [offload] plugin = <name> (with
// its options) becomes [optimizer] plugin = <name>; [optimizer] type = <name> becomes
// [optimizer] plugin = <name>.
//
// A Recipe is immutable after loading, cheap to copy (shared state) and safe to read from any
// thread.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <ciuic/config.h>
#include <ciuic/export.h>
#include <ciuic/plugin.h>

namespace ciuic {
namespace recipe {
class ErrorList;
}

// What the recipe needs to know of the installed plugins (implemented by the Registry).
class CIUIC_API PluginCatalog {
 public:
  virtual ~PluginCatalog();
  // The info record of an accepted plugin, or null.
  virtual const PluginInfo* find_info(Slot slot, std::string_view name) const = 0;
  // Why `name` is not available, as a sentence for the user (unknown name and the closest known
  // one, refusal of a file of that name, the searched folders).
  virtual std::string why_missing(Slot slot, std::string_view name) const = 0;
};

class CIUIC_API Recipe {
 public:
  // Reads `path` (following `include = [...]`, relative to the including file), applies
  // `overrides` ("section.key=<TOML value>", e.g. "train.micro_batch_size=4",
  // "sharding.reduce_bucket_size=5e7", "run.name=\"x\""), fills defaults, validates the core
  // sections against the core schema. Throws UsageError listing ALL errors (file:line:col, key,
  // expected, did-you-mean).
  static Recipe load(const std::string& path, const std::vector<std::string>& overrides = {});
  // Same, collecting the recipe's problems into `*problems` instead of throwing (errors reading
  // the files themselves still throw), so that a caller can add the plugin sections' problems
  // (validate_plugins below) and report all of them in one pass. The recipe returned may then
  // lack values that had errors: read it only to find and validate its plugins.
  static Recipe load(const std::string& path, const std::vector<std::string>& overrides,
                     recipe::ErrorList* problems);
  // Same from text; `origin` names it in messages; includes are relative to the working directory.
  static Recipe parse(std::string_view toml_text, std::string_view origin,
                      const std::vector<std::string>& overrides = {});

  const std::string& path() const;  // as given to load(); "" for parse()
  // Absolute folder of the top-level recipe (the working directory for parse()): the base of
  // relative input paths ([model] path, tokenizer, [run] plugin_paths, data files).
  std::string dir() const;
  // Every file read: the top-level recipe first, then its includes in load order.
  const std::vector<std::string>& files() const;
  const std::vector<std::string>& overrides() const;

  // A validated core section with defaults filled in: "run", "cluster", "model", "model.config",
  // "train", "scheduler", "checkpoint", "log", and the core keys of "optimizer" (lr,
  // weight_decay). Throws ciuic::Error for other names (plugin options are read through
  // plugin_config()).
  Config section(std::string_view name) const;
  // True when the recipe (a file or a --set) wrote the section, not only its defaults.
  bool has_section(std::string_view name) const;
  // "<file>:<line>:<col>: <old spelling> is deprecated: <what to write>" for every deprecated
  // spelling that was rewritten (the launcher logs them once).
  const std::vector<std::string>& warnings() const;

  // Plugin chosen for a slot: [<slot>] plugin = "...", else the default from the one table of
  // default plugins in recipe.cpp (data has none: required, checked at load).
  std::string plugin_name(Slot slot) const;
  // Where the choice was made: "<file>:<line>:<col>", "--set" or "<default>".
  std::string plugin_location(Slot slot) const;
  // The slot's section (without `plugin`) validated against the plugin's declared options:
  // defaults filled in, a location per key. Throws UsageError listing all errors.
  Config plugin_config(Slot slot, const PluginInfo& info) const;
  // The plugin's declared defaults alone, as if its section were empty (for planning an
  // alternative to the recipe's choice).
  static Config plugin_defaults(Slot slot, const PluginInfo& info);
  // Validates every slot's plugin choice (it exists and loaded) and options against the
  // registry; throws one UsageError listing all problems of all slots.
  void validate_plugins(const PluginCatalog& plugins) const;
  // Same, appending the problems to `*problems` instead of throwing.
  void validate_plugins(const PluginCatalog& plugins, recipe::ErrorList* problems) const;

  // The whole recipe as TOML with defaults included and the origin of every value as a comment
  // (--print-recipe). Plugin sections hold what was written; the overload with a registry also
  // fills in the plugins' defaults. The text loads back as an equivalent recipe.
  std::string resolved_toml() const;
  std::string resolved_toml(const PluginCatalog& plugins) const;

  class Impl;

 private:
  explicit Recipe(std::shared_ptr<const Impl> impl);
  std::shared_ptr<const Impl> impl_;
};

// True when `key` of a validated core section holds the string "auto" (integer keys that also take
// "auto", e.g. [model] checkpoint_layers); get_int() of such a key throws then.
CIUIC_API bool is_auto(const Config& section, std::string_view key);
// `options` with the string `value` in place of `key`'s (which must be there; its location is
// kept): how the memory planner hands a plugin what it chose for a kOptionPlanned option.
CIUIC_API Config with_string(const Config& options, std::string_view key, std::string value);
// Same with an integer value.
CIUIC_API Config with_int(const Config& options, std::string_view key, int64_t value);

}  // namespace ciuic
