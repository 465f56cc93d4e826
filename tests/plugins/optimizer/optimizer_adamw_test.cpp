// The AdamW optimizer plugins — adamw (on the run's device, ATen's fused kernel) and cpu_adam
// (host memory, SIMD) — against torch::optim::AdamW (the C++ frontend: mul_/add_/addcmul_/
// addcdiv_ on separate tensors, an independent implementation), over 20 steps with weight decay,
// bias correction, a changing lr, decay / no-decay segments, grad_scale, bf16/fp16 gradient
// chunks and parameters, gradients arriving in several chunks per region; the gradient norm's
// sum of squares against fp64; the bf16/fp16 copy-back against at::Tensor::to() and hand-computed
// round-to-nearest-even on tie cases; a precision policy with its own rounding (used by the
// update and by write_params); state save/load round trips; every bad-input message; cpu_adam's
// early update (offer_early_update: regions updated as their last chunk arrives) against its
// update in step(), bit for bit, and its misuse.
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <algorithm>
#include <mutex>
#include <set>

#include <ATen/ATen.h>
#include <torch/optim/adamw.h>

#include <ciuic/config.h>
#include <ciuic/context.h>
#include <ciuic/error.h>
#include <ciuic/kit/fused_adamw.h>
#include <ciuic/kit/host_buffer.h>
#include <ciuic/kit/shard_optimizer.h>
#include <ciuic/optimizer.h>
#include <ciuic/precision.h>
#include <ciuic/store.h>

#include "recipe/recipe.h"
#include "registry/registry.h"

using ciuic::Optimizer;
using ciuic::OptimizerSetup;
using ciuic::OptimizerStep;
using ciuic::ShardSegment;
using ciuic::StateDict;

namespace {

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// ---- creating the optimizers -------------------------------------------------------------------

const ciuic::RunContext& context() {
  static const ciuic::RunContext ctx = [] {
    ciuic::RunContext c;
    c.store = ciuic::make_local_store(std::chrono::seconds(1));
    c.cpu_threads = 2;
    return c;
  }();
  return ctx;
}

const ciuic::Registry& registry() {
  static const ciuic::Registry r =
      ciuic::Registry::from_paths({CIUIC_PLUGIN_DIR + "/libciuic_optimizer_cpu_adam.so",
                                   CIUIC_PLUGIN_DIR + "/libciuic_optimizer_adamw.so"});
  return r;
}

// The [optimizer] section as the recipe validates it (defaults filled in, the plugin's schema).
ciuic::Config optimizer_config(const std::string& plugin, const std::string& options) {
  const std::string text =
      "[train]\nmax_steps = 1\n[data]\nplugin = \"synthetic\"\n"
      "[optimizer]\nplugin = \"" +
      plugin + "\"\n" + options;
  const ciuic::Recipe recipe = ciuic::Recipe::parse(text, "test.toml");
  return recipe.plugin_config(ciuic::Slot::kOptimizer,
                              *registry().get(ciuic::Slot::kOptimizer, plugin).info);
}

std::shared_ptr<Optimizer> make_optimizer(const std::string& plugin, const std::string& options) {
  return registry().create<Optimizer>(ciuic::Slot::kOptimizer, plugin,
                                      optimizer_config(plugin, options), context());
}
std::shared_ptr<Optimizer> make_cpu_adam(const std::string& options) {
  return make_optimizer("cpu_adam", options);
}
std::shared_ptr<Optimizer> make_adamw() { return make_optimizer("adamw", ""); }

// Every cpu_adam configuration worth testing on this machine: each supported SIMD level, the
// direct and the staged pipeline (tiles smaller than the shard), 1 and 3 threads.
struct Variant {
  std::string name, options;
};
std::vector<Variant> cpu_adam_variants() {
  std::vector<Variant> v;
  for (const char* simd : {"scalar", "avx2", "avx512"}) {
    try {
      make_cpu_adam(std::string("simd = \"") + simd + "\"");
    } catch (const ciuic::Error&) {
      continue;  // not supported by this CPU (tested below)
    }
    const std::string s = std::string("simd = \"") + simd + "\"\n";
    v.push_back({std::string(simd) + "/direct/1", s + "threads = 1\n"});
    v.push_back({std::string(simd) + "/direct/3", s + "threads = 3\n"});
    v.push_back({std::string(simd) + "/staged/3",
                 s + "threads = 3\npipeline = \"staged\"\ntile_size = 4096\n"});
  }
  return v;
}

// The default precision policy: fp32, round to nearest even (the base class's defaults).
const ciuic::Precision kNearestEven{};

// ---- the problem and the reference
// ---------------------------------------------------------------

// A shard of 10007 elements (not a multiple of any vector width): decay, no-decay (a "norm"),
// decay, no-decay (padding).
constexpr int64_t kNumel = 10007;
std::vector<ShardSegment> segments() {
  return {{0, 4000, true}, {4000, 4133, false}, {4133, 9990, true}, {9990, kNumel, false}};
}

// The plugins' defaults: betas (0.9, 0.999), eps 1e-8.
constexpr double kBeta1 = 0.9, kBeta2 = 0.999, kEps = 1e-8, kWeightDecay = 0.1;

OptimizerStep hyper(int64_t step, double grad_scale = 1.0) {
  OptimizerStep h;
  h.lr = 1e-3 * (0.5 + 0.05 * static_cast<double>(step));  // a changing (scheduled) lr
  h.weight_decay = kWeightDecay;
  h.grad_scale = grad_scale;
  h.t = step;
  return h;
}

// The shard's gradient regions, as a sharding would deliver them (not aligned to segments).
std::vector<ciuic::ShardRegion> regions() {
  return {{0, 3000}, {3000, 4000}, {7000, kNumel - 7000}};
}

// The gradient of step `step`: deterministic, varying magnitudes, some exact zeros.
at::Tensor gradient(int64_t step, at::ScalarType dtype) {
  at::Generator gen = at::detail::createCPUGenerator(1000 + static_cast<uint64_t>(step));
  at::Tensor g = at::randn({kNumel}, gen) * (0.01 * static_cast<double>(step % 5 + 1));
  g.narrow(0, 17, 5).zero_();
  return g.to(dtype);
}

at::Tensor initial_master() {
  at::Generator gen = at::detail::createCPUGenerator(7);
  return at::randn({kNumel}, gen) * 0.5;
}

// torch::optim::AdamW on the same shard, one parameter per segment, two groups.
class Reference {
 public:
  explicit Reference(const at::Tensor& init) {
    std::vector<at::Tensor> decay, no_decay;
    for (const ShardSegment& s : segments()) {
      params_.push_back(init.narrow(0, s.begin, s.end - s.begin).clone().set_requires_grad(true));
      (s.weight_decay ? decay : no_decay).push_back(params_.back());
    }
    const OptimizerStep h = hyper(1);
    auto opts = [&](double wd) {
      return std::make_unique<torch::optim::AdamWOptions>(
          torch::optim::AdamWOptions(h.lr).betas({kBeta1, kBeta2}).eps(kEps).weight_decay(wd));
    };
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(decay, opts(kWeightDecay));
    groups.emplace_back(no_decay, opts(0.0));
    opt_ = std::make_unique<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(h.lr));
  }

  // g: the gradient as given to the optimizer (any dtype); the reference sees fp32 g * scale.
  void step(const at::Tensor& g, const OptimizerStep& h) {
    at::Tensor g32 = g.to(at::kFloat);
    if (h.grad_scale != 1.0) g32 = g32 * h.grad_scale;
    size_t i = 0;
    for (const ShardSegment& s : segments())
      params_[i++].mutable_grad() = g32.narrow(0, s.begin, s.end - s.begin).clone();
    for (auto& group : opt_->param_groups())
      static_cast<torch::optim::AdamWOptions&>(group.options()).lr(h.lr);
    opt_->step();
  }

  at::Tensor master() const { return at::cat(params_).detach(); }
  at::Tensor moment(bool second) const {
    std::vector<at::Tensor> parts;
    for (const at::Tensor& p : params_) {
      auto& st =
          static_cast<torch::optim::AdamWParamState&>(*opt_->state().at(p.unsafeGetTensorImpl()));
      parts.push_back(second ? st.exp_avg_sq() : st.exp_avg());
    }
    return at::cat(parts);
  }

