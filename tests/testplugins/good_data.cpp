// Test plugin data/test: declares one option of every type, so that tests can check the
// validation of plugin sections, and reports the values it was given through append_metrics()
// (numbers only) so that tests can see what the factory received. Its options are typed handles
// (ciuic::Option<T>, one of each type), declared once and read with Config::get.
#define CIUIC_PLUGIN_API 7
#include <string>
#include <vector>

#include <ciuic/config.h>
#include <ciuic/data.h>
#include <ciuic/error.h>

namespace {

constexpr ciuic::Option<std::string> kPath{"path", nullptr, "input file (required)"};
constexpr ciuic::Option<bool> kShuffle{"shuffle", "true", "shuffle the samples"};
constexpr ciuic::Option<int64_t> kBuffer{"buffer", "4", "prefetch depth", 1, 64};
constexpr ciuic::Option<double> kRatio{"ratio", "0.5", "held-out fraction", 0.0, 1.0};
constexpr ciuic::Option<std::string> kMode{"mode", "\"fast\"", "reading mode",
                                           NAN,    NAN,        "fast|slow"};
constexpr ciuic::Option<std::vector<std::string>> kFiles{"files", "[]", "extra files"};
constexpr ciuic::Option<std::vector<double>> kWeights{"weights", "[1.0]", "mixing weights", 0.0,
                                                      NAN};
const ciuic::OptionSpec kOptions[] = {kPath, kShuffle, kBuffer, kRatio, kMode, kFiles, kWeights};

class TestData final : public ciuic::DataSource {
 public:
  explicit TestData(const ciuic::Config& c)
      : shuffle_(c.get(kShuffle)),
        buffer_(c.get(kBuffer)),
        ratio_(c.get(kRatio)),
        mode_slow_(c.get(kMode) == "slow"),
        files_(static_cast<double>(c.get(kFiles).size())),
        weights_(c.get(kWeights)) {
    if (c.get(kPath) == "boom") c.fail(kPath.key(), "the test plugin was asked to fail");
    open_boom_ = c.get(kPath) == "open-boom";
  }
  // path = "open-boom": open() fails as a plugin with a bad input file would (the engine must
  // add the plugin's name and file to the message).
  void open(const ciuic::DataOpenArgs&) override {
    if (open_boom_) throw ciuic::UsageError("open-boom: cannot read this input");
  }
  ciuic::Batch next() override { throw ciuic::Error("data/test yields no batches"); }
  std::string cursor() const override { return "{}"; }
  void seek(const std::string&) override {}
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

}  // namespace

CIUIC_DEFINE_PLUGIN(ciuic::Slot::kData, "test", "0.2.0", "data source for tests", kOptions,
                    [](const ciuic::PluginArgs& a) -> ciuic::PluginObject* {
                      return new TestData(a.config);
                    })
