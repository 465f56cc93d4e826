// ciuic-run as a subprocess: exit codes, error messages, listings, --print-recipe, --dry-run.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <ciuic/plugin.h>
#include <ciuic/version.h>

#include "../support/deep_json.h"
#include "recipe/recipe.h"
#include "support.h"

namespace fs = std::filesystem;

namespace {

const std::string kExe = CIUIC_BIN_DIR + "/ciuic-run";
const std::string kGood = CIUIC_TEST_PLUGINS + "/good";

using ciuic_test::has;
using ciuic_test::Result;

fs::path test_dir() { return ciuic_test::test_dir("cli"); }

// Runs `ciuic-run <args>` (args are passed through the shell as written).
Result run(const std::string& args) {
  return ciuic_test::run_command(kExe + " " + args, fs::path(CIUIC_TEST_TMP) / "cli" / "io");
}

std::string write_recipe(const fs::path& dir, const std::string& text) {
  const fs::path p = dir / "recipe.toml";
  std::ofstream(p) << text;
  return p.string();
}

const std::string kAllTest =
    "[run]\nname = \"cli\"\n[train]\nmax_steps = 2\n"
    "[comm]\nplugin = \"test\"\n[sharding]\nplugin = \"test\"\n[optimizer]\nplugin = \"test\"\n"
    "[precision]\nplugin = \"test\"\n[data]\nplugin = \"test\"\npath = \"data.jsonl\"\n";

}  // namespace

TEST(Cli, HelpExplainsOptionsExitCodesAndDocs) {
  Result r = run("--help");
  EXPECT_EQ(r.code, 0) << r.err;
  for (const char* s : {"--set",
                        "--plugin-path",
                        "--nproc",
                        "--nnodes",
                        "--node-rank",
                        "--master-addr",
                        "--master-port",
                        "--output-all-ranks",
                        "--resume",
                        "--overwrite",
                        "replaced-<date-time>",
                        "--dry-run",
                        "--print-recipe",
                        "--list-plugins",
                        "--verbose",
                        "--version",
                        "[train]",
                        "[model.config]",
                        "Exit codes",
                        "130",
                        "docs/recipe.md",
                        "docs/plugins.md"})
    EXPECT_TRUE(has(r.out, s)) << s << "\n" << r.out;
  r = run("--help-recipe");
  EXPECT_EQ(r.code, 0);
  EXPECT_TRUE(has(r.out, "max_steps = (required)")) << r.out;
}

TEST(Cli, Version) {
  Result r = run("--version");
  EXPECT_EQ(r.code, 0);
  EXPECT_TRUE(has(r.out, "ciuic-run (ciuic) " CIUIC_VERSION "\n")) << r.out;
  EXPECT_TRUE(has(r.out, "LibTorch " TORCH_VERSION "\n")) << r.out;
  EXPECT_TRUE(has(r.out, std::string("build fingerprint: ") + ciuic::core_build_fingerprint()))
      << r.out;
}

TEST(Cli, MisspelledKeyExitsTwoWithLocationAndSuggestion) {
  const std::string recipe =
      write_recipe(test_dir(), "[train]\nmax_steps = 2\nseqlen = 64\n[data]\nplugin = \"test\"\n");
  Result r = run(recipe);
  EXPECT_EQ(r.code, 2);
  // The plugin choice that cannot be resolved (no test plugins on the path) is in the same report.
  EXPECT_TRUE(has(r.err, "ciuic-run: error: recipe " + recipe + " has 2 errors:\n" + recipe +
                             ":3:1: unknown key 'seqlen' in [train]; did you mean 'seq_len'?\n" +
                             recipe + ":5:10: unknown data plugin 'test'"))
      << r.err;
  EXPECT_EQ(r.out, "");
}

TEST(Cli, UsageErrorsExitTwo) {
  Result r = run("--no-such-option");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "ciuic-run: error: unrecognised option '--no-such-option'")) << r.err;
  r = run("");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "no recipe given")) << r.err;
  r = run("/nonexistent/recipe.toml");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(
      r.err,
      "ciuic-run: error: cannot read recipe /nonexistent/recipe.toml: No such file or directory\n");
  r = run("x.toml --nproc 0");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "--nproc must be >= 1")) << r.err;
}