 private:
  std::vector<at::Tensor> params_;
  std::unique_ptr<torch::optim::AdamW> opt_;
};

// Largest relative difference |a - b| / max(|b|, rms(b)) over all elements: relative to the
// element, except that elements far below the tensor's typical magnitude (a parameter crossing
// zero) are measured against that magnitude instead of their own.
double max_rel(const at::Tensor& a, const at::Tensor& b) {
  const double rms = b.square().mean().sqrt().item<double>();
  return ((a - b).abs() / b.abs().clamp_min(rms)).max().item<double>();
}

// `init` in the parameter dtype (as the model holds it), the shard's regions and segments.
// `grad_dtype`: the dtype of the chunks feed() will hand over (OptimizerSetup::grad_dtype).
OptimizerSetup make_setup(at::ScalarType param_dtype, const at::Tensor& init,
                          const ciuic::Precision* precision = &kNearestEven,
                          at::ScalarType grad_dtype = at::kFloat) {
  OptimizerSetup s;
  s.numel = init.numel();
  s.segments =
      init.numel() == kNumel ? segments() : std::vector<ShardSegment>{{0, init.numel(), true}};
  s.grad_regions =
      init.numel() == kNumel ? regions() : std::vector<ciuic::ShardRegion>{{0, init.numel()}};
  s.initial = {ciuic::ShardValues{0, init.to(param_dtype)}};
  s.param_dtype = param_dtype;
  s.precision = precision;
  s.grad_dtype = grad_dtype;
  return s;
}

struct RunResult {
  at::Tensor master, exp_avg, exp_avg_sq, params;
};

RunResult state_of(const Optimizer& o, const at::Tensor& params) {
  StateDict sd;
  o.save_state(sd);
  return {ciuic::state_get(sd, "master"), ciuic::state_get(sd, "exp_avg"),
          ciuic::state_get(sd, "exp_avg_sq"), params.cpu().clone()};
}

// Hands `g` over region by region (in a scrambled order), in `parts` contributions that sum to g
// (the first assigns, the others add, the last is marked), as a sharding with `parts` reduced
// micro-batches would; returns finish_grads()'s sum of squares.
double feed(Optimizer& o, const at::Tensor& g, int parts = 1, c10::Device device = c10::kCPU) {
  const auto rs = regions();
  std::vector<at::Tensor> pieces;
  at::Tensor rest = g.to(at::kFloat);
  for (int k = 0; k + 1 < parts; ++k) {
    at::Tensor piece = (g.to(at::kFloat) * (0.25 * (k + 1))).to(g.scalar_type()).to(at::kFloat);
    pieces.push_back(piece);
    rest = rest - piece;
  }
  pieces.push_back(rest);
  const int n = static_cast<int>(rs.size());
  for (int k = 0; k < parts; ++k)
    for (int j = 0; j < n; ++j) {
      const int i = (j * 2 + k) % n;  // another order for each contribution
      const auto& r = rs[static_cast<size_t>(i)];
      // Contributions in fp32 keep the sum exact; a single one keeps g's own dtype.
      const at::Tensor chunk = (parts == 1 ? g : pieces[static_cast<size_t>(k)])
                                   .narrow(0, r.offset, r.numel)
                                   .contiguous()
                                   .to(device);
      o.accumulate_grad(i, chunk, /*first=*/k == 0, /*last=*/k + 1 == parts);
    }
  const at::Tensor sq = o.finish_grads();
  EXPECT_EQ(sq.scalar_type(), at::kDouble);
  EXPECT_EQ(sq.numel(), 1);
  return sq.cpu().item<double>();
}

// Runs steps [first, last] on `o` (and on `ref` when given).
void run_steps(Optimizer& o, Reference* ref, int64_t first, int64_t last, at::ScalarType grad_dtype,
               double grad_scale, at::Tensor& params) {
  for (int64_t t = first; t <= last; ++t) {
    const at::Tensor g = gradient(t, grad_dtype);
    feed(o, g, 1, params.device());
    o.step(hyper(t, grad_scale), params);
    if (ref) ref->step(g, hyper(t, grad_scale));
  }
}

// 20 steps against torch::optim::AdamW; returns the optimizer's final state.
// On `device` (CUDA: the chunks and parameters live there); `one_chunk`: the setup's
// one_chunk_per_step (feed() hands over one chunk per region and step).
// `v_tol`: the tolerance on exp_avg_sq (ATen's CUDA AdamW rounds 1 - beta2 to fp32: 0.999 gives
// 1 - 1.3e-5 of the exact 0.001 in every v).
RunResult check_against_torch(Optimizer& o, at::ScalarType param_dtype, at::ScalarType grad_dtype,
                              double grad_scale, c10::Device device = c10::kCPU,
                              bool one_chunk = false, double v_tol = 1e-6) {
  const at::Tensor init = initial_master().to(param_dtype).to(at::kFloat);
  OptimizerSetup setup = make_setup(param_dtype, init.to(device), &kNearestEven, grad_dtype);
  setup.device = device;
  setup.one_chunk_per_step = one_chunk;
  o.setup(setup);
  Reference ref(init);
  at::Tensor params = at::empty({kNumel}, at::TensorOptions().dtype(param_dtype).device(device));
  run_steps(o, &ref, 1, 20, grad_dtype, grad_scale, params);
  RunResult r = state_of(o, params);
  EXPECT_LT(max_rel(r.master, ref.master()), 1e-6);
  EXPECT_LT(max_rel(r.exp_avg, ref.moment(false)), 1e-6);
  EXPECT_LT(max_rel(r.exp_avg_sq, ref.moment(true)), v_tol);
  // The parameters are the master rounded to their dtype, exactly as ATen rounds.
  EXPECT_TRUE(at::equal(r.params, r.master.to(param_dtype)));
  return r;
}

void expect_bitwise_equal(const RunResult& a, const RunResult& b, const std::string& what) {
  EXPECT_TRUE(at::equal(a.master, b.master)) << what;
  EXPECT_TRUE(at::equal(a.exp_avg, b.exp_avg)) << what;
  EXPECT_TRUE(at::equal(a.exp_avg_sq, b.exp_avg_sq)) << what;
  EXPECT_TRUE(at::equal(a.params, b.params)) << what;
}

}  // namespace

// ---- adamw (on the device) ----------------------------------------------------------------------

TEST(OptimizerAdamw, MatchesTorchAdamWInFp32) {
  check_against_torch(*make_adamw(), at::kFloat, at::kFloat, 1.0);
}

TEST(OptimizerAdamw, GradScaleBf16ChunksBf16Parameters) {
  check_against_torch(*make_adamw(), at::kBFloat16, at::kBFloat16, 0.37 / 1024);
}

TEST(OptimizerAdamw, Fp16ChunksAndParameters) {
  check_against_torch(*make_adamw(), at::kHalf, at::kHalf, 1.0 / 65536);
}

// ---- adamw on a GPU: the optim kit's one-launch kernel (skipped without CUDA) -------------------

namespace {
bool have_cuda() { return at::hasCUDA(); }
const c10::Device kCuda(c10::kCUDA, 0);
}  // namespace

// kernel = "auto" on CUDA: FusedAdamWShard, against torch::optim::AdamW, with the gradient kept in
// its own dtype (one chunk a step) or accumulated in fp32, every parameter dtype, grad_scale, the
// unaligned segments of the CPU cases (4000 | 4133 | 9990 | 10007: scalar heads and tails).
TEST(OptimizerAdamwCuda, ShardKernelMatchesTorchAdamW) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  struct Case {
    at::ScalarType param, grad;
    double scale;
    bool one_chunk;
  };
  for (const Case& c :
       {Case{at::kFloat, at::kFloat, 1.0, true},
        Case{at::kBFloat16, at::kBFloat16, 0.37 / 1024, true},
        Case{at::kHalf, at::kHalf, 1.0 / 65536, true}, Case{at::kBFloat16, at::kFloat, 0.5, false},
        Case{at::kBFloat16, at::kBFloat16, 1.0, false}}) {
    SCOPED_TRACE(std::string(c10::toString(c.param)) + " params, " + c10::toString(c.grad) +
                 " chunks, one chunk " + std::to_string(c.one_chunk));
    auto o = make_adamw();
    check_against_torch(*o, c.param, c.grad, c.scale, kCuda, c.one_chunk);
    // The gradient shard: kept in the chunks' dtype exactly when they come once a step and narrow.
    const uint64_t grad_bytes = c.one_chunk ? c10::elementSize(c.grad) : 4;
    EXPECT_EQ(o->memory().device_bytes, static_cast<uint64_t>((12 + grad_bytes) * kNumel));
  }
}

