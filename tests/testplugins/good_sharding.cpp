// Test plugin sharding/test: a strategy that only watches. It records every layer boundary the
// model announces (Sharding::before_group/after_group, ciuic/sharding.h) as one line of
// <output_dir>/sharding-test-events.txt:
//   <pass> <before|after> <group index> <group name> [missing=<param>,...]
// where `missing` (after a kBackward group only) lists the group's parameters whose gradient
// autograd had not accumulated since the group's before_group(kBackward) — what a
// parameter-sharding strategy relies on to reduce-scatter a group's gradients there. A parameter
// in several groups (a tied embedding: embed and head) is checked at the last of them in backward
// order, the lowest index: autograd accumulates a leaf's gradient once, after all its uses. It
// checks the groups at setup() (each a valid, non-empty index list) and throws on a boundary of an
// unknown group. finish_grads() returns the squares of the gradients autograd left in param.grad;
// it does not update (update() throws).
#define CIUIC_PLUGIN_API 7
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <ciuic/context.h>
#include <ciuic/error.h>
#include <ciuic/grad_norm.h>
#include <ciuic/sharding.h>

namespace {

const char* pass_name(ciuic::GroupPass p) {
  switch (p) {
    case ciuic::GroupPass::kForward: return "forward";
    case ciuic::GroupPass::kBackward: return "backward";
    case ciuic::GroupPass::kRecompute: return "recompute";
  }
  return "?";
}

// Per parameter: the number of the last event before its gradient was last accumulated.
struct Clock {
  int64_t events = 0;
  std::vector<int64_t> accumulated;  // per parameter; -1: never
};

class Accumulated final : public torch::autograd::PostAccumulateGradHook {
 public:
  Accumulated(std::shared_ptr<Clock> clock, int index) : clock_(std::move(clock)), index_(index) {}
  void operator()(const torch::autograd::Variable&) override {
    clock_->accumulated[static_cast<size_t>(index_)] = clock_->events;
  }

 private:
  std::shared_ptr<Clock> clock_;
  int index_;
};

class TestSharding final : public ciuic::Sharding {
 public:
  explicit TestSharding(const ciuic::RunContext& ctx) : ctx_(ctx) {}
  ~TestSharding() override {
    for (auto& p : setup_.params) torch::autograd::impl::set_post_acc_grad_hooks(p.tensor, nullptr);
  }

  void setup(const ciuic::ShardingSetup& s) override {
    setup_ = s;
    for (size_t g = 0; g < s.groups.size(); ++g) {
      if (s.groups[g].params.empty())
        throw ciuic::Error("sharding/test: group " + s.groups[g].name + " is empty");
      for (int p : s.groups[g].params)
        if (p < 0 || static_cast<size_t>(p) >= s.params.size())
          throw ciuic::Error("sharding/test: group " + s.groups[g].name + " lists parameter " +
                             std::to_string(p));
    }
    clock_ = std::make_shared<Clock>();
    clock_->accumulated.assign(s.params.size(), -1);
    before_backward_.assign(s.groups.size(), 0);
    last_group_.assign(s.params.size(), -1);  // the lowest group index of each parameter
    for (size_t g = s.groups.size(); g-- > 0;)
      for (int p : s.groups[g].params) last_group_[static_cast<size_t>(p)] = static_cast<int>(g);
    for (size_t i = 0; i < s.params.size(); ++i)
      torch::autograd::impl::set_post_acc_grad_hooks(
          s.params[i].tensor, std::make_unique<Accumulated>(clock_, static_cast<int>(i)));
    log_.open(ctx_.output_dir + "/sharding-test-events.txt", std::ios::trunc);
  }
  void begin_micro_batch(int64_t index, bool) override { log_ << "micro_batch " << index << "\n"; }

  void before_group(int group, ciuic::GroupPass pass) override {
    const auto& g = checked(group);
    ++clock_->events;
    if (pass == ciuic::GroupPass::kBackward)
      before_backward_[static_cast<size_t>(group)] = clock_->events;
    log_ << pass_name(pass) << " before " << group << " " << g.name << "\n";
  }
  void after_group(int group, ciuic::GroupPass pass) override {
    const auto& g = checked(group);
    ++clock_->events;
    log_ << pass_name(pass) << " after " << group << " " << g.name;
    if (pass == ciuic::GroupPass::kBackward) {
      std::string missing;
      for (int p : g.params)
        if (last_group_[static_cast<size_t>(p)] == group &&
            clock_->accumulated[static_cast<size_t>(p)] <
                before_backward_[static_cast<size_t>(group)])
          missing += (missing.empty() ? "" : ",") + setup_.params[static_cast<size_t>(p)].name;
      if (!missing.empty()) log_ << " missing=" << missing;
    }
    log_ << "\n";
    log_.flush();
  }

  ciuic::GradSquares finish_grads() override {
    ciuic::GradSquares sq;
    sq.local_sum_sq = at::zeros({1}, at::kDouble);
    for (auto& p : setup_.params)
      if (p.tensor.grad().defined())
        sq.local_sum_sq.add_(ciuic::sum_of_squares(p.tensor.grad()).cpu());
    return sq;
  }
  void update(const ciuic::OptimizerStep&) override {
    throw ciuic::Error("sharding/test does not update");
  }
  std::vector<ciuic::ShardSlice> layout() const override { return {}; }
  void save_state(ciuic::StateDict&) const override {}
  void load_state(const ciuic::SliceFetcher&, int64_t) override {}

 private:
  const ciuic::ParamGroup& checked(int group) const {
    if (group < 0 || static_cast<size_t>(group) >= setup_.groups.size())
      throw ciuic::Error("sharding/test: boundary of group " + std::to_string(group) +
                         "; setup() had " + std::to_string(setup_.groups.size()) + " groups");
    return setup_.groups[static_cast<size_t>(group)];
  }

  const ciuic::RunContext& ctx_;
  ciuic::ShardingSetup setup_;
  std::shared_ptr<Clock> clock_;
  std::vector<int64_t> before_backward_;  // per group: the event of its before_group(kBackward)
  std::vector<int> last_group_;           // per parameter: its group whose backward comes last
  std::ofstream log_;
};

}  // namespace

CIUIC_DEFINE_PLUGIN_NO_OPTIONS(ciuic::Slot::kSharding, "test", "0.2.0",
                               "sharding for tests: records the model's layer boundaries",
                               [](const ciuic::PluginArgs& a) -> ciuic::PluginObject* {
                                 return new TestSharding(a.context);
                               })
