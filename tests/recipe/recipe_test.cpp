// Recipe loading: defaults, strict validation with located messages, includes, overrides,
// printing. Expected values are written out by hand from the recipe texts below (line and column
// numbers counted in the text), never produced by the code under test.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include <ciuic/error.h>

#include "base/text.h"
#include "recipe/recipe.h"
#include "recipe/schema.h"
#include "support.h"

namespace fs = std::filesystem;
using ciuic::Recipe;
using ciuic::Slot;
using ciuic::UsageError;

namespace {

fs::path test_dir() { return ciuic_test::test_dir("recipe"); }
using ciuic_test::write_file;

// The UsageError message of parsing `text` (named r.toml) with `overrides`; "" if it loads.
std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    Recipe::parse(text, "r.toml", overrides);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

const std::string kMinimal = "[train]\nmax_steps = 10\n[data]\nplugin = \"test\"\n";

}  // namespace

TEST(Recipe, MinimalRecipeGetsEveryDefault) {
  Recipe r = Recipe::parse(kMinimal, "r.toml");
  EXPECT_EQ(r.section("train").get_int("max_steps"), 10);
  EXPECT_EQ(r.section("train").location("max_steps"), "r.toml:2:13");
  EXPECT_EQ(r.section("train").get_int("seq_len"), 512);
  EXPECT_EQ(r.section("train").location("seq_len"), "<default>");
  EXPECT_EQ(r.section("run").get_string("name"), "run");
  EXPECT_EQ(r.section("run").get_string("output_dir"), "runs/run");
  EXPECT_EQ(r.section("run").get_int("seed"), 1234);
  EXPECT_TRUE(r.section("run").get_string_list("plugin_paths").empty());
  EXPECT_EQ(r.section("cluster").get_string("device"), "cpu");
  EXPECT_DOUBLE_EQ(r.section("cluster").get_float("timeout_s"), 600.0);
  EXPECT_DOUBLE_EQ(r.section("optimizer").get_float("lr"), 1e-4);
  EXPECT_DOUBLE_EQ(r.section("optimizer").get_float("weight_decay"), 0.0);
  EXPECT_DOUBLE_EQ(r.section("scheduler").get_float("warmup_max_lr"), -1.0);
  EXPECT_EQ(r.section("checkpoint").get_int("keep_last"), 3);
  EXPECT_EQ(r.section("log").get_string("metrics_file"), "metrics.jsonl");
  EXPECT_FALSE(r.section("model").get_bool("activation_checkpointing"));
  // [model.config] has no defaults: an absent key means "from config.json".
  EXPECT_TRUE(r.section("model.config").keys().empty());
  EXPECT_TRUE(r.has_section("train"));
  EXPECT_FALSE(r.has_section("optimizer"));
  EXPECT_EQ(r.path(), "");
  EXPECT_EQ(r.dir(), fs::current_path().string());
}

TEST(Recipe, CoreSchemaDefaultsAreValid) {
  for (const auto& s : ciuic::recipe::core_schema())
    for (const auto& k : s.keys)
      EXPECT_EQ(ciuic::recipe::check_default(k), "") << s.name << "." << k.key;
}

TEST(Recipe, PluginNamesAndDefaults) {
  Recipe r = Recipe::parse(kMinimal, "r.toml");
  EXPECT_EQ(r.plugin_name(Slot::kComm), "gloo");
  EXPECT_EQ(r.plugin_name(Slot::kSharding), "ddp");
  EXPECT_EQ(r.plugin_name(Slot::kPrecision), "fp32");
  EXPECT_EQ(r.plugin_name(Slot::kOptimizer), "adamw");
  EXPECT_EQ(r.plugin_name(Slot::kData), "test");
  EXPECT_EQ(r.plugin_location(Slot::kData), "r.toml:4:10");
  EXPECT_EQ(r.plugin_location(Slot::kComm), "<default>");
  Recipe cuda = Recipe::parse(
      kMinimal + "[cluster]\ndevice = \"cuda\"\n[sharding]\nplugin = \"zero2\"\n", "r.toml");
  EXPECT_EQ(cuda.plugin_name(Slot::kComm), "nccl");
  EXPECT_EQ(cuda.plugin_name(Slot::kSharding), "zero2");
}

