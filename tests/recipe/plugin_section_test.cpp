// Plugin sections: validation against a plugin's declared options (hand-written OptionSpec lists
// here, and the real test plugins of tests/testplugins through a Registry).
#include <cmath>
#include <string>

#include <gtest/gtest.h>

#include <ciuic/error.h>

#include "recipe/recipe.h"
#include "registry/registry.h"

using ciuic::OptionSpec;
using ciuic::OptionType;
using ciuic::PluginInfo;
using ciuic::Recipe;
using ciuic::Slot;
using ciuic::UsageError;

namespace {

const OptionSpec kOptions[] = {
    {"bucket_size", OptionType::kInt, "200000000", "bucket bytes", 1, NAN},
    {"overlap", OptionType::kBool, "true", "overlap with backward"},
    {"reduce_dtype", OptionType::kString, "\"fp32\"", "reduction dtype", NAN, NAN, "fp32|bf16"},
    {"ratio", OptionType::kFloat, "0.5", "a fraction", 0, 1},
    {"stages", OptionType::kStringList, "[\"a\"]", "stage names"},
    {"weights", OptionType::kFloatList, "[1, 2]", "weights"},
    {"cache_dir", OptionType::kString, nullptr, "where (required)"},
};
const PluginInfo kInfo{
    ciuic::kPluginApiVersion, Slot::kSharding, "zz", "1", "a plugin", "fp", kOptions, 7};

const std::string kBase = "[train]\nmax_steps = 1\n[data]\nplugin = \"test\"\n";

std::string plugin_error(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    Recipe::parse(text, "r.toml", overrides).plugin_config(Slot::kSharding, kInfo);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(PluginSection, DefaultsAndLocations) {
  Recipe r =
      Recipe::parse(kBase + "[sharding]\nplugin = \"zz\"\ncache_dir = \"/tmp/c\"\nratio = 1\n",
                    "r.toml", {"sharding.overlap=false"});
  ciuic::Config c = r.plugin_config(Slot::kSharding, kInfo);
  EXPECT_EQ(c.section(), "sharding");
  EXPECT_FALSE(c.has("plugin"));
  EXPECT_EQ(c.get_int("bucket_size"), 200000000);
  EXPECT_EQ(c.location("bucket_size"), "<default>");
  EXPECT_FALSE(c.get_bool("overlap"));
  EXPECT_EQ(c.location("overlap"), "--set");
  EXPECT_EQ(c.get_string("reduce_dtype"), "fp32");
  EXPECT_DOUBLE_EQ(c.get_float("ratio"), 1.0);
  EXPECT_EQ(c.location("ratio"), "r.toml:8:9");
  EXPECT_EQ(c.get_string("cache_dir"), "/tmp/c");
  EXPECT_EQ(c.location("cache_dir"), "r.toml:7:13");
  EXPECT_EQ(c.get_string_list("stages"), std::vector<std::string>{"a"});
  EXPECT_EQ(c.get_float_list("weights"), (std::vector<double>{1.0, 2.0}));
  EXPECT_EQ(c.keys().size(), 7u);
}

TEST(PluginSection, EveryKindOfErrorAtOnce) {
  const std::string text = kBase +
                           "[sharding]\n"               // 5
                           "plugin = \"zz\"\n"          // 6
                           "bucket_sise = 5\n"          // 7
                           "overlap = 1\n"              // 8
                           "reduce_dtype = \"fp16\"\n"  // 9
                           "ratio = 2\n"                // 10
                           "stages = \"a\"\n"           // 11
                           "weights = [1, \"x\"]\n"     // 12
                           "lr = 1\n";                  // 13
  EXPECT_EQ(
      plugin_error(text),
      "recipe r.toml has 8 errors:\n"
      "r.toml:7:1: unknown key 'bucket_sise' in [sharding] (plugin zz); did you mean "
      "'bucket_size'?\n"
      "r.toml:13:1: unknown key 'lr' in [sharding] (plugin zz); did you mean section [optimizer]?\n"
      "r.toml:8:11: [sharding] (plugin zz) overlap: expected a boolean (true or false), found an "
      "integer (1)\n"
      "r.toml:9:16: [sharding] (plugin zz) reduce_dtype: \"fp16\" is not allowed: expected one of "
      "\"fp32\", "
      "\"bf16\"\n"
      "r.toml:10:9: [sharding] (plugin zz) ratio: 2 is out of range: expected a number in [0, 1]\n"
      "r.toml:11:10: [sharding] (plugin zz) stages: expected a list of strings, found a string "
      "(\"a\")\n"
      "r.toml:12:11: [sharding] (plugin zz) weights: expected a list of numbers, found an array "
      "([1, \"x\"])\n"
      "r.toml:5:2: [sharding] (plugin zz) missing required key 'cache_dir' (a string: where "
      "(required))");
}

TEST(PluginSection, ValidateAgainstRealPlugins) {
  const ciuic::Registry reg = ciuic::Registry::from_paths({CIUIC_TEST_PLUGINS + "/good"});
  ASSERT_EQ(reg.list().size(), 5u);
  const std::string all_test =
      "[train]\nmax_steps = 1\n"
      "[comm]\nplugin = \"test\"\n[sharding]\nplugin = \"test\"\n[optimizer]\nplugin = \"test\"\n"
      "[precision]\nplugin = \"test\"\n";
  // Good: everything chosen exists, options valid.
  Recipe ok =
      Recipe::parse(all_test + "[data]\nplugin = \"test\"\npath = \"p\"\nbuffer = 8\n", "r.toml");
  EXPECT_NO_THROW(ok.validate_plugins(reg));
  ciuic::Config data = ok.plugin_config(Slot::kData, *reg.get(Slot::kData, "test").info);
  EXPECT_EQ(data.get_int("buffer"), 8);
  EXPECT_EQ(data.get_string("mode"), "fast");
  EXPECT_EQ(data.location("mode"), "<default>");
  // The resolved recipe now shows the plugin's defaults too.
  const std::string text = ok.resolved_toml(reg);
  EXPECT_NE(text.find("mode = \"fast\""), std::string::npos) << text;
  EXPECT_NE(text.find("fail_on_create = false"), std::string::npos) << text;

  // Bad: errors of several slots in one report; an unknown plugin lists the available ones; a
  // key of another plugin's section is pointed there.
  Recipe bad = Recipe::parse(
      "[train]\nmax_steps = 1\n"                                 // 1-2
      "[comm]\nplugin = \"test\"\nbuffer = 3\n"                  // 3-5
      "[precision]\nplugin = \"tset\"\n"                         // 6-7
      "[data]\nplugin = \"test\"\nbufer = 3\nmode = \"slw\"\n",  // 8-11
      "r.toml");
  try {
    bad.validate_plugins(reg);
    FAIL() << "no error";
  } catch (const UsageError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("recipe r.toml has 7 errors:\n"), std::string::npos) << m;
    EXPECT_NE(m.find("r.toml: [sharding] default plugin: unknown sharding plugin 'ddp'"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("r.toml: [optimizer] default plugin: unknown optimizer plugin 'adamw'"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("r.toml:5:1: unknown key 'buffer' in [comm] (plugin test); did you mean "
                     "section [data]?"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("r.toml:7:10: unknown precision plugin 'tset'; did you mean 'test'?; "
                     "available precision "
                     "plugins: test"),
              std::string::npos)
        << m;
    EXPECT_NE(
        m.find("r.toml:10:1: unknown key 'bufer' in [data] (plugin test); did you mean 'buffer'?"),
        std::string::npos)
        << m;
    EXPECT_NE(m.find("r.toml:11:8: [data] (plugin test) mode: \"slw\" is not allowed: expected one "
                     "of \"fast\", "
                     "\"slow\"; did you mean \"slow\"?"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("r.toml:8:2: [data] (plugin test) missing required key 'path'"),
              std::string::npos)
        << m;
  }
  // The default sharding plugin (ddp) is not in this registry: the error says it was a default.
  Recipe dflt = Recipe::parse(
      "[train]\nmax_steps = 1\n[comm]\nplugin=\"test\"\n[precision]\nplugin = \"test\"\n"
      "[data]\nplugin = \"test\"\npath = \"p\"\n",
      "r.toml");
  try {
    dflt.validate_plugins(reg);
    FAIL() << "no error";
  } catch (const UsageError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("r.toml: [sharding] default plugin: unknown sharding plugin 'ddp'; "
                     "available sharding plugins: test (searched: "),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("r.toml: [optimizer] default plugin: unknown optimizer plugin 'adamw'; "
                     "available optimizer plugins: test (searched: "),
              std::string::npos)
        << m;
  }
  // [optimizer] holds the core's keys (lr, weight_decay) beside the plugin's options: neither is
  // an unknown key of the other, and the plugin's schema does not see lr.
  Recipe opt = Recipe::parse(all_test + "[data]\nplugin = \"test\"\npath = \"p\"\n", "r.toml",
                             {"optimizer.lr=0.5", "optimizer.weight_decay=0.1"});
  EXPECT_NO_THROW(opt.validate_plugins(reg));
  EXPECT_EQ(opt.section("optimizer").get_float("lr"), 0.5);
  EXPECT_EQ(opt.section("optimizer").get_float("weight_decay"), 0.1);
  EXPECT_EQ(
      opt.plugin_config(Slot::kOptimizer, *reg.get(Slot::kOptimizer, "test").info).keys().size(),
      0u);
  // A key neither the core nor the plugin knows is reported against the plugin's schema.
  Recipe typo = Recipe::parse(all_test + "[data]\nplugin = \"test\"\npath = \"p\"\n", "r.toml",
                              {"optimizer.lrr=0.5"});
  try {
    typo.validate_plugins(reg);
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()),
              "--set optimizer.lrr=0.5: unknown key 'lrr' in [optimizer] (plugin test) (it takes "
              "no options)");
  }
}

// Spellings of earlier versions are rewritten, with a warning that says what to write.
TEST(PluginSection, DeprecatedOffloadAndOptimizerType) {
  Recipe r = Recipe::parse(
      "[train]\nmax_steps = 1\n[data]\nplugin = \"x\"\n"
      "[optimizer]\nlr = 0.01\n[offload]\nplugin = \"cpu_adam\"\nthreads = 3\n",
      "r.toml");
  EXPECT_EQ(r.plugin_name(Slot::kOptimizer), "cpu_adam");
  EXPECT_EQ(r.plugin_location(Slot::kOptimizer), "r.toml:8:10");
  EXPECT_EQ(r.section("optimizer").get_float("lr"), 0.01);
  ASSERT_EQ(r.warnings().size(), 1u);
  EXPECT_EQ(r.warnings()[0],
            "r.toml:7:1: [offload] is deprecated: write [optimizer] plugin = \"cpu_adam\" "
            "(with the same options) instead");
  Recipe t = Recipe::parse(
      "[train]\nmax_steps = 1\n[data]\nplugin = \"x\"\n[optimizer]\ntype = \"adamw\"\n", "r.toml");
  EXPECT_EQ(t.plugin_name(Slot::kOptimizer), "adamw");
  ASSERT_EQ(t.warnings().size(), 1u);
  EXPECT_EQ(
      t.warnings()[0],
      "r.toml:6:8: [optimizer] type is deprecated: write [optimizer] plugin = \"adamw\" instead");
  // Both spellings at once are a mistake, not a guess.
  try {
    Recipe::parse(
        "[train]\nmax_steps = 1\n[data]\nplugin = \"x\"\n[optimizer]\nplugin = \"adamw\"\n"
        "[offload]\nplugin = \"cpu_adam\"\n",
        "r.toml");
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("[offload] and [optimizer] both choose a plugin"),
              std::string::npos)
        << e.what();
  }
}