TEST(Cli, ListPluginsListsEveryPluginOfTheBuild) {
  Result r = run("--list-plugins");
  EXPECT_EQ(r.code, 0) << r.err;
  // Every libciuic_<slot>_<name>.so of the build's plugin folder has its line.
  int n = 0;
  if (fs::exists(CIUIC_PLUGIN_DIR)) {
    for (const auto& e : fs::directory_iterator(CIUIC_PLUGIN_DIR)) {
      std::string f = e.path().filename().string();
      if (f.rfind("libciuic_", 0) != 0 || f.size() < 12 || f.substr(f.size() - 3) != ".so")
        continue;
      std::string rest = f.substr(9, f.size() - 12);
      size_t us = rest.find('_');
      std::string slot = rest.substr(0, us), name = rest.substr(us + 1);
      std::istringstream lines(r.out);
      bool found = false;
      for (std::string line; std::getline(lines, line);) {
        std::istringstream words(line);
        std::string w1, w2, w3, w4;
        words >> w1 >> w2 >> w3 >> w4;
        if (w1 == slot && w2 == name && !w3.empty() && fs::equivalent(w4, e.path())) found = true;
      }
      EXPECT_TRUE(found) << f << " not listed:\n" << r.out << r.err;
      ++n;
    }
  }
  std::cout << "plugins in the build folder: " << n << "\n";
  // The test plugins are not in the real folder; with --plugin-path they are listed too.
  EXPECT_FALSE(has(r.out, kGood));
  r = run("--list-plugins --plugin-path " + kGood);
  EXPECT_EQ(r.code, 0);
  for (const char* slot : {"comm", "sharding", "optimizer", "precision"})
    EXPECT_TRUE(has(r.out, kGood + "/libciuic_" + slot + "_test.so\n")) << r.out;
  EXPECT_TRUE(has(r.out, "0.2.0")) << r.out;
}

TEST(Cli, ListPluginsVerboseIsTheOptionsReference) {
  Result r = run("--list-plugins --verbose --plugin-path " + kGood + " --plugin-path " +
                 CIUIC_TEST_PLUGINS + "/bad");
  EXPECT_EQ(r.code, 0);
  EXPECT_TRUE(has(r.out, "    data source for tests\n")) << r.out;
  EXPECT_TRUE(has(r.out, "buffer = 4")) << r.out;
  EXPECT_TRUE(has(r.out, "an integer in [1, 64]")) << r.out;
  EXPECT_TRUE(has(r.out, "prefetch depth")) << r.out;
  EXPECT_TRUE(has(r.out, "path = (required)")) << r.out;
  EXPECT_TRUE(has(r.out, "one of \"fast\", \"slow\"")) << r.out;
  EXPECT_TRUE(has(r.out, "search path")) << r.out;
  // Refusals are warnings on stderr, not failures.
  EXPECT_TRUE(has(r.err, "ciuic-run: warning: refused " + CIUIC_TEST_PLUGINS +
                             "/bad/libciuic_data_oldapi.so: plugin API "
                             "version mismatch"))
      << r.err;
  // A library exporting plain functions as entry points is refused, not called through (it used
  // to crash every command with SIGSEGV).
  EXPECT_TRUE(has(r.err, "ciuic-run: warning: refused " + CIUIC_TEST_PLUGINS +
                             "/bad/libciuic_data_plainfn.so: not a "
                             "ciuic plugin: entry symbol 'ciuic_plugin_info' is a function of "))
      << r.err;
}

TEST(Cli, PrintRecipeShowsTheResolvedRecipe) {
  const fs::path d = test_dir();
  const std::string recipe = write_recipe(d, kAllTest);
  Result r =
      run(recipe + " --plugin-path " + kGood + " --print-recipe --set train.seq_len=64 --nproc 1");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "seq_len = 64")) << r.out;
  EXPECT_TRUE(has(r.out, "nproc_per_node = 1")) << r.out;
  EXPECT_TRUE(has(r.out, "buffer = 4")) << r.out;  // the plugin's default
  EXPECT_TRUE(has(r.out, "# " + recipe + ":4:13")) << r.out;
  // What it prints is a recipe that loads back.
  std::ofstream(d / "printed.toml") << r.out;
  ciuic::Recipe back = ciuic::Recipe::load((d / "printed.toml").string());
  EXPECT_EQ(back.section("train").get_int("seq_len"), 64);
  EXPECT_EQ(back.section("run").get_string("output_dir"), "runs/cli");
}