// kernel = "aten" on CUDA (ATen's multi-tensor AdamW, fp32 gradient shard): the same answers
// except that ATen's CUDA kernel takes 1 - beta2 in fp32 (v off by 1.3e-5 relative; the kit's
// kernel gets 1 - beta2 from fp64), and the two kernels agree.
TEST(OptimizerAdamwCuda, AtenKernelOptionAndTheTwoKernelsAgree) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  auto aten = make_optimizer("adamw", "kernel = \"aten\"\n");
  const RunResult a =
      check_against_torch(*aten, at::kBFloat16, at::kBFloat16, 0.25, kCuda, true, 2e-5);
  EXPECT_EQ(aten->memory().device_bytes,
            static_cast<uint64_t>(16 * kNumel));  // fp32 gradient shard
  auto fused = make_adamw();
  const RunResult f = check_against_torch(*fused, at::kBFloat16, at::kBFloat16, 0.25, kCuda, true);
  EXPECT_LT(max_rel(f.master, a.master), 1e-6);
  EXPECT_LT(max_rel(f.exp_avg, a.exp_avg), 1e-6);
  EXPECT_LT(max_rel(f.exp_avg_sq, a.exp_avg_sq), 2e-5);
}

// A gradient kept narrow cannot take a second chunk in the step: a clear error, not a silent bf16
// sum.
TEST(OptimizerAdamwCuda, NarrowGradientRefusesASecondChunk) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  auto o = make_adamw();
  OptimizerSetup setup =
      make_setup(at::kBFloat16, initial_master().to(kCuda), &kNearestEven, at::kBFloat16);
  setup.device = kCuda;
  setup.one_chunk_per_step = true;
  o->setup(setup);
  const at::Tensor chunk = at::ones({3000}, at::TensorOptions().dtype(at::kBFloat16).device(kCuda));
  o->accumulate_grad(0, chunk, true, false);
  try {
    o->accumulate_grad(0, chunk, false, true);
    ADD_FAILURE() << "a second chunk was accepted";
  } catch (const ciuic::Error& e) {
    EXPECT_TRUE(
        contains(e.what(),
                 "optimizer adamw: region 0 received a second gradient chunk in one step, but "
                 "setup() promised one chunk per step"))
        << e.what();
  }
}

// The kernel directly against ATen's at::_fused_adamw_ (the optim kit's fused_adamw) on a shard
// of several tiles (65536 elements each) with segment boundaries inside tiles and vectors, weight
// decay, grad_scale and every gradient / parameter dtype; the rounded parameters are exactly
// master.to(dtype).
TEST(OptimizerAdamwCuda, KernelMatchesAtenFusedAdamWOnManyTiles) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  const int64_t n = 3 * 65536 + 12345;
  const std::vector<ShardSegment> segs = {
      {0, 70001, true}, {70001, 70003, false}, {70003, 200002, true}, {200002, n, false}};
  for (at::ScalarType gd : {at::kFloat, at::kBFloat16, at::kHalf})
    for (at::ScalarType pd : {at::kFloat, at::kBFloat16, at::kHalf}) {
      SCOPED_TRACE(std::string(c10::toString(gd)) + " gradient, " + c10::toString(pd) +
                   " parameters");
      const auto f32 = at::TensorOptions().dtype(at::kFloat).device(kCuda);
      at::Generator gen = at::detail::createCPUGenerator(11);
      at::Tensor master = (at::randn({n}, gen) * 0.5).to(f32),
                 m = (at::randn({n}, gen) * 0.01).to(f32), v = (at::rand({n}, gen) * 1e-4).to(f32);
      const at::Tensor g = (at::randn({n}, gen) * 0.02).to(kCuda).to(gd);
      at::Tensor master2 = master.clone(), m2 = m.clone(), v2 = v.clone();
      at::Tensor params = at::empty({n}, at::TensorOptions().dtype(pd).device(kCuda));
      ciuic::kit::FusedAdamWShard k(segs, n, kCuda);
      EXPECT_EQ(k.tiles(), 2 + 1 + 2 + 1);  // segments of 70001, 2, 129999 and 8951 elements
      ciuic::kit::FusedAdamWShard::Hyper h;
      h.lr = 3e-4;
      h.weight_decay = 0.1;
      h.grad_scale = 0.7;
      h.t = 5;
      k.step(master, g, m, v, &params, h);
      // ATen: fp32 gradient times grad_scale, one call per weight-decay group.
      const at::Tensor g32 = g.to(at::kFloat) * h.grad_scale;
      ciuic::kit::ShardOptimizer::Group decay, plain;
      for (auto* grp : {&decay, &plain}) grp->moments.resize(2);
      for (const ShardSegment& sg : segs) {
        auto& grp = sg.weight_decay ? decay : plain;
        const int64_t len = sg.end - sg.begin;
        grp.master.push_back(master2.narrow(0, sg.begin, len));
        grp.grad.push_back(g32.narrow(0, sg.begin, len));
        grp.moments[0].push_back(m2.narrow(0, sg.begin, len));
        grp.moments[1].push_back(v2.narrow(0, sg.begin, len));
      }
      ciuic::kit::fused_adamw(decay, h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, h.t);
      ciuic::kit::fused_adamw(plain, h.lr, h.beta1, h.beta2, h.eps, 0.0, h.t);
      EXPECT_LT(max_rel(master.cpu(), master2.cpu()), 1e-6);
      EXPECT_LT(max_rel(m.cpu(), m2.cpu()), 1e-6);
      EXPECT_LT(max_rel(v.cpu(), v2.cpu()), 2e-5);  // ATen's 1 - beta2 in fp32 (above)
      EXPECT_TRUE(at::equal(params.cpu(), master.cpu().to(pd)));
    }
  // Bad input names what is wrong.
  ciuic::kit::FusedAdamWShard k(segs, n, kCuda);
  at::Tensor a = at::zeros({n}, at::TensorOptions().device(kCuda)), b = a.clone(), c = a.clone();
  const at::Tensor short_grad = at::zeros({n - 1}, at::TensorOptions().device(kCuda));
  try {
    k.step(a, short_grad, b, c, nullptr, ciuic::kit::FusedAdamWShard::Hyper{});
    ADD_FAILURE() << "a short gradient was accepted";
  } catch (const ciuic::Error& e) {
    EXPECT_TRUE(
        contains(e.what(),
                 "fused AdamW: the gradient must be a contiguous, 16-byte aligned fp32, bf16 or "
                 "fp16 tensor of " +
                     std::to_string(n) + " elements"))
        << e.what();
  }
}

// Without CUDA the kernel says so, and `kernel` takes only its two values.
TEST(OptimizerAdamw, KernelOptionAndAvailability) {
  EXPECT_FALSE(ciuic::kit::FusedAdamWShard::available(c10::Device(c10::kCPU)));
  if (!have_cuda()) {
    try {
      ciuic::kit::FusedAdamWShard k({{0, 10, true}}, 10, c10::Device(c10::kCPU));
      ADD_FAILURE() << "constructed without CUDA";
    } catch (const ciuic::Error& e) {
      EXPECT_TRUE(contains(e.what(), "fused AdamW: needs a CUDA device and a CUDA build of ciuic"))
          << e.what();
    }
  }
  // "aten" on CPU runs exactly like the default there (ATen's kernel in both).
  const RunResult a = check_against_torch(*make_optimizer("adamw", "kernel = \"aten\"\n"),
                                          at::kFloat, at::kFloat, 1.0);
  const RunResult d = check_against_torch(*make_adamw(), at::kFloat, at::kFloat, 1.0);
  expect_bitwise_equal(a, d, "aten vs auto on CPU");
  try {
    make_optimizer("adamw", "kernel = \"triton\"\n");
    ADD_FAILURE() << "kernel = triton was accepted";
  } catch (const std::exception& e) {
    EXPECT_TRUE(
        contains(e.what(),
                 "test.toml:7:10: [optimizer] (plugin adamw) kernel: \"triton\" is not allowed: "
                 "expected one of \"auto\", \"aten\""))
        << e.what();
  }
}

