// check_optimizer (ciuic/testing/conformance.h): the protocol of ciuic/optimizer.h driven as a
// Sharding drives it, on the CPU with the installed fp32 precision plugin; AdamW computed here in
// fp64 (torch.optim.AdamW's update: decoupled weight decay, bias-corrected moments).
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <ciuic/error.h>
#include <ciuic/optimizer.h>
#include <ciuic/precision.h>
#include <ciuic/store.h>
#include <ciuic/testing/conformance.h>

#include "support.h"

namespace ciuic::conformance {
namespace {

constexpr int64_t kNumel = 1237;    // odd: no kernel's vector width divides it
constexpr int64_t kDecayEnd = 700;  // [0, 700) weight decay, [700, numel) none
constexpr int kSteps = 5, kResumeAfter = 3;

struct Made {
  std::shared_ptr<PluginObject> obj;
  Optimizer* opt = nullptr;
};

// AdamW in fp64 on the whole shard.
struct AdamW {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  at::Tensor p, m, v;
  void step(const at::Tensor& grad, double lr, double wd, double grad_scale, int64_t t) {
    const at::Tensor g = grad.to(at::kDouble) * grad_scale;
    m = m * beta1 + g * (1 - beta1);
    v = v * beta2 + g * g * (1 - beta2);
    at::Tensor decay = at::ones({kNumel}, at::kDouble);
    decay.narrow(0, 0, kDecayEnd).fill_(1 - lr * wd);
    const double bc1 = 1 - std::pow(beta1, static_cast<double>(t)),
                 bc2 = 1 - std::pow(beta2, static_cast<double>(t));
    p = p * decay - (m / bc1) / ((v / bc2).sqrt() + eps) * lr;
  }
};

// |got - want| <= atol + rtol |want| everywhere.
void expect_close(const at::Tensor& got, const at::Tensor& want, double rtol, double atol,
                  const std::string& what) {
  const at::Tensor g = got.to(at::kDouble).flatten(), w = want.to(at::kDouble).flatten();
  ASSERT_EQ(g.numel(), w.numel()) << what;
  const at::Tensor bad = (g - w).abs().gt(w.abs() * rtol + atol) | g.isnan();
  if (bad.any().item<bool>()) {
    const int64_t i = bad.to(at::kInt).argmax().item<int64_t>();
    ADD_FAILURE() << what << ": element " << i << " is " << g[i].item<double>() << ", expected "
                  << w[i].item<double>();
  }
}

class OptimizerCheck {
 public:
  OptimizerCheck(const PluginUnderTest& plugin, const CheckOptions& o)
      : plugin_(plugin),
        o_(o),
        cfg_(plugin.config(o.options_toml)),
        dir_(work_dir(o, "optimizer")) {
    ctx_ = make_context(0, 1, make_local_store(std::chrono::seconds(10)), c10::Device(c10::kCPU),
                        dir_, o.seed);
    precision_obj_ = plugin.create_helper(Slot::kPrecision, "fp32", "", ctx_);
    precision_ = dynamic_cast<Precision*>(precision_obj_.get());
  }

  Made make() const {
    Made m;
    m.obj = plugin_.create(cfg_, ctx_);
    m.opt = dynamic_cast<Optimizer*>(m.obj.get());
    if (!m.opt) throw Error("the plugin's factory made no ciuic::Optimizer");
    return m;
  }

  OptimizerSetup setup(const at::Tensor& init, int64_t accumulation) const {
    OptimizerSetup s;
    s.numel = kNumel;
    s.segments = {{0, kDecayEnd, true}, {kDecayEnd, kNumel, false}};
    s.grad_regions = {{0, 400}, {400, 500}, {900, kNumel - 900}};
    s.initial = {{0, init.narrow(0, 0, 600)}, {600, init.narrow(0, 600, kNumel - 600)}};
    s.param_dtype = at::kFloat;
    s.device = c10::Device(c10::kCPU);
    s.precision = precision_;
    s.gradient_accumulation_steps = accumulation;
    s.grad_dtype = at::kFloat;
    s.one_chunk_per_step = accumulation == 1;
    return s;
  }

  // The gradient of micro-batch `micro` of step `t`.
  static at::Tensor grad(int64_t t, int64_t micro) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(1000 * t + micro));
    return at::randn({kNumel}, gen, at::TensorOptions().dtype(at::kFloat));
  }