TEST(Recipe, IntegerIsAcceptedWhereAFloatIsExpected) {
  Recipe r = Recipe::parse(kMinimal + "[optimizer]\nlr = 1\nweight_decay = 0\n", "r.toml");
  EXPECT_DOUBLE_EQ(r.section("optimizer").get_float("lr"), 1.0);
  EXPECT_DOUBLE_EQ(r.section("optimizer").get_float("weight_decay"), 0.0);
}

TEST(RecipeErrors, MalformedToml) {
  std::string e = error_of("[train]\nmax_steps = \n");
  EXPECT_NE(e.find("r.toml:2:"), std::string::npos) << e;
  EXPECT_NE(e.find("malformed TOML"), std::string::npos) << e;
  // The keys of a file that did not parse are unknown: no "missing required" noise.
  EXPECT_EQ(e.find("missing required"), std::string::npos) << e;
  e = error_of("[train]\nmax_steps = 1\nmax_steps = 2\n");
  EXPECT_NE(e.find("r.toml:3:"), std::string::npos) << e;
}

TEST(RecipeErrors, UnknownKeyWithDidYouMean) {
  std::string e = error_of("[train]\nmax_steps = 10\nseqlen = 5\n[data]\nplugin = \"test\"\n");
  EXPECT_EQ(e, "r.toml:3:1: unknown key 'seqlen' in [train]; did you mean 'seq_len'?");
}

TEST(RecipeErrors, MisplacedKeySuggestsItsSection) {
  std::string e = error_of("[train]\nmax_steps = 10\n  lr = 1e-4\n[data]\nplugin = \"test\"\n");
  EXPECT_EQ(e, "r.toml:3:3: unknown key 'lr' in [train]; did you mean section [optimizer]?");
  e = error_of("seq_len = 4\n" + kMinimal);
  EXPECT_EQ(e, "r.toml:1:1: key 'seq_len' is outside any section; did you mean section [train]?");
}

TEST(RecipeErrors, UnknownSection) {
  std::string e = error_of(kMinimal + "\n[trian]\nx = 1\n");
  EXPECT_EQ(e, "r.toml:6:2: unknown section [trian]; did you mean [train]?");
  e = error_of(kMinimal + "[model.conf]\nhidden_size = 1\n");
  EXPECT_EQ(e, "r.toml:5:8: unknown section [model.conf]");
}

// (recipe text, the one error it must produce)
using Case = std::pair<std::string, std::string>;

void expect_errors(const std::vector<Case>& cases) {
  for (const auto& [text, expected] : cases) EXPECT_EQ(error_of(text), expected) << text;
}

// [model] checkpoint_layers is an integer or "auto" (is_auto() tells them apart).
TEST(Recipe, IntegerKeyThatAlsoTakesAuto) {
  Recipe a = Recipe::parse(kMinimal + "[model]\ncheckpoint_layers = \"auto\"\n", "r.toml");
  EXPECT_TRUE(ciuic::is_auto(a.section("model"), "checkpoint_layers"));
  Recipe n = Recipe::parse(kMinimal + "[model]\ncheckpoint_layers = 12\n", "r.toml");
  EXPECT_FALSE(ciuic::is_auto(n.section("model"), "checkpoint_layers"));
  EXPECT_EQ(n.section("model").get_int("checkpoint_layers"), 12);
  EXPECT_FALSE(
      ciuic::is_auto(Recipe::parse(kMinimal, "r.toml").section("model"), "checkpoint_layers"));
  expect_errors({
      {kMinimal + "[model]\ncheckpoint_layers = \"Auto\"\n",
       "r.toml:6:21: [model] checkpoint_layers: expected an integer >= 0 or \"auto\", found a "
       "string (\"Auto\")"},
      {kMinimal + "[model]\ncheckpoint_layers = -2\n",
       "r.toml:6:21: [model] checkpoint_layers: -2 is out of range: expected an integer >= 0 or "
       "\"auto\""},
      {kMinimal + "[model]\ncheckpoint_layers = 1.5\n",
       "r.toml:6:21: [model] checkpoint_layers: expected an integer >= 0 or \"auto\", found a "
       "float (1.5)"},
      {"[train]\nmax_steps = 10\nglobal_batch_size = 16777217\n[data]\nplugin = \"test\"\n",
       "r.toml:3:21: [train] global_batch_size: 16777217 is out of range: expected an integer in "
       "[0, 16777216]"},
      // Other integer keys do not take it.
      {"[train]\nmax_steps = 10\nseq_len = \"auto\"\n[data]\nplugin = \"test\"\n",
       "r.toml:3:11: [train] seq_len: expected an integer >= 1, found a string (\"auto\")"},
  });
}

