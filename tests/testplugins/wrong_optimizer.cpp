// Test plugin optimizer/keepsout: an optimizer that breaks exactly one promise of
// Optimizer::accepts_sharded_parameters() (ciuic/optimizer.h, API 9), for the conformance kit's own
// test (tests/conformance: conformance_fails_sharded_params_out_test). Plain SGD on an fp32 master;
// the protocol is right as long as params_out is the same tensor at every call (ddp, zero2: the
// model's own parameters), but it keeps the first params_out it was given and writes every later
// update there — under zero3 with offload_params on a GPU, where params_out is a new staging
// tensor per call, the parameters would never change after the first step. It says true anyway.
#define CIUIC_PLUGIN_API 9
#include <string>
#include <vector>

#include <ATen/ops/cat.h>
#include <ATen/ops/zeros.h>

#include <ciuic/error.h>
#include <ciuic/optimizer.h>
#include <ciuic/plugin.h>

namespace {

class KeepsOut final : public ciuic::Optimizer {
 public:
  void setup(const ciuic::OptimizerSetup& s) override {
    ciuic::check_optimizer_setup(s, kWho);
    s_ = s;
    std::vector<at::Tensor> pieces;
    for (const auto& p : s.initial) pieces.push_back(p.values.reshape({-1}).to(at::kFloat));
    master_ = at::cat(pieces).clone();
    s_.initial.clear();
    grad_ = at::zeros({s.numel}, at::kFloat);
  }
  void accumulate_grad(int region, const at::Tensor& chunk, bool first, bool) override {
    ciuic::check_grad_chunk(s_, region, chunk, kWho);
    const auto& r = s_.grad_regions[static_cast<size_t>(region)];
    at::Tensor dst = grad_.narrow(0, r.offset, r.numel);
    if (first)
      dst.copy_(chunk);
    else
      dst.add_(chunk);
  }
  at::Tensor finish_grads() override { return grad_.to(at::kDouble).square().sum().reshape({1}); }
  void step(const ciuic::OptimizerStep& a, at::Tensor& params_out) override {
    ciuic::check_optimizer_step(s_, a, params_out, kWho);
    master_.add_(grad_, -a.lr * a.grad_scale);
    if (!out_.defined()) out_ = params_out;  // the defect: the first params_out, kept
    out_.copy_(master_);
  }
  void write_params(at::Tensor& params_out, int64_t) override { params_out.copy_(master_); }
  std::vector<std::string> state_names() const override { return {"master"}; }
  void save_state(ciuic::StateDict& out) const override {
    out.emplace_back("master", master_.clone());
  }
  void load_state(const ciuic::StateDict& in) override {
    master_.copy_(ciuic::optimizer_state_tensor(in, "master", s_.numel, kWho));
  }
  bool accepts_sharded_parameters() const override { return true; }  // it does not

 private:
  static constexpr const char* kWho = "optimizer keepsout";
  ciuic::OptimizerSetup s_;
  at::Tensor master_, grad_, out_;
};

}  // namespace

CIUIC_DEFINE_PLUGIN_NO_OPTIONS(ciuic::Slot::kOptimizer, "keepsout", "0.1.0",
                               "SGD that keeps its first params_out (a broken API 9 promise)",
                               [](const ciuic::PluginArgs&) -> ciuic::PluginObject* {
                                 return new KeepsOut();
                               })