// ---- cpu_adam ----------------------------------------------------------------------------------

TEST(OptimizerCpuAdam, EveryVariantMatchesTorchAdamWAndTheOthersBitwise) {
  const auto variants = cpu_adam_variants();
  ASSERT_GE(variants.size(), 3u);  // scalar is always there
  struct Case {
    at::ScalarType param, grad;
    double scale;
  };
  for (const Case& c :
       {Case{at::kFloat, at::kFloat, 1.0}, Case{at::kBFloat16, at::kBFloat16, 0.37 / 1024},
        Case{at::kHalf, at::kHalf, 1.0 / 65536}, Case{at::kBFloat16, at::kFloat, 0.5}}) {
    std::optional<RunResult> first;
    for (const Variant& v : variants) {
      SCOPED_TRACE(v.name + " param " + c10::toString(c.param) + " grad " + c10::toString(c.grad));
      auto o = make_cpu_adam(v.options);
      RunResult r = check_against_torch(*o, c.param, c.grad, c.scale);
      // Every SIMD level, thread count and pipeline computes the same IEEE operations.
      if (first)
        expect_bitwise_equal(r, *first, v.name + " vs " + variants.front().name);
      else
        first = r;
    }
  }
}

TEST(OptimizerCpuAdam, MemoryAndMetrics) {
  auto o = make_cpu_adam("threads = 2");
  o->setup(make_setup(at::kFloat, initial_master()));
  // master, m, v and the gradient shard; on a CPU run that is the run's "device" memory.
  EXPECT_EQ(o->memory().device_bytes, static_cast<uint64_t>(16 * kNumel));
  EXPECT_EQ(o->memory().host_bytes, 0u);
  at::Tensor params = at::empty({kNumel});
  feed(*o, gradient(1, at::kFloat));
  o->step(hyper(1), params);
  ciuic::Metrics m;
  o->append_metrics(m);
  std::vector<std::string> keys;
  for (auto& kv : m.values) keys.push_back(kv.first);
  EXPECT_EQ(keys, (std::vector<std::string>{"optim_host_gib", "optim_step_s", "optim_update_s",
                                            "optim_copy_wait_s", "optim_update_early",
                                            "optim_update_wait_s", "grad_host_fold_s",
                                            "grad_host_blocked_s"}));
  EXPECT_NEAR(m.values[0].second, 16.0 * kNumel / (1 << 30), 1e-12);
  EXPECT_GT(m.values[2].second, 0.0);

  auto staged = make_cpu_adam("pipeline = \"staged\"\ntile_size = 4096");
  staged->setup(make_setup(at::kBFloat16, initial_master()));
  // master, m, v, gradient + 4 fp32 landing slots of the largest region (4000) + two bf16 tiles.
  EXPECT_EQ(staged->memory().device_bytes,
            static_cast<uint64_t>(16 * kNumel + 4 * 4000 * 4 + 2 * 2 * 4096));
}

// ---- both: the gradient sink --------------------------------------------------------------------

namespace {
std::vector<std::pair<std::string, std::function<std::shared_ptr<Optimizer>()>>> all_optimizers() {
  return {{"adamw", [] { return make_adamw(); }},
          {"cpu_adam direct", [] { return make_cpu_adam("threads = 2"); }},
          {"cpu_adam staged",
           [] { return make_cpu_adam("threads = 2\npipeline = \"staged\"\ntile_size = 4096"); }}};
}
}  // namespace

TEST(OptimizerGradSink, SquaresMatchFp64AndSeveralContributionsSum) {
  for (const auto& [name, make] : all_optimizers()) {
    SCOPED_TRACE(name);
    for (int parts : {1, 3}) {
      auto o = make();
      o->setup(make_setup(at::kFloat, initial_master()));
      const at::Tensor g = gradient(3, at::kFloat);
      const double sq = feed(*o, g, parts);
      const double want = g.to(at::kDouble).square().sum().item<double>();
      EXPECT_NEAR(sq, want, 1e-6 * want) << parts << " contribution(s)";
      // A second step starts from nothing: the first chunk assigns.
      const double again = feed(*o, g, parts);
      EXPECT_NEAR(again, want, 1e-6 * want);
      // And the update uses the accumulated gradient: as torch with g.
      at::Tensor params = at::empty({kNumel});
      o->step(hyper(1), params);
      auto ref = make();
      ref->setup(make_setup(at::kFloat, initial_master()));
      feed(*ref, g, 1);
      at::Tensor p1 = at::empty({kNumel});
      ref->step(hyper(1), p1);
      EXPECT_LT(max_rel(params, p1), 1e-6);
    }
  }
}

// A policy that truncates toward zero: every optimizer must write parameters through it, after
// updates and in write_params() (resume).
// It records the updates and the elements (global positions) it was asked to round.
class TowardZero final : public ciuic::Precision {
 public:
  at::ScalarType param_dtype() const override { return at::kBFloat16; }
  bool rounds_to_nearest() const override { return false; }
  void round_to_param(const at::Tensor& master, at::Tensor& out, int64_t t,
                      const std::vector<ciuic::PositionSpan>& positions) const override {
    std::lock_guard<std::mutex> l(mu);
    calls++;
    ts.insert(t);
    int64_t at = 0;
    for (const auto& p : positions) {
      EXPECT_EQ(p.offset, at);
      at += p.length;
      for (int64_t i = 0; i < p.length; ++i) globals.push_back(p.global < 0 ? -1 : p.global + i);
    }
    EXPECT_EQ(at, out.numel());
    // bf16 = the top 16 bits of the fp32 pattern: dropping the rest truncates toward zero.
    out.copy_((master.contiguous().view(at::kInt).bitwise_and(static_cast<int32_t>(0xFFFF0000u)))
                  .view(at::kFloat)
                  .to(at::kBFloat16));
  }
  mutable std::mutex mu;
  mutable int calls = 0;
  mutable std::set<int64_t> ts;
  mutable std::vector<int64_t> globals;
};

TEST(OptimizerRounding, PrecisionPolicyRoundsTheParameters) {
  for (const auto& [name, make] : all_optimizers()) {
    SCOPED_TRACE(name);
    TowardZero tz;
    auto o = make();
    // The shard's first half is the model's elements from 5000 on, the rest padding.
    const int64_t half = kNumel / 2;
    OptimizerSetup setup = make_setup(at::kBFloat16, initial_master(), &tz);
    setup.positions = {{0, half, 5000}, {half, kNumel - half, -1}};
    o->setup(setup);
    at::Tensor params = at::empty({kNumel}, at::kBFloat16);
    run_steps(*o, nullptr, 1, 3, at::kFloat, 1.0, params);
    EXPECT_GT(tz.calls, 0);
    StateDict sd;
    o->save_state(sd);
    const at::Tensor master = ciuic::state_get(sd, "master");
    const at::Tensor truncated = master.view(at::kInt)
                                     .bitwise_and(static_cast<int32_t>(0xFFFF0000u))
                                     .view(at::kFloat)
                                     .to(at::kBFloat16);
    EXPECT_TRUE(at::equal(params, truncated));
    EXPECT_FALSE(at::equal(params, master.to(at::kBFloat16)));  // nearest-even differs somewhere
    // Each update rounds for its own t (run_steps applies t = 1, 2, 3), and every shard element
    // once per update, at its position in the model (OptimizerSetup::positions).
    EXPECT_EQ(tz.ts, (std::set<int64_t>{1, 2, 3}));
    std::vector<int64_t> seen = tz.globals;
    std::sort(seen.begin(), seen.end());
    ASSERT_EQ(seen.size(), static_cast<size_t>(3 * kNumel));
    const size_t pad = static_cast<size_t>(3 * (kNumel - half));
    for (size_t i = 0; i < seen.size(); ++i)
      ASSERT_EQ(seen[i], i < pad ? -1 : 5000 + static_cast<int64_t>(i - pad) / 3) << i;
    // write_params (resume) goes through the policy too, for the last applied update's t.
    tz.ts.clear();
    at::Tensor again = at::zeros({kNumel}, at::kBFloat16);
    o->write_params(again, 3);
    EXPECT_TRUE(at::equal(again, truncated));
    EXPECT_EQ(tz.ts, (std::set<int64_t>{3}));
  }
}

