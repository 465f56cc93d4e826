// options.h — reads a plugin's options from its Config, falling back to the declared defaults.
//
// The core validates a recipe section against the plugin's OptionSpec list and fills defaults
// before the factory runs; a Config made directly (Config::from_toml, in tests and embedders) has
// neither. OptionReader gives both the same behaviour: an absent key reads its declared default
// (parsed from the OptionSpec's TOML literal, so there is one source of truth), an absent required
// key and a string outside its declared choices are UsageErrors located in the recipe.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <ciuic/config.h>
#include <ciuic/error.h>
#include <ciuic/plugin.h>

namespace ciuic::data {

class OptionReader {
 public:
  template <size_t N>
  OptionReader(const Config& config, const OptionSpec (&specs)[N])
      : config_(config), specs_(specs), n_(N), defaults_(make_defaults(config, specs, N)) {}

  bool get_bool(std::string_view k) const { return src(k).get_bool(k); }
  int64_t get_int(std::string_view k) const { return src(k).get_int(k); }
  double get_float(std::string_view k) const { return src(k).get_float(k); }
  std::string get_string(std::string_view k) const {
    std::string v = src(k).get_string(k);
    const OptionSpec& s = spec(k);
    if (s.choices) {
      const std::string choices = s.choices;
      size_t b = 0;
      for (;;) {
        size_t e = choices.find('|', b);
        if (choices.substr(b, e == std::string::npos ? std::string::npos : e - b) == v) return v;
        if (e == std::string::npos) break;
        b = e + 1;
      }
      config_.fail(k, "expected one of " + choices);
    }
    return v;
  }
  std::vector<std::string> get_string_list(std::string_view k) const { return src(k).get_string_list(k); }
  const Config& config() const { return config_; }

 private:
  static Config make_defaults(const Config& c, const OptionSpec* specs, size_t n) {
    std::string toml;
    for (size_t i = 0; i < n; ++i)
      if (specs[i].default_value) toml += std::string(specs[i].key) + " = " + specs[i].default_value + "\n";
    return Config::from_toml(c.section(), toml, "<default>");
  }
  const OptionSpec& spec(std::string_view k) const {
    for (size_t i = 0; i < n_; ++i)
      if (k == specs_[i].key) return specs_[i];
    throw Error("internal error: option " + std::string(k) + " is not declared");
  }
  const Config& src(std::string_view k) const {
    if (config_.has(k)) return config_;
    if (!spec(k).default_value) config_.fail(k, "this option is required");
    return defaults_;
  }

  const Config& config_;
  const OptionSpec* specs_;
  size_t n_;
  Config defaults_;
};

}  // namespace ciuic::data