TEST(Cli, DryRunCreatesEveryPlugin) {
  const std::string recipe = write_recipe(test_dir(), kAllTest);
  Result r = run(recipe + " --plugin-path " + kGood + " --dry-run");
  EXPECT_EQ(r.code, 0) << r.err;
  for (const char* slot : {"comm", "sharding", "optimizer", "precision", "data"})
    EXPECT_TRUE(has(r.out, kGood + "/libciuic_" + slot + "_test.so")) << r.out;
  EXPECT_TRUE(has(r.out, "the recipe, its plugins and its inputs are valid")) << r.out;
  EXPECT_TRUE(has(r.out, "  data       opened as rank 0 of 1\n")) << r.out;
  // [run] plugin_paths, relative to the recipe's folder, instead of --plugin-path.
  const fs::path dir = fs::path(recipe).parent_path();
  const std::string rel = fs::relative(kGood, dir).string();
  ciuic_test::write_file(dir / "paths.toml",
                         "include = [\"recipe.toml\"]\n[run]\nplugin_paths = [\"" + rel + "\"]\n");
  r = run((dir / "paths.toml").string() + " --dry-run");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, kGood + "/libciuic_data_test.so")) << r.out;
  // The deprecated [offload] section still chooses the optimizer, with a warning.
  r = run(recipe + " --plugin-path " + kGood +
          " --dry-run --set 'offload.plugin=\"test\"' --set 'optimizer.plugin=\"test\"'");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "[offload] and [optimizer] both choose a plugin")) << r.err;
}

// Every model family's folder (tests/fixtures/gen_model_families.py) passes the preflight with
// transformers' parameter count; a config.json asking for what a family does not implement is
// refused naming the file, the key and what is expected, exit code 1 (issue 30 item 6).
TEST(Cli, DryRunReadsEveryModelFamily) {
  const fs::path dir = test_dir();
  const std::string recipe = write_recipe(dir, kAllTest);
  const std::string base = recipe + " --plugin-path " + kGood + " --dry-run --set model.path=";
  const std::string fam = CIUIC_SOURCE_DIR + "/tests/fixtures/model/families/";
  for (const auto& [name, count] :
       std::vector<std::pair<std::string, std::string>>{{"mistral", "23712"},
                                                        {"qwen2", "19744"},
                                                        {"qwen3", "26832"},
                                                        {"gemma3", "27600"},
                                                        {"llama_pad", "23712"}}) {
    Result r = run(base + fam + name);
    EXPECT_EQ(r.code, 0) << name << ": " << r.err;
    EXPECT_TRUE(has(r.out, ", " + count + " parameters\n")) << name << ": " << r.out;
  }
  const fs::path bad = dir / "gemma-softcap";
  fs::create_directories(bad);
  std::ofstream(bad / "config.json")
      << R"({"model_type": "gemma3_text", "final_logit_softcapping": 30.0})";
  Result r = run(base + bad.string());
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_TRUE(has(r.err, (bad / "config.json").string() +
                             ": key `final_logit_softcapping`: logit soft-capping is "
                             "not supported (expected null, found 30.0)"))
      << r.err;
  std::ofstream(bad / "config.json") << R"({"model_type": "falcon"})";
  r = run(base + bad.string());
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_TRUE(
      has(r.err,
          "model type \"falcon\" is not supported (supported: \"llama\", \"mistral\", \"qwen2\", "
          "\"qwen3\", \"gemma3_text\")"))
      << r.err;
}

// --dry-run is a preflight (issue 16 item 7): besides creating every plugin it reads the model's
// config and checks its weights exist, loads the tokenizer and the chat template, opens the data
// plugin as rank 0 and checks the checkpoint to resume; each of these, which a run would meet
// only after starting its workers, fails the dry run with the run's own message.
TEST(Cli, DryRunOpensEveryInput) {
  const std::string recipe = write_recipe(test_dir(), kAllTest);
  const std::string base = recipe + " --plugin-path " + kGood + " --dry-run";
  Result r = run(base + " --set data.path=open-boom");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "plugin data/test (" + kGood +
                             "/libciuic_data_test.so): open-boom: cannot read this input"))
      << r.err;
  r = run(base + " --set model.path=/nonexistent/model");
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(has(r.err, "/nonexistent/model/config.json")) << r.err;
  const std::string tok = CIUIC_SOURCE_DIR + "/examples/demo/tokenizer.json";
  r = run(base + " --set model.tokenizer=" + tok + " --set model.chat_template=nosuch");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "nosuch")) << r.err;
  r = run(base + " --set model.tokenizer=" + tok);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "  tokenizer  " + tok + ", ")) << r.out;
  EXPECT_TRUE(has(r.out, " tokens, chat template plain\n")) << r.out;
  r = run(base + " --set model.config.eos_token_id=999999");
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(has(r.err, "outside the vocabulary")) << r.err;
  r = run(base + " --set model.config.vocab_size=300 --set model.tokenizer=" + tok);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "tokens but the model's vocab_size is 300")) << r.err;
  r = run(base + " --resume /nonexistent/ckpt");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "/nonexistent/ckpt")) << r.err;
  r = run(base + " --resume auto");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "  resume     auto: no checkpoint yet, a fresh start\n")) << r.out;
}