// ---- shared: copy-back rounding, state round trip, errors
// -----------------------------------------

namespace {

float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// The master is loaded with `values`; one lr = 0 step leaves it unchanged, so params_out is
// `values` rounded.
at::Tensor copy_back(Optimizer& o, const std::vector<float>& values, at::ScalarType dtype) {
  const int64_t n = static_cast<int64_t>(values.size());
  o.setup(make_setup(dtype, at::zeros({n})));
  StateDict in = {
      {"master", at::tensor(values)}, {"exp_avg", at::zeros({n})}, {"exp_avg_sq", at::zeros({n})}};
  o.load_state(in);
  OptimizerStep h;
  h.lr = 0;
  h.weight_decay = 0;
  h.t = 1;
  at::Tensor params = at::empty({n}, at::TensorOptions().dtype(dtype));
  o.accumulate_grad(0, at::full({n}, 0.5f), true, true);
  o.finish_grads();
  o.step(h, params);
  StateDict sd;
  o.save_state(sd);
  EXPECT_TRUE(at::isclose(ciuic::state_get(sd, "master"), at::tensor(values), 0, 0,
                          /*equal_nan=*/true)
                  .all()
                  .item<bool>());
  return params;
}

// (input bits, expected bf16 bits): ties go to the even neighbour.
const std::vector<std::pair<uint32_t, uint16_t>> kBf16Cases = {
    {0x3F808000u, 0x3F80},  // 1 + 2^-8: tie between 0x3F80 and 0x3F81 -> even 0x3F80
    {0x3F818000u, 0x3F82},  // tie between 0x3F81 and 0x3F82 -> even 0x3F82
    {0x3F808001u, 0x3F81},  // just above the tie -> up
    {0x3F807FFFu, 0x3F80},  // just below -> down
    {0xBF818000u, 0xBF82},  // negative tie -> even
    {0x7F7FFFFFu, 0x7F80},  // max float rounds to +inf
    {0x7F7F7FFFu, 0x7F7F},  // below the tie: largest finite bf16
    {0x7F800000u, 0x7F80},  // +inf
    {0xFF800000u, 0xFF80},  // -inf
    {0x00018000u, 0x0002},  // subnormal tie -> even
    {0x00008000u, 0x0000},  // subnormal tie -> even (zero)
    {0x00000001u, 0x0000},  // smallest subnormal -> 0
    {0x3F800000u, 0x3F80},  // exact
};

// (input, expected fp16 bits).
const std::vector<std::pair<float, uint16_t>> kHalfCases = {
    {1.0f + 0x1p-11f, 0x3C00},      // tie between 1 and 1 + 2^-10 -> even (1)
    {1.0f + 3 * 0x1p-11f, 0x3C02},  // tie -> even (1 + 2^-9)
    {1.0f + 0x1p-11f + 0x1p-20f, 0x3C01},
    {-(1.0f + 3 * 0x1p-11f), 0xBC02},
    {65504.0f, 0x7BFF},      // max half
    {65519.0f, 0x7BFF},      // below the tie with 65536 -> max half
    {65520.0f, 0x7C00},      // tie -> even = 2^16 = inf
    {1e6f, 0x7C00},          // overflow -> inf
    {0x1p-25f, 0x0000},      // half the smallest subnormal: tie -> even (0)
    {3 * 0x1p-25f, 0x0002},  // 1.5 subnormal ulps: tie -> even (2)
    {0x1p-24f, 0x0001},      // smallest subnormal
    {0x1p-14f, 0x0400},      // smallest normal
    {-2.5f, 0xC100},
};

// Repeats the cases so that they land in vector bodies and in ragged tails.
template <class T>
std::vector<T> repeated(const std::vector<T>& cases, int times) {
  std::vector<T> out;
  for (int i = 0; i < times; ++i) out.insert(out.end(), cases.begin(), cases.end());
  return out;
}

void check_copy_back(const std::function<std::shared_ptr<Optimizer>()>& make,
                     const std::string& what) {
  SCOPED_TRACE(what);
  {
    const auto cases = repeated(kBf16Cases, 5);  // 65 elements
    std::vector<float> in;
    for (auto& c : cases) in.push_back(from_bits(c.first));
    in.push_back(std::nanf(""));
    auto o = make();
    const at::Tensor out = copy_back(*o, in, at::kBFloat16);
    const at::Tensor bits = out.view(at::kShort);
    for (size_t i = 0; i < cases.size(); ++i)
      EXPECT_EQ(static_cast<uint16_t>(bits[i].item<int16_t>()), cases[i].second)
          << "bf16 case " << i % kBf16Cases.size() << " at " << i;
    EXPECT_TRUE(std::isnan(out[static_cast<int64_t>(cases.size())].item<float>()));
    // Against ATen's own float -> bf16 conversion (NaN payloads aside).
    const at::Tensor aten = at::tensor(in).to(at::kBFloat16);
    EXPECT_TRUE(at::equal(out.narrow(0, 0, static_cast<int64_t>(cases.size())),
                          aten.narrow(0, 0, static_cast<int64_t>(cases.size()))));
  }
  {
    const auto cases = repeated(kHalfCases, 5);
    std::vector<float> in;
    for (auto& c : cases) in.push_back(c.first);
    auto o = make();
    const at::Tensor out = copy_back(*o, in, at::kHalf);
    const at::Tensor bits = out.view(at::kShort);
    for (size_t i = 0; i < cases.size(); ++i)
      EXPECT_EQ(static_cast<uint16_t>(bits[i].item<int16_t>()), cases[i].second)
          << "fp16 case " << i % kHalfCases.size() << " at " << i;
    EXPECT_TRUE(at::equal(out, at::tensor(in).to(at::kHalf)));
  }
}

// Save after 8 steps, load into a fresh object, continue 8 steps: identical to not stopping.
void check_round_trip(const std::function<std::shared_ptr<Optimizer>()>& make,
                      const std::string& what) {
  SCOPED_TRACE(what);
  const at::Tensor init = initial_master();
  auto a = make();
  a->setup(make_setup(at::kBFloat16, init));
  at::Tensor pa = at::empty({kNumel}, at::kBFloat16);
  run_steps(*a, nullptr, 1, 8, at::kFloat, 0.7, pa);
  StateDict saved;
  a->save_state(saved);
  ASSERT_EQ(saved.size(), 3u);
  for (const auto& [key, t] : saved) {
    EXPECT_EQ(t.scalar_type(), at::kFloat) << key;
    EXPECT_EQ(t.dim(), 1) << key;
    EXPECT_EQ(t.numel(), kNumel) << key;
    EXPECT_TRUE(t.device().is_cpu()) << key;
  }
  const at::Tensor saved_master = ciuic::state_get(saved, "master").clone();

  auto b = make();
  b->setup(make_setup(at::kBFloat16, at::zeros({kNumel})));
  b->load_state(saved);
  at::Tensor pb = at::empty({kNumel}, at::kBFloat16);
  run_steps(*a, nullptr, 9, 16, at::kFloat, 0.7, pa);
  run_steps(*b, nullptr, 9, 16, at::kFloat, 0.7, pb);
  expect_bitwise_equal(state_of(*a, pa), state_of(*b, pb), "resumed vs uninterrupted");
  // The saved tensors were copies, not views of the live state.
  EXPECT_TRUE(at::equal(ciuic::state_get(saved, "master"), saved_master));
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ciuic::Error& e) {
    return e.what();
  }
  return "(no error)";
}

