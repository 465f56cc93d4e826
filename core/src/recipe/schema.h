// Internal: the recipe schema and the section validator (core/src/recipe).
//
// A schema is a list of KeySpec per section. The core sections' schema is core_schema(); a
// plugin's section is validated against its OptionSpec list converted with key_from_option().
// validate_section() checks one written section (exact types, ranges, choices, required keys,
// unknown keys with did-you-mean) and returns the Config data with defaults filled in; it never
// throws for recipe problems: it appends every problem to an ErrorList, so that the caller can
// report all of them at once.
#pragma once

#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <toml++/toml.h>

#include <ciuic/config.h>
#include <ciuic/plugin.h>

#include "sdk/config_impl.h"
#include "sdk/toml_format.h"

namespace ciuic::recipe {

// One key of a section: a core key, or a plugin option (see key_from_option).
struct KeySpec {
  enum class Presence {
    kDefault,   // absent: default_literal is filled in
    kRequired,  // absent: error
    kOptional,  // absent: stays absent (e.g. [model.config]: "take it from config.json")
  };
  std::string key;
  OptionType type = OptionType::kString;
  Presence presence = Presence::kDefault;
  std::string default_literal;  // a TOML value literal, for kDefault
  std::string help;             // one line
  double min = NAN;             // bounds for kInt / kFloat / each kFloatList element; NAN: none
  double max = NAN;
  bool min_exclusive = false;
  bool max_exclusive = false;
  std::string choices;   // kString: allowed values "a|b|c"; empty: any
  size_t list_size = 0;  // kStringList / kFloatList: exact length; 0: any
  bool or_auto = false;  // kInt: the string "auto" is accepted too (core keys only; read it
                         // with is_auto() before get_int())
};

struct SectionSpec {
  std::string name;  // "train", "model.config", "sharding"
  std::string help;  // one line
  std::vector<KeySpec> keys;
  // [comm] [sharding] [optimizer] [precision] [data]: 'plugin' + that plugin's options, plus the
  // core keys listed in `keys` (always 'plugin'; [optimizer] also lr and weight_decay, which the
  // schedule and the sharding need whatever the optimizer).
  bool plugin_slot = false;
};

// The core sections, in the order the resolved recipe and the docs list them. Slot sections
// appear with their core keys only (`plugin`, and [optimizer]'s lr and weight_decay).
CIUIC_API const std::vector<SectionSpec>& core_schema();
CIUIC_API const SectionSpec* find_section(std::string_view name);
CIUIC_API std::vector<std::string> section_names();

// A plugin option as a KeySpec (default_value nullptr = required).
CIUIC_API KeySpec key_from_option(const OptionSpec& option);
// "" when the spec's default (if any) is a valid value of its own type and range, else what is
// wrong with it (for the registry's check of plugin declarations and a test of the core schema).
CIUIC_API std::string check_default(const KeySpec& spec);

// "boolean", "integer", "float", "string", "list of strings", "list of numbers".
CIUIC_API const char* type_name(OptionType type);
// What a valid value looks like: "an integer >= 1", "a float in [0, 1)", "one of "cpu"|"cuda"".
CIUIC_API std::string describe_expected(const KeySpec& spec);
// The default as listed for users: the literal, "(required)" or "(unset)".
CIUIC_API std::string default_text(const KeySpec& spec);

// What a value is, for messages: "a float (2.5)", "a string (\"1e-4\")", "a table".
CIUIC_API std::string describe_found(const toml::node& node);
// Parses a single TOML value literal; nullopt when it is not one.
CIUIC_API std::optional<toml::table> parse_literal(std::string_view literal);

// Where each key of the merged recipe was written, by dotted path ("train.seq_len",
// "model.config" for a section header): the key's and the value's "<file>:<line>:<col>", or
// "--set" for command-line overrides.
struct Location {
  std::string key;
  std::string value;
};
using LocationMap = std::map<std::string, Location, std::less<>>;

// Recipe problems collected before reporting them together.
class CIUIC_API ErrorList {
 public:
  // `where` is "<file>:<line>:<col>", "--set" or a file name; `message` says what is wrong.
  void add(std::string_view where, std::string_view message);
  bool empty() const { return lines_.empty(); }
  size_t size() const { return lines_.size(); }
  const std::vector<std::string>& lines() const { return lines_; }
  void append(const ErrorList& other);
  // Throws one UsageError: the single line, or "<subject> has N errors:" followed by one line
  // per error. Does nothing when empty.
  void throw_if_any(std::string_view subject) const;

 private:
  std::vector<std::string> lines_;
};

// Keys of another section, to suggest "did you mean section [x]?" for a misplaced key.
struct KnownSection {
  std::string name;
  std::vector<std::string> keys;
};

struct SectionInput {
  std::string section;  // e.g. "train", "sharding"
  const toml::table* written =
      nullptr;  // the section as written (after includes/overrides); null: absent
  const LocationMap* locations = nullptr;
  std::string origin;             // the top-level recipe file, for problems without a line
  std::vector<std::string> skip;  // keys checked elsewhere (`plugin`, sub-sections)
  bool others_ok = false;         // keys not in the spec are not errors (a slot section's
                                  // core keys are read before its plugin is known)
  std::string owner;              // "plugin zero2" for plugin sections, "" for the core
  bool report_missing = true;     // false when a file failed to parse (its keys are unknown)
};

// Validates one section; see the file comment. `elsewhere` feeds the misplaced-key suggestion.
CIUIC_API std::shared_ptr<Config::Impl> validate_section(const SectionInput& in,
                                                         const std::vector<KeySpec>& keys,
                                                         const std::vector<KnownSection>& elsewhere,
                                                         ErrorList& errors);

// Core sections as KnownSection lists (for `elsewhere`).
CIUIC_API std::vector<KnownSection> core_known_sections();

}  // namespace ciuic::recipe