// A recipe that says how its inputs are made ([run] setup) has it shown with a missing input:
// configs/tiny-cpu.toml run before `make demo` made its data (issue 17 item 8).
TEST(Cli, MissingInputShowsTheRecipesSetup) {
  const std::string tiny = CIUIC_SOURCE_DIR + "/configs/tiny-cpu.toml";
  Result r = run(tiny + " --dry-run --set 'data.sources=[\"/nonexistent/train.jsonl\"]'");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "no such file: /nonexistent/train.jsonl\n")) << r.err;
  EXPECT_TRUE(has(r.err,
                  "hint: this recipe's inputs are made by: python3 examples/demo/gen_demo_data.py "
                  "runs/demo-data (make demo runs it first) ([run] setup)\n"))
      << r.err;
  // Other errors of the data plugin do not get it; nor does a recipe without [run] setup.
  r = run(tiny +
          " --dry-run --set 'data.sources=[\"/nonexistent/train.jsonl\"]' --set 'run.setup=\"\"'");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_FALSE(has(r.err, "hint:")) << r.err;
  r = run(tiny + " --dry-run --set 'data.sources=[\"/tmp\"]'");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "/tmp is not a regular file")) << r.err;
  EXPECT_FALSE(has(r.err, "hint:")) << r.err;
}

// --plan names an unknown plugin where the recipe chose it, like a run does (issue 16 item 7).
TEST(Cli, PlanRefusesAnUnknownPluginWithItsLocation) {
  const std::string recipe = write_recipe(test_dir(), kAllTest);
  Result r = run(recipe + " --plugin-path " + kGood + " --plan --set comm.plugin=nosuch");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "ciuic-run: error: --set: unknown comm plugin 'nosuch'")) << r.err;
  const std::string dir = test_dir();
  std::string text = kAllTest;
  const std::string chosen = "[comm]\nplugin = \"test\"";
  text.replace(text.find(chosen), chosen.size(), "[comm]\nplugin = \"nosuch\"");
  r = run(write_recipe(dir, text) + " --plugin-path " + kGood + " --plan");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "recipe.toml:6:10: unknown comm plugin 'nosuch'")) << r.err;
}

// Core and plugin sections' problems are reported together, in one pass (issue 16 item 7).
TEST(Cli, CoreAndPluginProblemsInOneReport) {
  std::string text = kAllTest;
  text.replace(text.find("max_steps = 2"), 13, "max_stepz = 2");
  text += "bogus = 1\n";  // in [data] (plugin test)
  const Result r = run(write_recipe(test_dir(), text) + " --plugin-path " + kGood + " --dry-run");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "has 3 errors:")) << r.err;
  EXPECT_TRUE(has(r.err, "unknown key 'max_stepz' in [train]; did you mean 'max_steps'?")) << r.err;
  EXPECT_TRUE(has(r.err, "missing required key 'max_steps'")) << r.err;
  EXPECT_TRUE(has(r.err, "unknown key 'bogus' in [data] (plugin test)")) << r.err;
}

TEST(Cli, PluginErrorsExitTwo) {
  const std::string recipe = write_recipe(test_dir(), kAllTest);
  // The factory refuses its options.
  Result r = run(recipe + " --plugin-path " + kGood + " --dry-run --set comm.fail_on_create=true");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err,
            "ciuic-run: error: plugin comm/test (" + kGood +
                "/libciuic_comm_test.so): --set: [comm] fail_on_create = true: asked to fail\n");
  // Options checked against the plugin's schema, all slots at once.
  r = run(recipe + " --plugin-path " + kGood + " --set data.buffer=0 --set precision.plugin=fp99");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "ciuic-run: error: recipe " + recipe + " has 2 errors:\n")) << r.err;
  EXPECT_TRUE(has(r.err, "--set precision.plugin=fp99: unknown precision plugin 'fp99'")) << r.err;
  // The list holds the build's precision plugins and the test one.
  const size_t list = r.err.find("available precision plugins: ");
  EXPECT_NE(list, std::string::npos) << r.err;
  EXPECT_NE(r.err.find("test (searched: ", list), std::string::npos) << r.err;
  EXPECT_TRUE(has(
      r.err,
      "--set data.buffer=0: [data] (plugin test) buffer: 0 is out of range: expected an integer in "
      "[1, 64]"))
      << r.err;
  // Without --plugin-path the test plugins are not found.
  r = run(recipe + " --dry-run");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "unknown comm plugin 'test'")) << r.err;
}