void check_errors(const std::function<std::shared_ptr<Optimizer>()>& make, const std::string& who) {
  SCOPED_TRACE(who);
  auto o = make();
  at::Tensor params = at::empty({kNumel});
  std::string e = error_of([&] { o->step(hyper(1), params); });
  EXPECT_TRUE(contains(e, who + ": step() called before setup()")) << e;

  OptimizerSetup s = make_setup(at::kFloat, initial_master());
  s.segments = {{0, 100, true}, {120, kNumel, false}};
  e = error_of([&] { o->setup(s); });
  EXPECT_TRUE(contains(e, who + ": setup() segment 1 is [120, 10007)")) << e;
  EXPECT_TRUE(contains(e, "starting at 100")) << e;
  s.segments = {{0, 100, true}};
  e = error_of([&] { o->setup(s); });
  EXPECT_TRUE(contains(e, "segments end at 100 but the shard has 10007 elements")) << e;
  s = make_setup(at::kFloat, initial_master());
  s.grad_regions = {{0, 5000}, {6000, 4007}};
  e = error_of([&] { o->setup(s); });
  EXPECT_TRUE(contains(e, who + ": setup() gradient region 1 is [6000, 10007)")) << e;
  s = make_setup(at::kFloat, initial_master());
  s.initial = {ciuic::ShardValues{10000, at::zeros({100})}};
  e = error_of([&] { o->setup(s); });
  EXPECT_TRUE(contains(e, who + ": setup() initial values [10000, 10100) lie outside the shard"))
      << e;
  s = make_setup(at::kFloat, initial_master());
  s.param_dtype = at::kDouble;
  e = error_of([&] { o->setup(s); });
  EXPECT_TRUE(contains(e, "parameter dtype Double is not supported")) << e;
  s = make_setup(at::kFloat, initial_master());
  s.grad_dtype = at::kDouble;
  e = error_of([&] { o->setup(s); });
  EXPECT_TRUE(contains(e, who + ": gradient dtype Double is not supported (fp32, bf16 or fp16)"))
      << e;
  s = make_setup(at::kFloat, initial_master());
  s.precision = nullptr;
  e = error_of([&] { o->setup(s); });
  EXPECT_TRUE(contains(e, who + ": setup() without a precision policy")) << e;

  o->setup(make_setup(at::kFloat, initial_master()));
  e = error_of([&] { o->accumulate_grad(7, at::zeros({5}), true, true); });
  EXPECT_TRUE(contains(e, who + ": gradient chunk for region 7: there are 3 regions")) << e;
  e = error_of([&] { o->accumulate_grad(1, at::zeros({5}), true, true); });
  EXPECT_TRUE(contains(e, who + ": gradient chunk for region 1 must be a contiguous Float tensor "
                                "of 4000 elements on cpu, got a Float tensor of 5 elements on cpu"))
      << e;
  // A chunk in another dtype than setup() was told (OptimizerSetup::grad_dtype).
  e = error_of([&] { o->accumulate_grad(1, at::zeros({4000}, at::kBFloat16), true, true); });
  EXPECT_TRUE(contains(e, who + ": gradient chunk for region 1 must be a contiguous Float tensor "
                                "of 4000 elements on cpu, got a BFloat16 tensor"))
      << e;
  feed(*o, gradient(1, at::kFloat));
  at::Tensor half_params = params.to(at::kHalf);
  e = error_of([&] { o->step(hyper(1), half_params); });
  EXPECT_TRUE(contains(
      e, "params_out must be a contiguous Float tensor of 10007 elements on cpu, got a Half"))
      << e;
  e = error_of([&] { o->step(hyper(1, NAN), params); });
  EXPECT_TRUE(contains(e, "grad_scale must be finite and > 0")) << e;
  OptimizerStep t0 = hyper(1);
  t0.t = 0;
  e = error_of([&] { o->step(t0, params); });
  EXPECT_TRUE(contains(e, "step count t must be >= 1, got 0")) << e;

  StateDict sd;
  o->save_state(sd);
  StateDict missing = {sd[0], sd[2]};
  e = error_of([&] { o->load_state(missing); });
  EXPECT_TRUE(contains(e, who + ": optimizer state has no \"exp_avg\" tensor")) << e;
  StateDict wrong = sd;
  wrong[2].second = at::zeros({kNumel - 1});
  e = error_of([&] { o->load_state(wrong); });
  EXPECT_TRUE(contains(
      e, "\"exp_avg_sq\" must be a 1-D fp32 tensor of 10007 elements, got a Float tensor of 10006"))
      << e;
  // A refused state leaves the object as it was.
  StateDict after;
  o->save_state(after);
  EXPECT_TRUE(at::equal(after[0].second, sd[0].second));
}

}  // namespace

TEST(OptimizerAdamw, CopyBackRoundsToNearestEven) { check_copy_back(make_adamw, "adamw"); }

TEST(OptimizerCpuAdam, CopyBackRoundsToNearestEven) {
  for (const Variant& v : cpu_adam_variants())
    check_copy_back([&] { return make_cpu_adam(v.options); }, v.name);
}

TEST(OptimizerAdamw, StateRoundTripContinuesIdentically) { check_round_trip(make_adamw, "adamw"); }

TEST(OptimizerCpuAdam, StateRoundTripContinuesIdentically) {
  check_round_trip([] { return make_cpu_adam(""); }, "cpu_adam direct");
  check_round_trip([] { return make_cpu_adam("pipeline = \"staged\"\ntile_size = 4096"); },
                   "cpu_adam staged");
}

TEST(OptimizerAdamw, BadInputMessages) { check_errors(make_adamw, "optimizer adamw"); }

TEST(OptimizerCpuAdam, BadInputMessages) {
  check_errors([] { return make_cpu_adam(""); }, "optimizer cpu_adam");
}

TEST(OptimizerCpuAdam, OptionErrors) {
  // Checked by the recipe against the plugin's declared options.
  std::string e = error_of([] { optimizer_config("cpu_adam", "simd = \"sse\""); });
  EXPECT_TRUE(contains(e, "simd")) << e;
  EXPECT_TRUE(contains(e, "auto")) << e;
  e = error_of([] { optimizer_config("cpu_adam", "tile_size = 10"); });
  EXPECT_TRUE(contains(e, "tile_size")) << e;
  e = error_of([] { optimizer_config("cpu_adam", "threads = -1"); });
  EXPECT_TRUE(contains(e, "threads")) << e;
  e = error_of([] { make_cpu_adam("betas = [0.9, 1.0]"); });
  EXPECT_TRUE(contains(
      e, "[optimizer] betas = [0.9, 1.0]: expected two numbers [beta1, beta2], each in [0, 1)"))
      << e;
  // Checked by the plugin: a forced SIMD level this CPU lacks.
  for (const char* level : {"avx512", "avx2"}) {
    e = error_of([&] { make_cpu_adam(std::string("simd = \"") + level + "\""); });
    if (e == "(no error)") continue;  // supported here
    EXPECT_TRUE(contains(e, "test.toml:")) << e;
    EXPECT_TRUE(
        contains(e, "[optimizer] simd = \"" + std::string(level) + "\": this CPU does not support"))
        << e;
    EXPECT_TRUE(contains(e, "it supports")) << e;
  }
}

// ---- cpu_adam: the early update ---------------------------------------------------------------
// offer_early_update() accepted: each region is updated on the fold thread as soon as its last
// chunk of the step is folded; step() only waits and copies the parameters out. Bit for bit the
// update in step(), for every variant, parameter and gradient dtype, 1 and 3 contributions per
// step (the update must wait for the last one), and a precision policy with its own rounding.

