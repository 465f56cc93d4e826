// tests/fuzz/recipe_fuzz.cpp — the recipe parser: TOML, includes, the core schema, --set overrides,
// plugin sections, the resolved recipe.
//
// Input: recipe text, then optionally "\n%%\n" and --set overrides, one per line (at most 8).
// Checks: only ciuic::Error escapes (with a short, valid UTF-8 message); every core section of an
// accepted recipe reads back with its schema's types; plugin sections validate against a plugin
// declaring one option of each type; the resolved recipe (--print-recipe) loads back to the same
// resolved recipe.
#include <cmath>
#include <string>
#include <vector>

#include <ciuic/config.h>
#include <ciuic/plugin.h>

#include "fuzz_common.h"
#include "recipe/recipe.h"
#include "recipe/schema.h"

namespace {

using namespace ciuic;

const OptionSpec kOptions[] = {
    {"flag", OptionType::kBool, "false", "a boolean"},
    {"count", OptionType::kInt, "3", "an integer", 0, 1000},
    {"ratio", OptionType::kFloat, "0.5", "a float", 0, 1},
    {"mode", OptionType::kString, "\"a\"", "a choice", NAN, NAN, "a|b|c"},
    {"names", OptionType::kStringList, "[]", "strings"},
    {"values", OptionType::kFloatList, "[1.0]", "numbers"},
    {"needed", OptionType::kString, nullptr, "required"},
};

void read_all(const Config& c, const std::vector<recipe::KeySpec>& keys) {
  for (const auto& k : keys) {
    if (!c.has(k.key)) continue;
    switch (k.type) {
      case OptionType::kBool: c.get_bool(k.key); break;
      case OptionType::kInt: c.get_int(k.key); break;
      case OptionType::kFloat: c.get_float(k.key); break;
      case OptionType::kString: c.get_string(k.key); break;
      case OptionType::kStringList: c.get_string_list(k.key); break;
      case OptionType::kFloatList: c.get_float_list(k.key); break;
    }
    c.location(k.key);
  }
  c.to_toml();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ciuic;
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const auto parts = fuzz::split_once(in, "\n%%\n");
  const std::string_view text = parts.first;
  std::string_view sets = parts.second;
  std::vector<std::string> overrides;
  while (!sets.empty() && overrides.size() < 8) {
    const auto line = fuzz::split_once(sets, "\n");
    overrides.emplace_back(line.first);
    sets = line.second;
  }
  fuzz::expect_ok_or_error([&] {
    const Recipe r = Recipe::parse(text, "fuzz.toml", overrides);
    for (const auto& spec : recipe::core_schema()) {
      if (spec.plugin_slot) continue;
      read_all(r.section(spec.name), spec.keys);
    }
    std::vector<recipe::KeySpec> keys;
    for (const auto& o : kOptions) keys.push_back(recipe::key_from_option(o));
    for (int i = 0; i < kNumSlots; ++i) {
      const Slot slot = static_cast<Slot>(i);
      r.plugin_name(slot);
      r.plugin_location(slot);
      const PluginInfo info{
          kPluginApiVersion, slot, "fuzz",   "1",
          "fuzz plugin",     "",   kOptions, static_cast<uint32_t>(std::size(kOptions))};
      fuzz::expect_ok_or_error([&] { read_all(r.plugin_config(slot, info), keys); });
    }
    // --print-recipe's text loads back as the same recipe.
    const std::string resolved = r.resolved_toml();
    std::string again;
    try {
      again = Recipe::parse(resolved, "fuzz.toml").resolved_toml();
    } catch (const Error& e) {
      fuzz::fail("the resolved recipe does not load back",
                 std::string(e.what()) + "\n--- resolved:\n" + resolved);
    }
    // Locations differ (the reparse has no --set, and every value is written), values must not.
    auto values = [](const std::string& t) {
      std::string out;
      for (size_t pos = 0; pos < t.size();) {
        size_t nl = t.find('\n', pos);
        if (nl == std::string::npos) nl = t.size();
        std::string line = t.substr(pos, nl - pos);
        pos = nl + 1;
        if (line.rfind("#", 0) == 0) continue;
        const size_t c = line.find("  # ");
        if (c != std::string::npos) line = line.substr(0, c);
        while (!line.empty() && line.back() == ' ') line.pop_back();
        out += line + "\n";
      }
      return out;
    };
    fuzz::check(values(resolved) == values(again), "the resolved recipe changes when loaded back",
                resolved + "\n--- again:\n" + again);
  });
  return 0;
}