// An error a data plugin raises in open() (a bad input file, found only when the run starts)
// names the plugin and its file as factory errors do, and keeps its exit code (2: bad input).
TEST(Cli, DataPluginOpenErrorsNameThePlugin) {
  const fs::path dir = test_dir();
  const std::string recipe = write_recipe(
      dir, "[run]\nname = \"cli-open\"\noutput_dir = \"" + (dir / "out").string() +
               "\"\n"
               "[model.config]\nhidden_size = 32\nintermediate_size = 64\nnum_hidden_layers = 1\n"
               "num_attention_heads = 4\nnum_key_value_heads = 2\nvocab_size = 64\n"
               "max_position_embeddings = 64\n"
               "[train]\nmicro_batch_size = 1\nseq_len = 16\nmax_steps = 1\n"
               "[data]\nplugin = \"test\"\npath = \"open-boom\"\n");
  const Result r = run(recipe + " --plugin-path " + kGood + " --nproc 1");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "plugin data/test (" + kGood +
                             "/libciuic_data_test.so): open-boom: cannot read this input"))
      << r.err;
}

TEST(Cli, FromDeepSpeedWritesAnEquivalentRecipe) {
  const std::string seed =
      CIUIC_SOURCE_DIR + "/tests/fixtures/deepspeed/ds_config_4xa100_seed.json";
  const fs::path out = test_dir() / "from_ds.toml";
  fs::remove(out);
  Result r = run("--from-deepspeed " + seed + " --nproc 4 --set train.micro_batch_size=2 -o " +
                 out.string());
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(
      has(r.err, "ciuic-run: ignored: zero_optimization.allgather_bucket_size: ciuic all-gathers"))
      << r.err;
  EXPECT_TRUE(has(r.err, "placeholders to edit (or give with --set): ")) << r.err;
  EXPECT_TRUE(has(r.err, "ciuic-run: wrote " + out.string())) << r.err;
  const std::string text = ciuic_test::slurp(out.string());
  for (const char* s :
       {"[sharding]\nplugin = \"zero2\"", "warmup_max_lr = 3e-5", "nproc_per_node = 4",
        "micro_batch_size = 2", "#   zero_optimization.reduce_scatter: "})
    EXPECT_TRUE(has(text, s)) << s << "\n" << text;
  // Without -o the recipe goes to stdout.
  r = run("--from-deepspeed " + seed);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "# Imported from " + seed)) << r.out;
  // Refusals, "auto" and a missing file exit 2.
  const fs::path z3 = test_dir() / "z3.json";
  std::ofstream(z3)
      << R"({"zero_optimization": {"stage": 3}, "fp16": {"enabled": true, "loss_scale": "auto"}})";
  r = run("--from-deepspeed " + z3.string());
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(
      has(r.err, "fp16.loss_scale = \"auto\": give it with --set precision.loss_scale=<value>"))
      << r.err;
  r = run("--from-deepspeed " + z3.string() + " --set precision.loss_scale=0");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "[sharding]\nplugin = \"zero3\"")) << r.out;
  const fs::path nvme = test_dir() / "z3-nvme.json";
  std::ofstream(nvme)
      << R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}})";
  r = run("--from-deepspeed " + nvme.string());
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "offload_param.device = \"nvme\"")) << r.err;
  r = run("--from-deepspeed /nonexistent/ds.json");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err,
                  "--from-deepspeed /nonexistent/ds.json: no such file (expected a DeepSpeed "
                  "config JSON file)"))
      << r.err;
  r = run("recipe.toml -o x.toml");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "-o/--output goes with --from-deepspeed")) << r.err;
}

// --from-llamafactory: the recipe, and the converted data next to it (RECIPE-data/); a refused
// key exits 2 and writes nothing.
TEST(Cli, FromLlamaFactoryWritesARecipeAndItsData) {
  const fs::path d = test_dir() / "from_lf";
  fs::remove_all(d);
  fs::create_directories(d / "data");
  std::ofstream(d / "data/dataset_info.json") << R"({"demo": {"file_name": "demo.json"}})";
  std::ofstream(d / "data/demo.json") << R"([{"instruction": "2+2?", "input": "", "output": "4"}])";
  std::ofstream(d / "train.yaml")
      << "model_name_or_path: " << (d / "data").string() << "\nstage: sft\nfinetuning_type: full\n"
      << "dataset: demo\ndataset_dir: " << (d / "data").string() << "\ntemplate: deepseek\n"
      << "per_device_train_batch_size: 1\nnum_train_epochs: 2\nbf16: true\n";
  Result r = run("--from-llamafactory " + (d / "train.yaml").string() + " -o " +
                 (d / "recipe.toml").string());
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.err, "ciuic-run: note: dataset demo: 1 records -> " +
                             (d / "recipe-data/01-demo.jsonl").string()))
      << r.err;
  const std::string text = ciuic_test::slurp((d / "recipe.toml").string());
  for (const char* s : {"chat_template = \"deepseek\"", "max_steps = 2 ", "plugin = \"bf16\""})
    EXPECT_TRUE(has(text, s)) << s << "\n" << text;
  EXPECT_TRUE(fs::exists(d / "recipe-data/01-demo.jsonl"));
  std::ofstream(d / "lora.yaml") << "model_name_or_path: x\ndataset: demo\ndataset_dir: "
                                 << (d / "data").string() << "\n";
  r = run("--from-llamafactory " + (d / "lora.yaml").string() + " -o " +
          (d / "lora.toml").string());
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "finetuning_type: lora (LLaMA-Factory's default): LoRA")) << r.err;
  EXPECT_FALSE(fs::exists(d / "lora.toml"));
  EXPECT_FALSE(fs::exists(d / "lora-data"));
}

