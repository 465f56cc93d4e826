// ciuic/config.h — a typed, located, read-only view of one recipe section.
//
// The core hands each plugin its section (e.g. [sharding]) after validating it against the
// plugin's OptionSpec list: every declared option is present (defaults filled in), has the
// declared type and lies in range. So get_*() of a declared key never fails; asking for an
// undeclared key, or with the wrong type, is a programming error and throws ciuic::Error.
//
// location() lets a plugin report problems the schema cannot express (e.g. "bucket size must be
// a multiple of 8") the way the core does: fail(key, what) throws a UsageError whose message is
// "<file>:<line>:<col>: [section] key = value: <what>".
//
// Copyable and cheap to copy (shared immutable state); safe to read from any thread.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <ciuic/export.h>
#include <ciuic/plugin.h>

namespace ciuic {

class CIUIC_API Config {
 public:
  class Impl;  // defined in core/src/recipe
  explicit Config(std::shared_ptr<const Impl> impl);

  // Parses `toml_text` as the body of section `section` with no schema (every key allowed).
  // For tests and embedders; the file name in locations is `origin`.
  static Config from_toml(std::string_view section, std::string_view toml_text,
                          std::string_view origin = "<string>");

  const std::string& section() const;
  bool has(std::string_view key) const;
  std::vector<std::string> keys() const;

  bool get_bool(std::string_view key) const;
  int64_t get_int(std::string_view key) const;
  double get_float(std::string_view key) const;  // integers are converted
  std::string get_string(std::string_view key) const;
  std::vector<std::string> get_string_list(std::string_view key) const;
  std::vector<double> get_float_list(std::string_view key) const;
  // The value of a typed option (ciuic/plugin.h, Option<T>): the key and the type as declared.
  // A section the core made has every declared option; one made with from_toml (tests,
  // embedders) may lack it, and then the option's declared default is read (fail() when the option
  // has none: it is required). The value is checked against the declared range or choices here
  // too, so a plugin need not repeat the checks its OptionSpec states.
  template <class T>
  T get(const Option<T>& option) const;

  // "<file>:<line>:<col>" where the key's value was written, "--set" for command-line
  // overrides, "<default>" for defaults filled in by the schema.
  std::string location(std::string_view key) const;
  // The section rendered as TOML (resolved: defaults included), for logs and checkpoints.
  std::string to_toml() const;

  [[noreturn]] void fail(std::string_view key, std::string_view what) const;

  const Impl& impl() const { return *impl_; }

 private:
  std::shared_ptr<const Impl> impl_;
};

template <class T>
T Config::get(const Option<T>& option) const {
  if (!has(option.key())) {
    if (!option.spec.default_value) fail(option.key(), "this option is required");
    return from_toml(section(), std::string(option.key()) + " = " + option.spec.default_value,
                     "<default>")
        .get(option);
  }
  if constexpr (std::is_same_v<T, bool>)
    return get_bool(option.key());
  else if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, double>) {
    const T v = std::is_same_v<T, int64_t> ? get_int(option.key()) : get_float(option.key());
    const double lo = option.spec.min, hi = option.spec.max;
    if ((!std::isnan(lo) && static_cast<double>(v) < lo) ||
        (!std::isnan(hi) && static_cast<double>(v) > hi))
      fail(option.key(), "out of range: expected a value" +
                             (std::isnan(lo) ? "" : " >= " + std::to_string(lo)) +
                             (std::isnan(lo) || std::isnan(hi) ? "" : " and") +
                             (std::isnan(hi) ? "" : " <= " + std::to_string(hi)));
    return v;
  } else if constexpr (std::is_same_v<T, std::string>) {
    std::string v = get_string(option.key());
    if (option.spec.choices) {
      const std::string_view choices = option.spec.choices;
      for (size_t b = 0;;) {
        const size_t e = choices.find('|', b);
        if (choices.substr(b, e == std::string_view::npos ? std::string_view::npos : e - b) == v)
          return v;
        if (e == std::string_view::npos) break;
        b = e + 1;
      }
      fail(option.key(), "expected one of " + std::string(choices));
    }
    return v;
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>)
    return get_string_list(option.key());
  else
    return get_float_list(option.key());
}

}  // namespace ciuic
