// ciuic-plugin-check PLUGIN.so [options]: the conformance kit's checks of one plugin file
// (ciuic/testing/conformance.h; docs/plugins.md, "Testing a plugin"). Exit codes: 0 every check
// passed, 1 a check failed, 2 usage error, or the plugin (or its options) refused.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <ciuic/error.h>
#include <ciuic/testing/conformance.h>

namespace {

using ciuic::conformance::CheckOptions;
using ciuic::conformance::PluginUnderTest;

constexpr const char* kUsage =
    "usage: ciuic-plugin-check PLUGIN.so [options] [--gtest_* flags]\n"
    "Loads PLUGIN.so as ciuic-run would and holds it to its slot's contract (comm, data, "
    "precision,\n"
    "optimizer, sharding; docs/plugins.md \"Testing a plugin\").\n"
    "  --options TOML        the plugin's recipe section, without `plugin = ...` (e.g. 'threads = "
    "2')\n"
    "  --options-file FILE   the same from a file\n"
    "  --world 1,2,3,4       world sizes (comm, sharding: a process per rank; data: sources per "
    "rank;\n"
    "                        sharding: each world resumes the previous one's state)\n"
    "  --work-dir DIR        RunContext::output_dir of the checks (default: a fresh temp folder)\n"
    "  data:      --tokenizer tokenizer.json  --seq-len 32  --micro-batch 2  --rows 48  --seed "
    "1234\n"
    "  precision: --expect-scale X  --expect-backoff X  --expect-growth X  --expect-window N\n"
    "  optimizer: --reference adamw   (the updates must equal AdamW's)\n"
    "Exit codes: 0 passed, 1 a check failed, 2 usage error or plugin/options refused.\n";

[[noreturn]] void usage_error(const std::string& what) {
  std::fprintf(stderr, "ciuic-plugin-check: error: %s\n%s", what.c_str(), kUsage);
  std::exit(2);
}

double number(const std::string& flag, const std::string& v) {
  try {
    size_t end = 0;
    const double d = std::stod(v, &end);
    if (end == v.size()) return d;
  } catch (const std::exception&) {
  }
  usage_error(flag + " " + v + ": expected a number");
}

int64_t integer(const std::string& flag, const std::string& v, int64_t min) {
  const double d = number(flag, v);
  if (d != static_cast<double>(static_cast<int64_t>(d)) || d < static_cast<double>(min))
    usage_error(flag + " " + v + ": expected an integer >= " + std::to_string(min));
  return static_cast<int64_t>(d);
}

class Check : public ::testing::Test {
 public:
  Check(const PluginUnderTest& p, const CheckOptions& o) : p_(p), o_(o) {}
  void TestBody() override { ciuic::conformance::check_plugin(p_, o_); }

 private:
  const PluginUnderTest& p_;
  const CheckOptions& o_;
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);  // takes the --gtest_* flags out
  std::string path;
  CheckOptions o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (a.rfind("--", 0) != 0) {
      if (!path.empty()) usage_error("more than one plugin file: " + path + ", " + a);
      path = a;
      continue;
    }
    if (i + 1 >= argc) usage_error(a + " needs a value");
    const std::string v = argv[++i];
    if (a == "--options")
      o.options_toml = v;
    else if (a == "--options-file") {
      std::ifstream in(v);
      if (!in) usage_error("--options-file " + v + ": cannot be read");
      std::stringstream ss;
      ss << in.rdbuf();
      o.options_toml = ss.str();
    } else if (a == "--world") {
      o.world_sizes.clear();
      std::stringstream ss(v);
      for (std::string w; std::getline(ss, w, ',');)
        o.world_sizes.push_back(static_cast<int>(integer(a, w, 1)));
      if (o.world_sizes.empty()) usage_error("--world: no world size");
      for (int w : o.world_sizes)
        if (w > 8) usage_error("--world: at most 8 ranks (found " + std::to_string(w) + ")");
    } else if (a == "--work-dir")
      o.work_dir = v;
    else if (a == "--tokenizer")
      o.tokenizer_json = v;
    else if (a == "--seq-len")
      o.seq_len = integer(a, v, 1);
    else if (a == "--micro-batch")
      o.micro_batch = integer(a, v, 1);
    else if (a == "--rows")
      o.rows = integer(a, v, 1);
    else if (a == "--seed")
      o.seed = static_cast<uint64_t>(integer(a, v, 0));
    else if (a == "--expect-scale")
      o.expect_scale = number(a, v);
    else if (a == "--expect-backoff")
      o.expect_backoff = number(a, v);
    else if (a == "--expect-growth")
      o.expect_growth = number(a, v);
    else if (a == "--expect-window")
      o.expect_window = integer(a, v, 1);
    else if (a == "--reference") {
      if (v != "adamw") usage_error("--reference " + v + ": known references: adamw");
      o.reference = v;
    } else
      usage_error("unknown option " + a);
  }
  if (path.empty()) usage_error("no plugin file");
  std::unique_ptr<PluginUnderTest> plugin;
  try {
    plugin = std::make_unique<PluginUnderTest>(PluginUnderTest::load(path));
    plugin->config(o.options_toml);  // refused options end here, as in ciuic-run
  } catch (const ciuic::Error& e) {
    std::fprintf(stderr, "ciuic-plugin-check: error: %s\n", e.what());
    return 2;
  }
  std::printf("ciuic-plugin-check: %s plugin %s %s (%s)\n", ciuic::slot_name(plugin->slot()),
              plugin->name().c_str(), plugin->info().version, plugin->path().c_str());
  std::fflush(stdout);
  const PluginUnderTest& p = *plugin;
  ::testing::RegisterTest("Conformance", ciuic::slot_name(p.slot()), nullptr, nullptr, __FILE__,
                          __LINE__, [&]() -> ::testing::Test* { return new Check(p, o); });
  return RUN_ALL_TESTS() == 0 ? 0 : 1;
}