  // Hands step t's gradients over region by region (the second micro-batch in reverse region
  // order); returns their sum.
  static at::Tensor feed(Optimizer& opt, const OptimizerSetup& s, int64_t t) {
    at::Tensor sum = at::zeros({kNumel}, at::kFloat);
    const int64_t A = s.gradient_accumulation_steps;
    const int regions = static_cast<int>(s.grad_regions.size());
    for (int64_t micro = 0; micro < A; ++micro) {
      const at::Tensor g = grad(t, micro);
      sum += g;
      for (int i = 0; i < regions; ++i) {
        const int r = micro % 2 ? regions - 1 - i : i;
        const ShardRegion& reg = s.grad_regions[r];
        opt.accumulate_grad(r, g.narrow(0, reg.offset, reg.numel).clone(), micro == 0,
                            micro == A - 1);
      }
    }
    return sum;
  }

  static OptimizerStep args(int64_t t) {
    OptimizerStep a;
    a.lr = 1e-2 * (1.0 - 0.1 * static_cast<double>(t));
    a.weight_decay = 0.1;
    a.grad_scale = t % 2 ? 0.5 : 1.0;  // a clip coefficient (or 1 / loss scale) on odd steps
    a.t = t;
    return a;
  }

  void check_state(const Optimizer& opt, const StateDict& sd, const std::string& when) {
    for (const std::string& name : opt.state_names()) {
      const at::Tensor t = state_get(sd, name);
      ASSERT_TRUE(t.defined()) << when << ": save_state() lacks '" << name
                               << "' (a name of state_names())";
      EXPECT_TRUE(t.dim() == 1 && t.numel() == kNumel && t.scalar_type() == at::kFloat &&
                  t.device().is_cpu())
          << when << ": state '" << name << "' must be a 1-D fp32 CPU tensor of " << kNumel
          << " elements";
    }
  }