TEST(RecipeErrors, WrongTypes) {
  expect_errors({
      {"[train]\nmax_steps = 10.0\n[data]\nplugin = \"test\"\n",
       "r.toml:2:13: [train] max_steps: expected an integer >= 1, found a float (10.0)"},
      {kMinimal + "[optimizer]\nlr = \"1e-4\"\n",
       "r.toml:6:6: [optimizer] lr: expected a number >= 0, found a string (\"1e-4\"); write the "
       "value without quotes"},
      {kMinimal + "[run]\nname = 5\n",
       "r.toml:6:8: [run] name: expected a string, found an integer (5); strings are written in "
       "quotes"},
      {kMinimal + "[model]\nactivation_checkpointing = \"yes\"\n",
       "r.toml:6:28: [model] activation_checkpointing: expected a boolean (true or false), found a "
       "string (\"yes\")"},
      {kMinimal + "[run]\nplugin_paths = [\"a\", 1]\n",
       "r.toml:6:16: [run] plugin_paths: expected a list of strings, found an array ([\"a\", 1])"},
      {kMinimal + "[data]\n",
       "r.toml:5:1: malformed TOML: Error while parsing table header: cannot redefine existing "
       "table 'data'"},
  });
}

TEST(RecipeErrors, OutOfRangeAndChoices) {
  expect_errors({
      {"[train]\nmax_steps = 0\n[data]\nplugin = \"test\"\n",
       "r.toml:2:13: [train] max_steps: 0 is out of range: expected an integer >= 1"},
      {kMinimal + "[cluster]\ntimeout_s = 0\n",
       "r.toml:6:13: [cluster] timeout_s: 0 is out of range: expected a number in (0, 604800]"},
      {kMinimal + "[cluster]\ntimeout_s = 1e300\n",
       "r.toml:6:13: [cluster] timeout_s: 1e300 is out of range: expected a number in (0, 604800]"},
      {kMinimal + "[cluster]\ndevice = \"cdua\"\n",
       "r.toml:6:10: [cluster] device: \"cdua\" is not allowed: expected one of \"cpu\", \"cuda\"; "
       "did you mean \"cuda\"?"},
      {kMinimal + "[optimizer]\nlr = nan\n",
       "r.toml:6:6: [optimizer] lr: nan is out of range: expected a number >= 0"},
  });
}

TEST(RecipeErrors, MissingRequired) {
  EXPECT_EQ(
      error_of("[data]\nplugin = \"test\"\n"),
      "r.toml: [train] missing required key 'max_steps' (an integer >= 1: optimizer steps to run)");
  EXPECT_EQ(error_of("[train]\nmax_steps = 3\n[data]\npath = \"x\"\n"),
            "r.toml:3:2: [data] missing required key 'plugin' (a string: the data source plugin, "
            "e.g. plugin "
            "= \"synthetic\"; see ciuic-run --list-plugins)");
}