// Issue 27: what a config or recipe says reaches the terminal escaped (\x1b, \x00), never raw,
// and the recipe --from-deepspeed writes is data: no [run] table from a key.
TEST(Cli, HostileTextIsShownNotSent) {
  const auto raw_control = [](const std::string& s) {
    for (unsigned char c : s)
      if ((c < 0x20 && c != '\n') || c == 0x7f) return true;
    return false;
  };
  const fs::path dir = test_dir();
  const fs::path ds = dir / "hostile_ds.json";
  std::ofstream(ds) << R"({"train_micro_batch_size_per_gpu": 1,
      "comms_logger\n[run]\nplugin_paths = [\"evilplugins\"] #": 1,
      "\u001b]0;owned\u0007\u001b[2J": 2, "nul\u0000after": 3})";
  const fs::path out = dir / "hostile.toml";
  Result r = run("--from-deepspeed " + ds.string() + " -o " + out.string());
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(raw_control(r.err)) << r.err;
  EXPECT_TRUE(has(
      r.err, "ciuic-run: ignored: comms_logger\\x0a[run]\\x0aplugin_paths = [\"evilplugins\"] #: "))
      << r.err;
  EXPECT_TRUE(has(r.err, "ciuic-run: ignored: \\x1b]0;owned\\x07\\x1b[2J: ")) << r.err;
  EXPECT_TRUE(has(r.err, "ciuic-run: ignored: nul\\x00after: ")) << r.err;
  const std::string text = ciuic_test::slurp(out.string());
  EXPECT_FALSE(raw_control(text)) << text;
  EXPECT_FALSE(has(text, "\n[run]")) << text;
  // The check ciuic suggests resolves the recipe without any plugin path from the config.
  r = run(out.string() + " --print-recipe");
  EXPECT_FALSE(has(r.out, "evilplugins")) << r.out;
  EXPECT_TRUE(has(r.out, "plugin_paths = []")) << r.out << r.err;
  // A recipe error quoting a key with ESC and NUL shows them; the rest of the message follows.
  const std::string recipe = write_recipe(
      dir,
      "[train]\nmax_steps = 2\n\"a\\u001b[2Jb\\u0000c\" = 1\n[data]\nplugin = \"synthetic\"\n");
  r = run(recipe);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_FALSE(raw_control(r.err)) << r.err;
  EXPECT_TRUE(has(r.err, "a\\x1b[2Jb\\x00c")) << r.err;
}

// Issue 27: a checkpoint's manifest.json or trainer.json nested 100,000 deep is refused naming
// the file (exit 1), before a value is built.
TEST(Cli, DeepCheckpointJsonIsRefused) {
  const fs::path dir = test_dir();
  const fs::path ckpt = dir / "deep_ckpt" / "step_00000001";
  fs::create_directories(ckpt);
  const fs::path out = dir / "deep_ckpt_hf";
  std::ofstream(ckpt / "manifest.json")
      << "{\"format\": \"ciuic-checkpoint\", \"version\": 1, \"x\": "
      << ciuic_test::nested_arrays(ciuic_test::kDeep) << "}";
  Result r = run("--export-hf " + ckpt.string() + " " + out.string());
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_TRUE(
      has(r.err, (ckpt / "manifest.json").string() + ": JSON nested deeper than 128 levels"))
      << r.err;
  std::ofstream(ckpt / "manifest.json")
      << "{\"format\": \"ciuic-checkpoint\", \"version\": 1, \"files\": {}}";
  std::ofstream(ckpt / "trainer.json")
      << "{\"step\": 1, \"x\": " << ciuic_test::nested_objects(ciuic_test::kDeep) << "}";
  r = run("--export-hf " + ckpt.string() + " " + out.string());
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_TRUE(has(r.err, (ckpt / "trainer.json").string() + ": JSON nested deeper than 128 levels"))
      << r.err;
}