namespace {

double metric(const Optimizer& o, const std::string& key) {
  ciuic::Metrics m;
  o.append_metrics(m);
  for (const auto& [k, v] : m.values)
    if (k == key) return v;
  ADD_FAILURE() << "no metric " << key;
  return NAN;
}

// `steps` steps of `parts` contributions each; with `offer`, each step is offered for an early
// update first (which must be accepted). The state after every step.
std::vector<RunResult> run_offered(Optimizer& o, bool offer, int64_t steps, int parts,
                                   at::ScalarType param, at::ScalarType grad, double scale,
                                   c10::Device device = c10::kCPU) {
  at::Tensor params = at::empty({kNumel}, at::TensorOptions().dtype(param).device(device));
  std::vector<RunResult> out;
  for (int64_t t = 1; t <= steps; ++t) {
    if (offer) EXPECT_TRUE(o.offer_early_update(hyper(t, scale)));
    feed(o, gradient(t, grad), parts, device);
    if (offer) {
      // The regions were queued for their update before step(): the state is partly updated
      // until step() finishes it, and may not be saved meanwhile.
      StateDict sd;
      EXPECT_THROW(o.save_state(sd), ciuic::Error);
    }
    o.step(hyper(t, scale), params);
    out.push_back(state_of(o, params));
    EXPECT_EQ(metric(o, "optim_update_early"), offer ? 1.0 : 0.0);
  }
  return out;
}

// `one_chunk`: the setup's one_chunk_per_step (parts must be 1); `device`: where chunks and
// parameters live (CUDA: the staged copies and the landing zone, which with one chunk a step is
// the gradient itself and, for equal widths, where the early update leaves the parameters).
void expect_early_equals_late(const std::string& options, at::ScalarType param, at::ScalarType grad,
                              double scale, int parts, const ciuic::Precision* precision,
                              const std::string& what, bool one_chunk = false,
                              c10::Device device = c10::kCPU) {
  SCOPED_TRACE(what + " parts " + std::to_string(parts) + (one_chunk ? " one chunk" : ""));
  auto late = make_cpu_adam(options);
  auto early = make_cpu_adam(options);
  const at::Tensor init = initial_master().to(param).to(at::kFloat);
  // feed(): one contribution keeps the gradient's dtype, several are fp32.
  const at::ScalarType chunks = parts == 1 ? grad : at::kFloat;
  for (Optimizer* o : {late.get(), early.get()}) {
    OptimizerSetup s = make_setup(param, init.to(device), precision, chunks);
    s.device = device;
    s.one_chunk_per_step = one_chunk;
    o->setup(s);
  }
  const auto a = run_offered(*late, false, 6, parts, param, grad, scale, device);
  const auto b = run_offered(*early, true, 6, parts, param, grad, scale, device);
  for (size_t i = 0; i < a.size(); ++i)
    expect_bitwise_equal(b[i], a[i], "early vs late after step " + std::to_string(i + 1));
  EXPECT_FALSE(at::equal(a.front().master, a.back().master));  // it did train
}

}  // namespace

TEST(OptimizerCpuAdam, EarlyUpdateIsBitwiseTheUpdateInStep) {
  struct Case {
    at::ScalarType param, grad;
    double scale;
  };
  for (const Variant& v : cpu_adam_variants())
    for (const Case& c :
         {Case{at::kFloat, at::kFloat, 1.0}, Case{at::kBFloat16, at::kBFloat16, 0.37 / 1024},
          Case{at::kBFloat16, at::kFloat, 0.5}})
      for (int parts : {1, 3})
        for (bool one_chunk : {false, true}) {
          if (one_chunk && parts > 1) continue;
          expect_early_equals_late(
              v.options, c.param, c.grad, c.scale, parts, &kNearestEven,
              v.name + " param " + c10::toString(c.param) + " grad " + c10::toString(c.grad),
              one_chunk);
        }
  // Six threads: the tasks run on 3 (backward) or 6, so with fp32 gradients and bf16 parameters the
  // parameters wait in the gradient's place in 3 or 6 pieces (early_out()).
  for (const char* options :
       {"threads = 6", "threads = 6\npipeline = \"staged\"\ntile_size = 4096"})
    for (int parts : {1, 3})
      expect_early_equals_late(options, at::kBFloat16, at::kFloat, 0.5, parts, &kNearestEven,
                               std::string("pieces, ") + options);
  // The policy's own rounding, called per region by the update tasks.
  for (const char* options :
       {"threads = 3", "threads = 3\npipeline = \"staged\"\ntile_size = 4096"}) {
    TowardZero tz;
    expect_early_equals_late(options, at::kBFloat16, at::kFloat, 1.0, 3, &tz, "toward zero");
    EXPECT_GT(tz.calls, 0);
  }
}

TEST(OptimizerCpuAdam, EarlyUpdateOfferAndMisuse) {
  // Declined: overlap_update = "off", and adamw (the default of Optimizer).
  {
    auto off = make_cpu_adam("overlap_update = \"off\"");
    off->setup(make_setup(at::kFloat, initial_master()));
    EXPECT_FALSE(off->offer_early_update(hyper(1)));
    auto adamw = make_adamw();
    adamw->setup(make_setup(at::kFloat, initial_master()));
    EXPECT_FALSE(adamw->offer_early_update(hyper(1)));
  }
  auto o = make_cpu_adam("threads = 2");
  std::string e = error_of([&] { o->offer_early_update(hyper(1)); });
  EXPECT_TRUE(contains(e, "optimizer cpu_adam: offer_early_update() called before setup()")) << e;
  o->setup(make_setup(at::kFloat, initial_master()));
  at::Tensor params = at::empty({kNumel});
  StateDict good;
  o->save_state(good);
  // step() must receive the offered arguments: the update has begun with them.
  ASSERT_TRUE(o->offer_early_update(hyper(1)));
  feed(*o, gradient(1, at::kFloat));
  e = error_of([&] { o->step(hyper(2), params); });
  EXPECT_TRUE(contains(e, "optimizer cpu_adam: step() with other arguments (lr")) << e;
  EXPECT_TRUE(contains(e, "than offer_early_update()")) << e;
  // That step never completed: the state is partly updated, so neither a new offer nor a save.
  e = error_of([&] { o->offer_early_update(hyper(2)); });
  EXPECT_TRUE(contains(e, "offer_early_update() after an early update whose step() never came"))
      << e;
  StateDict sd;
  e = error_of([&] { o->save_state(sd); });
  EXPECT_TRUE(contains(e, "save_state() after an early update whose step() never came")) << e;
  // A loaded state replaces it.
  o->load_state(good);
  ASSERT_TRUE(o->offer_early_update(hyper(1)));
  // A region without its last chunk: step() cannot finish the update.
  const auto rs = regions();
  for (int i : {0, 2})
    o->accumulate_grad(i, gradient(1, at::kFloat).narrow(0, rs[i].offset, rs[i].numel).contiguous(),
                       true, true);
  o->finish_grads();
  e = error_of([&] { o->step(hyper(1), params); });
  EXPECT_TRUE(contains(e, "optimizer cpu_adam: region 1 received no last gradient chunk this step"))
      << e;
  o->load_state(good);
  // A second last chunk for a region in one step.
  ASSERT_TRUE(o->offer_early_update(hyper(1)));
  const at::Tensor g0 = gradient(1, at::kFloat).narrow(0, 0, rs[0].numel).contiguous();
  o->accumulate_grad(0, g0, true, true);
  e = error_of([&] { o->accumulate_grad(0, g0, false, true); });
  EXPECT_TRUE(contains(e, "region 0 received a second last chunk in one step")) << e;
  o->load_state(good);
  // An offer is for one step: the next step without an offer updates in step().
  ASSERT_TRUE(o->offer_early_update(hyper(1)));
  feed(*o, gradient(1, at::kFloat));
  o->step(hyper(1), params);
  EXPECT_EQ(metric(*o, "optim_update_early"), 1.0);
  feed(*o, gradient(2, at::kFloat));
  o->step(hyper(2), params);
  EXPECT_EQ(metric(*o, "optim_update_early"), 0.0);
}

// ---- host memory: ciuic/kit/host_buffer.h, and what cpu_adam keeps there
// -------------------------

namespace {

// This process's resident memory (VmRSS), in bytes.
int64_t resident_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  ADD_FAILURE() << "no VmRSS in /proc/self/status";
  return 0;
}

constexpr int64_t kMiB = int64_t{1} << 20;

// A host_buffer() of `bytes` (over 256 MiB, not a power of two) made by `make`: resident as soon
// as it returns (first-touched), exactly its size (a power-of-two allocator would take 512 MiB),
// zero, usable, and given back to the system when the tensor goes.
void expect_exact_and_released(int64_t bytes, const std::function<at::Tensor()>& make) {
  const int64_t before = resident_bytes();
  at::Tensor b = make();
  const int64_t grown = resident_bytes() - before;
  EXPECT_EQ(b.nbytes(), static_cast<size_t>(bytes));
  EXPECT_TRUE(b.is_cpu());
  EXPECT_TRUE(b.is_contiguous());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data_ptr()) % 64, 0u);
  EXPECT_GE(grown, bytes - 4 * kMiB);
  EXPECT_LE(grown, bytes + 8 * kMiB);
  EXPECT_EQ(at::count_nonzero(b).item<int64_t>(), 0);
  b.fill_(3);
  EXPECT_EQ(b.to(at::kDouble).sum().item<double>(), 3.0 * static_cast<double>(b.numel()));
  b = at::Tensor();
  EXPECT_LT(resident_bytes() - before, 8 * kMiB);
}

}  // namespace

