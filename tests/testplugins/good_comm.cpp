// Test plugin comm/test: a world of one process. Collectives copy or do nothing.
// Option fail_on_create makes the factory throw (to test how the core reports it).
#define CIUIC_PLUGIN_API 7
#include <ciuic/comm.h>
#include <ciuic/config.h>
#include <ciuic/context.h>
#include <ciuic/error.h>

namespace {

class DoneWork final : public ciuic::Work {
 public:
  void wait() override {}
  bool is_completed() override { return true; }
};

class TestComm final : public ciuic::Comm {
 public:
  explicit TestComm(const ciuic::RunContext& ctx) : device_(ctx.device) {
    if (ctx.world_size != 1) throw ciuic::Error("comm/test supports a world of 1 process only");
  }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  c10::Device device() const override { return device_; }
  std::string backend_name() const override { return "test"; }
  std::unique_ptr<ciuic::Work> all_reduce(at::Tensor&, ciuic::ReduceOp) override { return done(); }
  std::unique_ptr<ciuic::Work> reduce_scatter(at::Tensor& out, const at::Tensor& in,
                                              ciuic::ReduceOp) override {
    out.copy_(in);
    return done();
  }
  std::unique_ptr<ciuic::Work> all_gather(at::Tensor& out, const at::Tensor& in) override {
    out.copy_(in);
    return done();
  }
  std::unique_ptr<ciuic::Work> broadcast(at::Tensor&, int) override { return done(); }
  void barrier() override {}
  ciuic::CommCounters counters() const override { return counters_; }

 private:
  std::unique_ptr<ciuic::Work> done() {
    ++counters_.calls;
    return std::make_unique<DoneWork>();
  }
  c10::Device device_;
  ciuic::CommCounters counters_;
};

const ciuic::OptionSpec kOptions[] = {
    {"fail_on_create", ciuic::OptionType::kBool, "false", "throw from the factory (tests)"},
};

}  // namespace

CIUIC_DEFINE_PLUGIN(ciuic::Slot::kComm, "test", "0.1.0", "single-process comm for tests", kOptions,
                    [](const ciuic::PluginArgs& a) -> ciuic::PluginObject* {
                      if (a.config.get_bool("fail_on_create"))
                        a.config.fail("fail_on_create", "asked to fail");
                      return new TestComm(a.context);
                    })