// The small hostile inputs of issue 27 (finding 7): each gets a message saying what it is and the
// exit code of bad input (2).
TEST(Cli, PlotOnAMistypedRecordNamesFileAndLine) {
  const fs::path dir = test_dir() / "plot_mistyped";
  fs::create_directories(dir);
  std::ofstream(dir / "metrics.jsonl")
      << "{\"step\": 1, \"loss\": 3.0}\n{\"step\": 2, \"event\": 7}\n";
  Result r = run("--plot " + dir.string());
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(
      has(r.err, (dir / "metrics.jsonl").string() + ":2: \"event\" is a number, expected a string"))
      << r.err;
  EXPECT_FALSE(has(r.err, "json.exception")) << r.err;
}

TEST(Cli, ExportHfTokenizerThatIsNotAFileSaysWhatItIs) {
  const fs::path dir = test_dir();
  Result r =
      run("--export-hf /nonexistent/ckpt " + (dir / "hf_out").string() + " --tokenizer /dev/zero");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(
      has(r.err,
          "--tokenizer /dev/zero: not a regular file (a device): expected a tokenizer.json file"))
      << r.err;
  r = run("--export-hf /nonexistent/ckpt " + (dir / "hf_out").string() + " --tokenizer " +
          dir.string());
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "--tokenizer " + dir.string() +
                             ": a folder, not a tokenizer.json file (and not a "
                             "tokenizer folder: it holds no tokenizer.json)"))
      << r.err;
  r = run("--export-hf /nonexistent/ckpt " + (dir / "hf_out").string() +
          " --tokenizer /nonexistent/t.json");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "--tokenizer /nonexistent/t.json: no such file")) << r.err;
}

// --dry-run checks [train] exact_match_file as the run loads it (before: "valid", and the run
// failed after its set-up).
TEST(Cli, DryRunChecksTheExactMatchFile) {
  const std::string tok = CIUIC_SOURCE_DIR + "/examples/demo/tokenizer.json";
  const fs::path dir = test_dir();
  const std::string recipe = write_recipe(dir, kAllTest);
  const std::string base =
      recipe + " --plugin-path " + kGood + " --dry-run --set model.tokenizer=" + tok;
  Result r = run(base + " --set train.exact_match_file=/dev/zero");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(
      has(r.err,
          "[train] exact_match_file: cannot read held-out questions ([train] exact_match_file) "
          "/dev/zero: not a regular file"))
      << r.err;
  const fs::path q = dir / "questions.jsonl";
  std::ofstream(q)
      << "{\"messages\": [{\"role\": \"user\", \"content\": \"2+2?\"}], \"answer\": \"4\"}\n";
  r = run(base + " --set train.exact_match_file=" + q.string());
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "  exact match " + q.string() + ", 1 question(s)\n")) << r.out;
}

// Issue 33: the held-out evaluation's settings are checked by --dry-run, exit 2 naming the key.
TEST(Cli, DryRunChecksTheEvalMetrics) {
  const fs::path dir = test_dir();
  const std::string base = write_recipe(dir, kAllTest) + " --plugin-path " + kGood + " --dry-run";
  Result r = run(base + " --set 'train.eval_metrics=[\"bleu\", \"blue\"]'");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(
      has(r.err,
          "[train] eval_metrics: \"blue\" is not a metric: expected exact_match, bleu, rouge_l or "
          "response_time; did you mean \"bleu\"?"))
      << r.err;
  r = run(base + " --set train.bleu_tokenize=intl");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "bleu_tokenize")) << r.err;
  r = run(base + " --set train.rouge_use_stemmer=yes");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "rouge_use_stemmer")) << r.err;
  r = run(base +
          " --set 'train.eval_metrics=[\"rouge_l\"]' --set train.bleu_tokenize=zh --set "
          "train.rouge_use_stemmer=true");
  EXPECT_EQ(r.code, 0) << r.err;
}

// Plugins load only when the run uses them: --print-recipe with a plugin path holding a plugin the
// recipe does not name runs none of its code (issue 27: every libciuic_*.so was loaded), and a
// library there that is not a plugin is named in a warning.
TEST(Cli, PrintRecipeLoadsOnlyThePluginsItNames) {
  const fs::path dir = test_dir();
  const std::string recipe = write_recipe(dir, kAllTest);
  const fs::path marker = dir / "marker.txt";
  const fs::path io = fs::path(CIUIC_TEST_TMP) / "cli" / "io";
  const std::string cmd = "env CIUIC_TEST_MARKER=" + marker.string() + " " + kExe + " " + recipe +
                          " --plugin-path " + kGood + " --plugin-path " + CIUIC_TEST_PLUGINS +
                          "/marker --print-recipe";
  Result r = ciuic_test::run_command(cmd, io);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(fs::exists(marker)) << ciuic_test::slurp(marker.string());
  EXPECT_TRUE(has(
      r.err,
      CIUIC_TEST_PLUGINS + "/marker/libciuic_data_notaplugin.so is not loaded: not a ciuic plugin"))
      << r.err;
  r = ciuic_test::run_command(cmd + " --set 'precision.plugin=\"marker\"'", io);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(ciuic_test::slurp(marker.string()), "marker loaded\n");
}