TEST(HostBuffer, ExactlyTheBytesAskedForTouchedZeroAndReleased) {
  ciuic::ThreadPool team(3);
  for (ciuic::ThreadPool* t : {static_cast<ciuic::ThreadPool*>(nullptr), &team}) {
    SCOPED_TRACE(t ? "3 threads" : "the calling thread");
    ciuic::kit::HostBufferOptions o;
    o.team = t;
    const int64_t n = 128 * kMiB + 2051;  // bf16: 256 MiB + 4102 bytes
    expect_exact_and_released(2 * n,
                              [&] { return ciuic::kit::host_buffer(n, at::kBFloat16, o, "test"); });
    // Small buffers: below a page, below a huge page; and none at all.
    for (int64_t small : {int64_t{1}, int64_t{1000}, int64_t{300000}}) {
      const at::Tensor b = ciuic::kit::host_buffer(small, at::kFloat, o, "test");
      EXPECT_EQ(b.numel(), small);
      EXPECT_EQ(at::count_nonzero(b).item<int64_t>(), 0);
    }
    EXPECT_EQ(ciuic::kit::host_buffer(0, at::kFloat, o, "test").numel(), 0);
  }
  ciuic::kit::HostBufferOptions o;
  std::string e =
      error_of([&] { ciuic::kit::host_buffer(-1, at::kFloat, o, "optimizer x: master weights"); });
  EXPECT_TRUE(contains(
      e, "optimizer x: master weights: host buffer of -1 elements (expected a count >= 0)"))
      << e;
  e = error_of(
      [&] { ciuic::kit::host_buffer(int64_t{1} << 61, at::kFloat, o, "optimizer x: moments"); });
  EXPECT_TRUE(contains(e,
                       "optimizer x: moments: host buffer of 2305843009213693952 elements of Float "
                       "is larger than any host memory"))
      << e;
}

// Pinned: page-locked (asynchronous copies), still exactly its size (LibTorch's pinned allocator
// would round 256 MiB + 4 KiB up to 512 MiB and keep it until exit), released when it goes.
TEST(HostBufferCuda, PinsExactlyAndCopiesAsynchronously) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  ASSERT_TRUE(ciuic::kit::host_buffer_pins_exactly());  // a CUDA build registers its own mapping
  ciuic::ThreadPool team(4);
  ciuic::kit::HostBufferOptions o;
  o.pin = true;
  o.team = &team;
  const int64_t n = 64 * kMiB + 1027;  // fp32: 256 MiB + 4108 bytes
  expect_exact_and_released(4 * n, [&] {
    at::Tensor h = ciuic::kit::host_buffer(n, at::kFloat, o, "test");
    EXPECT_TRUE(h.is_pinned());
    return h;
  });
  at::Tensor h = ciuic::kit::host_buffer(n, at::kFloat, o, "test");
  const at::Tensor d = at::arange(n, at::TensorOptions().dtype(at::kFloat).device(kCuda));
  h.copy_(d, /*non_blocking=*/true);
  at::Tensor back = at::empty_like(d);
  back.copy_(h, /*non_blocking=*/true);
  EXPECT_TRUE(at::equal(back.cpu(), d.cpu()));
}

// One chunk a step (OptimizerSetup::one_chunk_per_step): the gradient is kept in the chunks' dtype
// instead of being folded into an fp32 shard — 2 bytes an element less for bf16 chunks — with bit
// for bit the same results (bf16 and fp16 widen to fp32 exactly; the sum of squares adds the same
// fp32 values in the same order). A second chunk for a region in the step is refused.
TEST(OptimizerCpuAdam, OneChunkAStepKeepsTheGradientAsItComes) {
  struct Case {
    at::ScalarType param, grad;
    double scale;
  };
  for (const Variant& v : cpu_adam_variants())
    for (const Case& c :
         {Case{at::kFloat, at::kFloat, 1.0}, Case{at::kBFloat16, at::kBFloat16, 0.37 / 1024},
          Case{at::kHalf, at::kHalf, 1.0 / 65536}, Case{at::kBFloat16, at::kFloat, 0.5}}) {
      SCOPED_TRACE(v.name + " param " + c10::toString(c.param) + " grad " + c10::toString(c.grad));
      auto folded = make_cpu_adam(v.options);
      auto kept = make_cpu_adam(v.options);
      const RunResult a = check_against_torch(*folded, c.param, c.grad, c.scale, c10::kCPU, false);
      const RunResult b = check_against_torch(*kept, c.param, c.grad, c.scale, c10::kCPU, true);
      expect_bitwise_equal(b, a, "one chunk a step vs the fp32 fold");
      // And the staged pipeline's 4 landing slots of the largest region (4000): nothing lands
      // anywhere but in the gradient.
      const bool staged = v.name.find("staged") != std::string::npos;
      const uint64_t saved = (4 - c10::elementSize(c.grad)) * static_cast<uint64_t>(kNumel) +
                             (staged ? 4 * 4000 * c10::elementSize(c.grad) : 0);
      EXPECT_EQ(folded->memory().device_bytes - kept->memory().device_bytes, saved);
      const at::Tensor g = gradient(21, c.grad);
      EXPECT_EQ(feed(*kept, g), feed(*folded, g));  // the same squares, bit for bit
    }
  auto o = make_cpu_adam("threads = 2");
  OptimizerSetup s = make_setup(at::kBFloat16, initial_master(), &kNearestEven, at::kBFloat16);
  s.one_chunk_per_step = true;
  o->setup(s);
  const at::Tensor g0 = gradient(1, at::kBFloat16).narrow(0, 0, regions()[0].numel).contiguous();
  o->accumulate_grad(0, g0, true, true);
  const std::string e = error_of([&] { o->accumulate_grad(0, g0, false, true); });
  EXPECT_TRUE(contains(e,
                       "optimizer cpu_adam: region 0 received a second gradient chunk in one step, "
                       "but the setup said one chunk a step"))
      << e;
}

// cpu_adam on a CUDA run (chunks and parameters on the GPU; the pinned landing zone, the staged
// uploads): against torch::optim::AdamW with and without one chunk a step (with it, the chunks'
// copies land in the gradient itself), bit for bit the same either way; the early update bit for
// bit the update in step() — with one chunk a step and equal widths the parameters take the
// gradient's place; what it keeps in host memory (memory(), the planner's figures).
TEST(OptimizerCpuAdamCuda, LandingZoneOneChunkAndEarlyUpdateMatchTorch) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device";
  struct Case {
    at::ScalarType param, grad;
    double scale;
  };
  for (const Case& c :
       {Case{at::kBFloat16, at::kBFloat16, 0.37 / 1024}, Case{at::kFloat, at::kFloat, 1.0},
        Case{at::kBFloat16, at::kFloat, 0.5}, Case{at::kHalf, at::kHalf, 1.0 / 65536}}) {
    const std::string what =
        std::string("param ") + c10::toString(c.param) + " grad " + c10::toString(c.grad);
    SCOPED_TRACE(what);
    std::vector<RunResult> r;
    for (bool one_chunk : {false, true}) {
      auto o = make_cpu_adam("threads = 3");
      r.push_back(check_against_torch(*o, c.param, c.grad, c.scale, kCuda, one_chunk));
      // master + moments, the gradient (fp32; with one chunk a step in the chunks' dtype), two
      // upload tiles (the shard is smaller than a tile), and unless one chunk a step, 4 landing
      // slots of the largest region (4000 elements) in the chunks' dtype; all of it host memory.
      const uint64_t gsize = c10::elementSize(c.grad);
      const uint64_t bytes =
          (12 + (one_chunk ? gsize : 4) + 2 * c10::elementSize(c.param)) * kNumel +
          (one_chunk ? 0 : 4 * 4000 * gsize);
      EXPECT_EQ(o->memory().host_bytes, bytes) << one_chunk;
      EXPECT_EQ(o->memory().device_bytes, 0u);
    }
    expect_bitwise_equal(r[1], r[0], "one chunk a step vs the fp32 fold");
    for (bool one_chunk : {false, true})
      expect_early_equals_late("threads = 3", c.param, c.grad, c.scale, 1, &kNearestEven,
                               what + " early", one_chunk, kCuda);
    expect_early_equals_late("threads = 3", c.param, c.grad, c.scale, 3, &kNearestEven,
                             what + " early", false, kCuda);
  }
}
