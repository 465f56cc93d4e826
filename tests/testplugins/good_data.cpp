// Test plugin data/test: declares one option of every type, so that tests can check the
// validation of plugin sections, and reports the values it was given through append_metrics()
// (numbers only) so that tests can see what the factory received.
#include <ciuic/config.h>
#include <ciuic/data.h>
#include <ciuic/error.h>

namespace {

class TestData final : public ciuic::DataSource {
 public:
  explicit TestData(const ciuic::Config& c)
      : shuffle_(c.get_bool("shuffle")),
        buffer_(c.get_int("buffer")),
        ratio_(c.get_float("ratio")),
        mode_slow_(c.get_string("mode") == "slow"),
        files_(static_cast<double>(c.get_string_list("files").size())),
        weights_(c.get_float_list("weights")) {
    if (c.get_string("path") == "boom") c.fail("path", "the test plugin was asked to fail");
    open_boom_ = c.get_string("path") == "open-boom";
  }
  // path = "open-boom": open() fails as a plugin with a bad input file would (the engine must
  // add the plugin's name and file to the message).
  void open(const ciuic::DataOpenArgs&) override {
    if (open_boom_) throw ciuic::UsageError("open-boom: cannot read this input");
  }
  ciuic::Batch next() override { throw ciuic::Error("data/test yields no batches"); }
  std::string cursor() const override { return "{}"; }
  void seek(const std::string&) override {}
  int64_t epoch() const override { return 0; }
  void append_metrics(ciuic::Metrics& out) const override {
    out.set("shuffle", shuffle_ ? 1 : 0);
    out.set("buffer", static_cast<double>(buffer_));
    out.set("ratio", ratio_);
    out.set("mode_slow", mode_slow_ ? 1 : 0);
    out.set("files", files_);
    out.set("weights", static_cast<double>(weights_.size()));
    out.set("weight0", weights_.empty() ? -1 : weights_[0]);
  }

 private:
  bool shuffle_;
  int64_t buffer_;
  double ratio_;
  bool mode_slow_;
  double files_;
  std::vector<double> weights_;
  bool open_boom_ = false;
};

const ciuic::OptionSpec kOptions[] = {
    {"path", ciuic::OptionType::kString, nullptr, "input file (required)"},
    {"shuffle", ciuic::OptionType::kBool, "true", "shuffle the samples"},
    {"buffer", ciuic::OptionType::kInt, "4", "prefetch depth", 1, 64},
    {"ratio", ciuic::OptionType::kFloat, "0.5", "held-out fraction", 0.0, 1.0},
    {"mode", ciuic::OptionType::kString, "\"fast\"", "reading mode", NAN, NAN, "fast|slow"},
    {"files", ciuic::OptionType::kStringList, "[]", "extra files"},
    {"weights", ciuic::OptionType::kFloatList, "[1.0]", "mixing weights", 0.0, NAN},
};

}  // namespace

CIUIC_DEFINE_PLUGIN(ciuic::Slot::kData, "test", "0.2.0", "data source for tests", kOptions,
                    [](const ciuic::PluginArgs& a) -> ciuic::PluginObject* {
                      return new TestData(a.config);
                    })