TEST(Cli, PlotWritesTheRunReport) {
  const fs::path dir = test_dir() / "plot_run";
  fs::create_directories(dir);
  std::ofstream(dir / "metrics.jsonl")
      << "{\"step\": 1, \"loss\": 3.0, \"lr\": 1e-4}\n{\"step\": 2, \"loss\": 2.5, \"lr\": 1e-4}\n";
  Result r = run("--plot " + dir.string());
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, (dir / "report.html").string() + "\n");
  EXPECT_TRUE(has(ciuic_test::slurp((dir / "report.html").string()), "<svg")) << r.out;
  r = run("--plot " + (test_dir() / "no_such_run").string());
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(has(r.err, "no metrics file at")) << r.err;
}

// Paths the file system refuses (uncaught std::filesystem_error from fs::exists and co. before):
// a 300-character name (ENAMETOOLONG) and a path through a regular file (ENOTDIR), given as the
// recipe, [run] output_dir, [checkpoint] dir, [model] path, [model] tokenizer, --resume, the
// importers' files and -o, and --export-hf's CKPT and OUT. Each is the project's error naming the
// path, where it came from and the reason, with the documented exit code; none is the text of a
// std::filesystem_error, and nothing is left behind. (An unreadable folder, EACCES, is not tried:
// these tests run as root, who reads every folder.)
namespace {

void expect_refused_paths(const fs::path& dir, const std::string& bad, const std::string& reason,
                          const std::string& system_text) {
  const std::string recipe = write_recipe(dir, kAllTest);
  const std::string ds = CIUIC_SOURCE_DIR + "/tests/fixtures/deepspeed/ds_config_4xa100_seed.json";
  const std::string base = recipe + " --plugin-path " + kGood;
  struct Case {
    std::string args, head;
    int code;
    std::string why;
  };
  const std::vector<Case> cases = {
      {bad, "cannot read recipe " + bad + ": ", 2, system_text},
      {base + " --set run.output_dir=" + bad,
       "error: [run] output_dir " + bad + " cannot be created: ", 2, reason},
      {base + " --set checkpoint.dir=" + bad,
       "error: [checkpoint] dir " + bad + " cannot be created: ", 2, reason},
      {base + " --dry-run --set model.path=" + bad,
       "error: " + bad +
           "/config.json: cannot open the model config (expected an HF config.json): ",
       1, reason},
      {base + " --dry-run --set model.tokenizer=" + bad,
       "error: cannot read tokenizer file '" + bad + "': ", 1, reason},
      {base + " --dry-run --resume " + bad,
       "error: --resume " + bad + ": no such checkpoint folder (", 2, reason},
      {"--from-deepspeed " + bad, "error: --from-deepspeed " + bad + ": ", 2, reason},
      {"--from-axolotl " + bad, "error: --from-axolotl " + bad + ": ", 2, reason},
      {"--from-deepspeed " + ds + " -o " + bad + "/r.toml",
       "error: -o " + bad + "/r.toml cannot be written: ", 2, reason},
      {"--export-hf " + bad + " " + (dir / "out").string(),
       "error: --export-hf " + bad + ": no such checkpoint folder (", 2, reason},
      {"--export-hf " + dir.string() + " " + bad,
       "error: --export-hf OUT " + bad + " cannot be written: ", 2, reason},
  };
  for (const Case& c : cases) {
    Result r = run(c.args);
    EXPECT_EQ(r.code, c.code) << c.args << "\n" << r.err;
    EXPECT_TRUE(has(r.err, c.head + c.why)) << c.args << "\n" << r.err;
    EXPECT_FALSE(has(r.err, "filesystem error")) << c.args << "\n" << r.err;
  }
  // Nothing was written: no -o data folder, no export, no run folders next to the bad paths.
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir)) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"file", "recipe.toml"}));
}

}  // namespace

TEST(Cli, TooLongPathNamesAreNamedWithTheReason) {
  const fs::path dir = test_dir();
  ciuic_test::write_file(dir / "file", "x\n");
  expect_refused_paths(dir, (dir / std::string(300, 'a') / "x").string(), "File name too long",
                       "File name too long");
}

TEST(Cli, PathsThroughAFileAreNamedWithTheReason) {
  const fs::path dir = test_dir();
  ciuic_test::write_file(dir / "file", "x\n");
  expect_refused_paths(dir, (dir / "file" / "x").string(),
                       (dir / "file").string() + " is a file, not a folder", "Not a directory");
}