TEST(RecipeErrors, AllErrorsAtOnce) {
  const std::string text =
      "[train]\n"         // 1
      "max_steps = -1\n"  // 2
      "seqlen = 4\n"      // 3
      "[cluster]\n"       // 4
      "device = 1\n"      // 5
      "[optimzer]\n"      // 6
      "lr = 1\n";         // 7
  std::string e = error_of(text, {"log.every_steps=0"});
  EXPECT_EQ(
      e,
      "recipe r.toml has 6 errors:\n"
      "r.toml:6:2: unknown section [optimzer]; did you mean [optimizer]?\n"
      "r.toml:5:10: [cluster] device: expected one of \"cpu\", \"cuda\", found an integer (1); "
      "strings are "
      "written in quotes\n"
      "r.toml:3:1: unknown key 'seqlen' in [train]; did you mean 'seq_len'?\n"
      "r.toml:2:13: [train] max_steps: -1 is out of range: expected an integer >= 1\n"
      "r.toml: [data] missing required key 'plugin' (a string: the data source plugin, e.g. plugin "
      "= "
      "\"synthetic\"; see ciuic-run --list-plugins)\n"
      "--set log.every_steps=0: [log] every_steps: 0 is out of range: expected an integer >= 1");
}

TEST(RecipeIncludes, ComposeAndOverride) {
  fs::path d = test_dir();
  fs::create_directories(d / "base");
  write_file(
      d / "base" / "common.toml",
      "[train]\nseq_len = 128\nmax_steps = 5\n[optimizer]\nlr = 3e-4\nweight_decay = 0.25\n");
  write_file(d / "base" / "more.toml", "[optimizer]\nlr = 1e-3\n[run]\nname = \"more\"\n");
  write_file(d / "top.toml",
             "include = [\"base/common.toml\", \"base/more.toml\"]\n"
             "[train]\nmax_steps = 50\n[data]\nplugin = \"test\"\n");
  const std::string top = (d / "top.toml").string();
  Recipe r = Recipe::load(top);
  EXPECT_EQ(r.section("train").get_int("max_steps"), 50);  // the including file wins
  EXPECT_EQ(r.section("train").location("max_steps"), top + ":3:13");
  EXPECT_EQ(r.section("train").get_int("seq_len"), 128);  // from an include
  EXPECT_EQ(r.section("train").location("seq_len"),
            (d / "base" / "common.toml").string() + ":2:11");
  EXPECT_DOUBLE_EQ(r.section("optimizer").get_float("lr"), 1e-3);  // the later include wins
  EXPECT_EQ(r.section("optimizer").location("lr"), (d / "base" / "more.toml").string() + ":2:6");
  EXPECT_DOUBLE_EQ(r.section("optimizer").get_float("weight_decay"), 0.25);
  EXPECT_EQ(r.section("run").get_string("output_dir"), "runs/more");
  ASSERT_EQ(r.files().size(), 3u);
  EXPECT_EQ(r.files()[0], top);
  EXPECT_EQ(r.dir(), d.string());
  EXPECT_EQ(r.path(), top);
}

// A file that names another plugin for a slot than its include drops the include's options of
// that slot (they belong to the old plugin) and keeps the slot's core keys; naming the same plugin
// merges key by key as usual. (A benchmark variant includes the real recipe and switches [data] to
// synthetic tokens.)
TEST(RecipeIncludes, SwitchingAPluginDropsTheIncludedPluginsOptions) {
  fs::path d = test_dir();
  write_file(d / "real.toml",
             "[train]\nmax_steps = 5\n[optimizer]\nplugin = \"adamw\"\nlr = 3e-5\nfused = true\n"
             "[data]\nplugin = \"cached_ssd\"\nsources = [\"a.jsonl\"]\nformat = \"chat\"\n");
  write_file(d / "bench.toml",
             "include = [\"real.toml\"]\n[optimizer]\nplugin = \"cpu_adam\"\n[data]\nplugin = "
             "\"synthetic\"\nvocab_size = 64\n");
  write_file(d / "same.toml",
             "include = [\"real.toml\"]\n[data]\nplugin = \"cached_ssd\"\nformat = \"text\"\n");
  const Recipe bench = Recipe::load((d / "bench.toml").string());
  const std::string b = bench.resolved_toml();
  EXPECT_EQ(b.find("sources = "), std::string::npos) << b;
  EXPECT_EQ(b.find("format = "), std::string::npos) << b;
  EXPECT_EQ(b.find("fused = "), std::string::npos) << b;
  EXPECT_NE(b.find("vocab_size = 64"), std::string::npos) << b;
  EXPECT_DOUBLE_EQ(bench.section("optimizer").get_float("lr"),
                   3e-5);  // a core key of the slot stays
  EXPECT_EQ(bench.section("train").get_int("max_steps"), 5);
  const std::string same = Recipe::load((d / "same.toml").string()).resolved_toml();
  EXPECT_NE(same.find("a.jsonl"), std::string::npos) << same;
  EXPECT_NE(same.find("format = \"text\""), std::string::npos) << same;
}