  void run(int64_t accumulation) {
    SCOPED_TRACE("gradient_accumulation_steps " + std::to_string(accumulation) +
                 (accumulation == 1 ? " (one chunk per step)" : ""));
    auto gen = at::make_generator<at::CPUGeneratorImpl>(99);
    const at::Tensor init = at::randn({kNumel}, gen, at::TensorOptions().dtype(at::kFloat));
    Made a = make();
    const std::vector<std::string> names = a.opt->state_names();
    ASSERT_FALSE(names.empty()) << "state_names() is empty";
    EXPECT_EQ(names[0], "master") << "state_names() must start with \"master\"";
    const OptimizerSetup s = setup(init.clone(), accumulation);
    a.opt->setup(s);
    {
      StateDict sd;
      a.opt->save_state(sd);
      check_state(*a.opt, sd, "after setup()");
      EXPECT_TRUE(state_get(sd, "master").equal(init))
          << "the master weights after setup() are not the initial values";
    }
    AdamW ref;
    const bool adamw = o_.reference == "adamw";
    if (adamw) {
      if (cfg_.has("betas")) {
        const auto b = cfg_.get_float_list("betas");
        ASSERT_EQ(b.size(), 2u) << "option betas";
        ref.beta1 = b[0];
        ref.beta2 = b[1];
      }
      if (cfg_.has("eps")) ref.eps = cfg_.get_float("eps");
      ref.p = init.to(at::kDouble);
      ref.m = at::zeros({kNumel}, at::kDouble);
      ref.v = at::zeros({kNumel}, at::kDouble);
    }
    at::Tensor params = at::empty({kNumel}, at::kFloat);
    StateDict at_resume;
    at::Tensor params_at_resume;
    std::vector<at::Tensor> params_after(kSteps + 1);
    for (int64_t t = 1; t <= kSteps; ++t) {
      const at::Tensor g = feed(*a.opt, s, t);
      const double sq = a.opt->finish_grads().item<double>();
      const double want = g.to(at::kDouble).square().sum().item<double>();
      EXPECT_NEAR(sq, want, 1e-6 * want)
          << "step " << t << ": finish_grads() is not the sum of squares of the "
          << "accumulated gradient";
      a.opt->step(args(t), params);
      params_after[t] = params.clone();
      StateDict sd;
      a.opt->save_state(sd);
      check_state(*a.opt, sd, "step " + std::to_string(t));
      EXPECT_TRUE(state_get(sd, "master").equal(params))
          << "step " << t
          << ": params_out is not the master weights (fp32 parameters: rounding changes nothing)";
      if (adamw) {
        const OptimizerStep x = args(t);
        ref.step(g, x.lr, x.weight_decay, x.grad_scale, t);
        expect_close(params, ref.p, 2e-5, 1e-6,
                     "step " + std::to_string(t) + ": parameters vs AdamW");
        if (state_get(sd, "exp_avg").defined())
          expect_close(state_get(sd, "exp_avg"), ref.m, 1e-5, 1e-7,
                       "step " + std::to_string(t) + ": exp_avg vs AdamW");
        if (state_get(sd, "exp_avg_sq").defined())
          expect_close(state_get(sd, "exp_avg_sq"), ref.v, 1e-5, 1e-9,
                       "step " + std::to_string(t) + ": exp_avg_sq vs AdamW");
      }
      if (t == kResumeAfter) {
        at_resume = sd;
        params_at_resume = params.clone();
      }
    }
    // accepts_sharded_parameters() (ciuic/optimizer.h, API 9): params_out a fresh tensor of NaNs
    // at every call (a parameter-sharding plugin's staging memory), the initial values gone after
    // setup(): the same bits, so nothing was read from either.
    if (a.opt->accepts_sharded_parameters()) {
      SCOPED_TRACE("accepts_sharded_parameters(): params_out a new tensor of NaNs at each call");
      Made c = make();
      at::Tensor initial = init.clone();
      c.opt->setup(setup(initial, accumulation));
      initial.fill_(NAN);
      for (int64_t t = 1; t <= kSteps; ++t) {
        feed(*c.opt, s, t);
        c.opt->finish_grads();
        at::Tensor out = at::full({kNumel}, NAN, at::kFloat);
        c.opt->step(args(t), out);
        EXPECT_TRUE(out.equal(params_after[t]))
            << "step " << t << ": params_out differs when it holds NaNs before step() and the "
            << "initial values are overwritten after setup(): the optimizer reads one of them "
            << "(or leaves elements unwritten), yet accepts_sharded_parameters() is true";
      }
      at::Tensor out = at::full({kNumel}, NAN, at::kFloat);
      c.opt->write_params(out, kSteps);
      EXPECT_TRUE(out.equal(params_after[kSteps]))
          << "write_params() into a tensor of NaNs is not the last step's parameters, yet "
             "accepts_sharded_parameters() is true";
    }
    // Resume: a new optimizer, set up from the parameters at the checkpoint, loads the state and
    // writes the parameters, then trains on exactly as the original did.
    Made b = make();
    b.opt->setup(setup(params_at_resume.clone(), accumulation));
    b.opt->load_state(at_resume);
    at::Tensor resumed = at::full({kNumel}, 7.0f, at::kFloat);
    b.opt->write_params(resumed, /*t=*/kResumeAfter);
    EXPECT_TRUE(resumed.equal(params_at_resume))
        << "write_params() after load_state() is not the saved parameters";
    for (int64_t t = kResumeAfter + 1; t <= kSteps; ++t) {
      feed(*b.opt, s, t);
      b.opt->finish_grads();
      b.opt->step(args(t), resumed);
      EXPECT_TRUE(resumed.equal(params_after[t]))
          << "resumed after step " << kResumeAfter << ": step " << t
          << "'s parameters differ from the uninterrupted run's (bit for bit)";
    }
  }

 private:
  const PluginUnderTest& plugin_;
  const CheckOptions& o_;
  const Config cfg_;
  const std::string dir_;
  RunContext ctx_;
  std::shared_ptr<PluginObject> precision_obj_;
  Precision* precision_ = nullptr;
};

}  // namespace

void check_optimizer(const PluginUnderTest& plugin, const CheckOptions& o) {
  ASSERT_EQ(plugin.slot(), Slot::kOptimizer) << plugin.path();
  ASSERT_TRUE(o.reference.empty() || o.reference == "adamw")
      << "unknown reference '" << o.reference << "' (known: adamw)";
  OptimizerCheck c(plugin, o);
  c.run(2);
  c.run(1);
}

}  // namespace ciuic::conformance