TEST(RecipeIncludes, CycleIsAnErrorWithItsChain) {
  fs::path d = test_dir();
  write_file(d / "a.toml",
             "include = [\"b.toml\"]\n[train]\nmax_steps = 1\n[data]\nplugin = \"x\"\n");
  write_file(d / "b.toml",
             "[log]\nevery_steps = 2\ninclude = 3\n");  // a key 'include' inside [log]
  write_file(d / "c.toml", "include = [\"d.toml\"]\n");
  write_file(d / "d.toml", "include = [\"c.toml\"]\n");
  const std::string a = (d / "a.toml").string(), c = (d / "c.toml").string(),
                    dd = (d / "d.toml").string();
  try {
    Recipe::load(a);
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()).rfind((d / "b.toml").string() +
                                              ":3:1: unknown key 'include' in [log] (known keys: "
                                              "every_steps, metrics_file, progress",
                                          0),
              0u)
        << e.what();
  }
  try {
    Recipe::load(c);
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()), dd + ":1:12: include cycle: " + c + " -> " + dd + " -> " + c);
  }
}

// Issue 16 item 3: a FIFO or a device as the recipe or an include is refused at once (it used to
// block forever, or read /dev/zero until memory ran out). alarm() turns a regression into a
// failure instead of a hang.
TEST(RecipeIncludes, SpecialFilesAreRefusedWithoutBlocking) {
  ::alarm(20);
  fs::path d = test_dir();
  write_file(d / "a.toml",
             "include = [\"/dev/zero\"]\n[train]\nmax_steps = 1\n[data]\nplugin = \"x\"\n");
  try {
    Recipe::load((d / "a.toml").string());
    ADD_FAILURE() << "no error";
  } catch (const UsageError& e) {
    EXPECT_EQ(
        std::string(e.what()),
        (d / "a.toml").string() +
            ":1:12: cannot read included file /dev/zero: not a regular file (a character device)");
  }
  const std::string fifo = (d / "fifo.toml").string();
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  try {
    Recipe::load(fifo);
    ADD_FAILURE() << "no error";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()),
              "cannot read recipe " + fifo + ": not a regular file (a FIFO (named pipe))");
  }
  ::alarm(0);
}

TEST(RecipeIncludes, MissingIncludeAndMissingRecipe) {
  fs::path d = test_dir();
  write_file(d / "a.toml",
             "include = [\"nope.toml\"]\n[train]\nmax_steps = 1\n[data]\nplugin = \"x\"\n");
  try {
    Recipe::load((d / "a.toml").string());
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()), (d / "a.toml").string() + ":1:12: cannot read included file " +
                                         (d / "nope.toml").string() +
                                         ": No such file or directory");
  }
  try {
    Recipe::load((d / "missing.toml").string());
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()), "cannot read recipe " + (d / "missing.toml").string() +
                                         ": No such file or directory");
  }
  EXPECT_EQ(error_of("include = 3\n" + kMinimal),
            "r.toml:1:11: include: expected a list of recipe files (e.g. include = "
            "[\"base.toml\"]), found an "
            "integer (3)");
}

TEST(RecipeOverrides, TomlTypedValues) {
  Recipe r = Recipe::parse(kMinimal, "r.toml",
                           {"train.seq_len=128", "run.name=\"x y\"", "comm.plugin=gloo2",
                            "optimizer.weight_decay=0.05", "model.config.hidden_size=64",
                            "model.path=/models/m-7b", "train.seq_len=256", "optimizer.lr=5e-5"});
  EXPECT_EQ(r.section("train").get_int("seq_len"), 256);  // the last override wins
  EXPECT_EQ(r.section("train").location("seq_len"), "--set");
  EXPECT_EQ(r.section("run").get_string("name"), "x y");
  EXPECT_EQ(r.section("run").get_string("output_dir"), "runs/x y");
  EXPECT_EQ(r.plugin_name(Slot::kComm), "gloo2");  // bare word = string
  EXPECT_EQ(r.plugin_location(Slot::kComm), "--set");
  EXPECT_DOUBLE_EQ(r.section("optimizer").get_float("weight_decay"), 0.05);
  EXPECT_DOUBLE_EQ(r.section("optimizer").get_float("lr"), 5e-5);
  EXPECT_EQ(r.section("model.config").get_int("hidden_size"), 64);
  EXPECT_TRUE(r.has_section("model.config"));
  EXPECT_EQ(r.section("model").get_string("path"), "/models/m-7b");
  EXPECT_EQ(r.overrides().size(), 8u);
}

TEST(RecipeOverrides, Errors) {
  EXPECT_EQ(error_of(kMinimal, {"train.seq_len=abc"}),
            "--set train.seq_len=abc: [train] seq_len: expected an integer >= 1, found a string "
            "(\"abc\")");
  EXPECT_EQ(error_of(kMinimal, {"train.seqlen=5"}),
            "--set train.seqlen=5: unknown key 'seqlen' in [train]; did you mean 'seq_len'?");
  EXPECT_EQ(error_of(kMinimal, {"trian.seq_len=5"}),
            "--set trian.seq_len=5: unknown section [trian]; did you mean [train]?");
  EXPECT_EQ(
      error_of(kMinimal, {"seq_len=5"}),
      "--set seq_len=5: expected section.key=value, found key 'seq_len' without a section; did you "
      "mean train.seq_len?");
  EXPECT_EQ(error_of(kMinimal, {"train.seq_len"}),
            "--set train.seq_len: expected section.key=value");
  EXPECT_EQ(error_of(kMinimal, {"train.seq_len="}),
            "--set train.seq_len=: empty value (write '\"\"' for an empty string)");
  EXPECT_EQ(error_of(kMinimal, {"run.name=\"unterminated"}),
            "--set run.name=\"unterminated: the value is not a TOML value (strings need quotes: "
            "'\"text\"')");
  EXPECT_EQ(
      error_of(kMinimal, {"train.seq_len=1.5"}),
      "--set train.seq_len=1.5: [train] seq_len: expected an integer >= 1, found a float (1.5)");
}

TEST(RecipePrint, ResolvedRecipeLoadsBackToTheSameValues) {
  Recipe r = Recipe::parse(kMinimal +
                               "[model.config]\nhidden_size = 64\nrope_theta = "
                               "1e4\n[sharding]\nplugin = \"zero2\"\nbucket = 2e8\n",
                           "r.toml", {"optimizer.weight_decay=0.05", "run.name=\"q\""});
  const std::string text = r.resolved_toml();
  EXPECT_NE(text.find("max_steps = 10"), std::string::npos) << text;
  EXPECT_NE(text.find("# r.toml:2:13"), std::string::npos) << text;
  EXPECT_NE(text.find("weight_decay = 0.05"), std::string::npos) << text;
  EXPECT_NE(text.find("# --set"), std::string::npos) << text;
  EXPECT_NE(text.find("lr = 1e-4"), std::string::npos) << text;
  EXPECT_NE(text.find("bucket = 2e8"), std::string::npos) << text;
  EXPECT_NE(text.find("plugin = \"gloo\""), std::string::npos) << text;
  Recipe back = Recipe::parse(text, "resolved.toml");
  for (const auto& spec : ciuic::recipe::core_schema()) {
    if (spec.plugin_slot) continue;
    ciuic::Config a = r.section(spec.name), b = back.section(spec.name);
    EXPECT_EQ(a.keys(), b.keys()) << spec.name;
    for (const auto& k : a.keys())
      EXPECT_EQ(ciuic::format_value(*a.impl().table.get(k)),
                ciuic::format_value(*b.impl().table.get(k)))
          << spec.name << "." << k;
  }
  for (Slot s : {Slot::kComm, Slot::kSharding, Slot::kOptimizer, Slot::kPrecision, Slot::kData})
    EXPECT_EQ(r.plugin_name(s), back.plugin_name(s));
}

TEST(RecipeConfig, FailNamesTheKeyAndLocation) {
  Recipe r = Recipe::parse(kMinimal, "r.toml");
  try {
    r.section("train").fail("max_steps", "must be even");
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()), "r.toml:2:13: [train] max_steps = 10: must be even");
  }
  EXPECT_THROW(r.section("sharding"), ciuic::Error);
  EXPECT_THROW(r.section("nope"), ciuic::Error);
}

// docs/recipe.md lists every core key in its section's table.
TEST(RecipeDocs, ReferenceListsEveryCoreKey) {
  const std::string doc = ciuic_test::slurp(CIUIC_SOURCE_DIR + "/docs/recipe.md");
  ASSERT_FALSE(doc.empty());
  for (const auto& s : ciuic::recipe::core_schema()) {
    if (s.plugin_slot && s.keys.size() == 1) continue;  // `plugin` alone: the plugin sections table
    const size_t begin = doc.find("### `[" + s.name + "]`");
    ASSERT_NE(begin, std::string::npos) << "no heading for [" << s.name << "]";
    const size_t end = doc.find("\n### ", begin + 1);
    const std::string part =
        doc.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
    for (const auto& k : s.keys)
      if (k.key != "plugin" || !s.plugin_slot)
        EXPECT_NE(part.find("| `" + k.key + "` | " + ciuic::recipe::describe_expected(k) + " |"),
                  std::string::npos)
            << "docs/recipe.md lacks [" << s.name << "] " << k.key << " ("
            << ciuic::recipe::describe_expected(k) << ")";
  }
}

// Every committed recipe passes the core schema (plugin options are checked by --dry-run tests).
TEST(RecipeConfigs, CommittedRecipesLoad) {
  int n = 0;
  for (const auto& e :
       fs::recursive_directory_iterator(CIUIC_SOURCE_DIR + "/configs")) {  // with configs/bench/
    if (e.path().extension() != ".toml") continue;
    try {
      Recipe::load(e.path().string());
    } catch (const ciuic::Error& err) {
      ADD_FAILURE() << err.what();
    }
    ++n;
  }
  EXPECT_GT(n, 0);
}

// Known distances (Levenshtein's textbook examples; OSA counts one adjacent swap as one edit).
TEST(RecipeText, EditDistanceAndClosest) {
  using ciuic::text::closest;
  using ciuic::text::edit_distance;
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(edit_distance("flaw", "lawn"), 2u);
  EXPECT_EQ(edit_distance("seq_len", "seqlen"), 1u);
  EXPECT_EQ(edit_distance("trian", "train"), 1u);
  EXPECT_EQ(edit_distance("", "abc"), 3u);
  EXPECT_EQ(closest("micro_batch", {"micro_batch_size", "seq_len"}), "");  // 5 edits: too far
  EXPECT_EQ(closest("SEQ_LEN", {"seq_len", "max_steps"}), "seq_len");      // case only
  EXPECT_EQ(closest("lr", {"eps", "lr_min"}), "");
  EXPECT_EQ(closest("warmup_num_step", {"warmup_min_lr", "warmup_num_steps"}), "warmup_num_steps");
}
