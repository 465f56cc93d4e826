// AdamW offloads: the core's device AdamW (optim/device_adamw.h) and the cpu_adam plugin, against
// torch::optim::AdamW (the C++ frontend: mul_/add_/addcmul_/addcdiv_ on separate tensors, an
// independent implementation), over 20 steps with weight decay, bias correction, a changing lr,
// decay / no-decay segments, grad_scale, bf16/fp16 gradients and parameters; the bf16/fp16
// copy-back against at::Tensor::to() and hand-computed round-to-nearest-even on tie cases; state
// save/load round trips; the staged copy pipeline with grad_ready(); every bad-input message.
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/optim/adamw.h>

#include <ciuic/config.h>
#include <ciuic/context.h>
#include <ciuic/error.h>
#include <ciuic/offload.h>
#include <ciuic/store.h>

#include "optim/device_adamw.h"
#include "recipe/recipe.h"
#include "registry/registry.h"

using ciuic::AdamWHyper;
using ciuic::Offload;
using ciuic::OffloadSetup;
using ciuic::ShardSegment;
using ciuic::StateDict;

namespace {

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// ---- creating the offloads ---------------------------------------------------------------------

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
      ciuic::Registry::from_paths({CIUIC_PLUGIN_DIR "/libciuic_offload_cpu_adam.so"});
  return r;
}

// The [offload] section as the recipe validates it (defaults filled in, the plugin's schema).
ciuic::Config cpu_adam_config(const std::string& options) {
  const std::string text = "[train]\nmax_steps = 1\n[data]\nplugin = \"synthetic\"\n"
                           "[offload]\nplugin = \"cpu_adam\"\n" + options;
  const ciuic::Recipe recipe = ciuic::Recipe::parse(text, "test.toml");
  return recipe.plugin_config(ciuic::Slot::kOffload,
                              *registry().get(ciuic::Slot::kOffload, "cpu_adam").info);
}

std::shared_ptr<Offload> make_cpu_adam(const std::string& options) {
  return registry().create<Offload>(ciuic::Slot::kOffload, "cpu_adam", cpu_adam_config(options),
                                    context());
}

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
    v.push_back({std::string(simd) + "/staged/3", s + "threads = 3\npipeline = \"staged\"\ntile_size = 4096\n"});
  }
  return v;
}

// ---- the problem and the reference ---------------------------------------------------------------

// A shard of 10007 elements (not a multiple of any vector width): decay, no-decay (a "norm"),
// decay, no-decay (padding).
constexpr int64_t kNumel = 10007;
std::vector<ShardSegment> segments() {
  return {{0, 4000, true}, {4000, 4133, false}, {4133, 9990, true}, {9990, kNumel, false}};
}

AdamWHyper hyper(int64_t step) {
  AdamWHyper h;
  h.lr = 1e-3 * (0.5 + 0.05 * static_cast<double>(step));  // a changing (scheduled) lr
  h.beta1 = 0.9;
  h.beta2 = 0.999;
  h.eps = 1e-8;
  h.weight_decay = 0.1;
  return h;
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
    const AdamWHyper h = hyper(1);
    auto opts = [&](double wd) {
      return std::make_unique<torch::optim::AdamWOptions>(
          torch::optim::AdamWOptions(h.lr).betas({h.beta1, h.beta2}).eps(h.eps).weight_decay(wd));
    };
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(decay, opts(h.weight_decay));
    groups.emplace_back(no_decay, opts(0.0));
    opt_ = std::make_unique<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(h.lr));
  }

  // g: the gradient as given to the offload (any dtype); the reference sees fp32 g * scale.
  void step(const at::Tensor& g, double grad_scale, const AdamWHyper& h) {
    at::Tensor g32 = g.to(at::kFloat);
    if (grad_scale != 1.0) g32 = g32 * grad_scale;
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
      auto& st = static_cast<torch::optim::AdamWParamState&>(
          *opt_->state().at(p.unsafeGetTensorImpl()));
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

OffloadSetup make_setup(at::ScalarType param_dtype, const at::Tensor& init) {
  OffloadSetup s;
  s.numel = kNumel;
  s.segments = segments();
  s.master_init = init;
  s.param_dtype = param_dtype;
  return s;
}

struct RunResult {
  at::Tensor master, exp_avg, exp_avg_sq, params;
};

RunResult state_of(const Offload& o, const at::Tensor& params) {
  StateDict sd;
  o.save_state(sd);
  return {ciuic::state_get(sd, "master"), ciuic::state_get(sd, "exp_avg"),
          ciuic::state_get(sd, "exp_avg_sq"), params.clone()};
}

// Runs steps [first, last] on `o` (and on `ref` when given).
void run_steps(Offload& o, Reference* ref, int64_t first, int64_t last, at::ScalarType grad_dtype,
               double grad_scale, at::Tensor& params) {
  for (int64_t t = first; t <= last; ++t) {
    const at::Tensor g = gradient(t, grad_dtype);
    o.step(g, grad_scale, hyper(t), t, params);
    if (ref) ref->step(g, grad_scale, hyper(t));
  }
}

// 20 steps against torch::optim::AdamW; returns the offload's final state.
RunResult check_against_torch(Offload& o, at::ScalarType param_dtype, at::ScalarType grad_dtype,
                              double grad_scale) {
  const at::Tensor init = initial_master();
  o.setup(make_setup(param_dtype, init));
  Reference ref(init);
  at::Tensor params = at::empty({kNumel}, at::TensorOptions().dtype(param_dtype));
  run_steps(o, &ref, 1, 20, grad_dtype, grad_scale, params);
  RunResult r = state_of(o, params);
  EXPECT_LT(max_rel(r.master, ref.master()), 1e-6);
  EXPECT_LT(max_rel(r.exp_avg, ref.moment(false)), 1e-6);
  EXPECT_LT(max_rel(r.exp_avg_sq, ref.moment(true)), 1e-6);
  // The parameters are the master rounded to their dtype, exactly as ATen rounds.
  EXPECT_TRUE(at::equal(params, r.master.to(param_dtype)));
  return r;
}

void expect_bitwise_equal(const RunResult& a, const RunResult& b, const std::string& what) {
  EXPECT_TRUE(at::equal(a.master, b.master)) << what;
  EXPECT_TRUE(at::equal(a.exp_avg, b.exp_avg)) << what;
  EXPECT_TRUE(at::equal(a.exp_avg_sq, b.exp_avg_sq)) << what;
  EXPECT_TRUE(at::equal(a.params, b.params)) << what;
}

}  // namespace

// ---- device AdamW ------------------------------------------------------------------------------

TEST(DeviceAdamW, MatchesTorchAdamWInFp32) {
  auto o = ciuic::optim::make_device_adamw();
  check_against_torch(*o, at::kFloat, at::kFloat, 1.0);
}

TEST(DeviceAdamW, GradScaleBf16GradientsBf16Parameters) {
  auto o = ciuic::optim::make_device_adamw();
  check_against_torch(*o, at::kBFloat16, at::kBFloat16, 0.37 / 1024);
}

TEST(DeviceAdamW, Fp16GradientsAndParameters) {
  auto o = ciuic::optim::make_device_adamw();
  check_against_torch(*o, at::kHalf, at::kHalf, 1.0 / 65536);
}

TEST(DeviceAdamW, GradScaleWithFp32GradientsLeavesTheGradientUntouched) {
  auto o = ciuic::optim::make_device_adamw();
  o->setup(make_setup(at::kFloat, initial_master()));
  const at::Tensor g = gradient(1, at::kFloat);
  const at::Tensor before = g.clone();
  at::Tensor params = at::empty({kNumel});
  o->step(g, 0.25, hyper(1), 1, params);
  EXPECT_TRUE(at::equal(g, before));
}

// ---- cpu_adam --------------------------------------------------------------------------------

TEST(CpuAdam, EveryVariantMatchesTorchAdamWAndTheOthersBitwise) {
  const auto variants = cpu_adam_variants();
  ASSERT_GE(variants.size(), 3u);  // scalar is always there
  struct Case {
    at::ScalarType param, grad;
    double scale;
  };
  for (const Case& c : {Case{at::kFloat, at::kFloat, 1.0}, Case{at::kBFloat16, at::kBFloat16, 0.37 / 1024},
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

TEST(CpuAdam, GradReadyInAnyOrderAndAfterASkippedStep) {
  // Direct update as the baseline.
  auto direct = make_cpu_adam("simd = \"scalar\"");
  const at::Tensor init = initial_master();
  direct->setup(make_setup(at::kBFloat16, init));
  at::Tensor p_direct = at::empty({kNumel}, at::kBFloat16);
  run_steps(*direct, nullptr, 1, 3, at::kFloat, 1.0, p_direct);

  auto staged = make_cpu_adam("simd = \"scalar\"\npipeline = \"staged\"\ntile_size = 4096");
  staged->setup(make_setup(at::kBFloat16, init));
  at::Tensor p_staged = at::empty({kNumel}, at::kBFloat16);
  for (int64_t t = 1; t <= 3; ++t) {
    const at::Tensor g = gradient(t, at::kFloat);
    if (t == 2) {
      // A step whose gradients were announced and then skipped (overflow): garbage, no step().
      const at::Tensor bad = at::full({kNumel}, 1e30f);
      staged->grad_ready(0, bad.narrow(0, 0, 5000));
      staged->grad_ready(5000, bad.narrow(0, 5000, kNumel - 5000));
    }
    // Regions out of order, and a hole [2000, 2500) left for step() to download.
    staged->grad_ready(6000, g.narrow(0, 6000, kNumel - 6000));
    staged->grad_ready(0, g.narrow(0, 0, 2000));
    staged->grad_ready(2500, g.narrow(0, 2500, 3500));
    staged->step(g, 1.0, hyper(t), t, p_staged);
  }
  expect_bitwise_equal(state_of(*staged, p_staged), state_of(*direct, p_direct), "staged vs direct");
}

TEST(CpuAdam, MemoryAndMetrics) {
  auto o = make_cpu_adam("threads = 2");
  o->setup(make_setup(at::kFloat, initial_master()));
  EXPECT_EQ(o->memory().host_bytes, static_cast<uint64_t>(12 * kNumel));
  EXPECT_EQ(o->memory().device_bytes, 0u);
  at::Tensor params = at::empty({kNumel});
  o->step(gradient(1, at::kFloat), 1.0, hyper(1), 1, params);
  ciuic::Metrics m;
  o->append_metrics(m);
  std::vector<std::string> keys;
  for (auto& kv : m.values) keys.push_back(kv.first);
  EXPECT_EQ(keys, (std::vector<std::string>{"offload_host_gib", "offload_step_s",
                                            "offload_update_s", "offload_copy_wait_s"}));
  EXPECT_NEAR(m.values[0].second, 12.0 * kNumel / (1 << 30), 1e-12);
  EXPECT_GT(m.values[2].second, 0.0);

  auto staged = make_cpu_adam("pipeline = \"staged\"\ntile_size = 4096");
  staged->setup(make_setup(at::kBFloat16, initial_master()));
  // master, m, v + two bf16 staging tiles (the gradient buffer appears at the first step).
  EXPECT_EQ(staged->memory().host_bytes, static_cast<uint64_t>(12 * kNumel + 2 * 2 * 4096));
}

// ---- shared: copy-back rounding, state round trip, errors -----------------------------------------

namespace {

float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// One lr = 0 step leaves the master unchanged, so params_out is the master_init rounded.
at::Tensor copy_back(Offload& o, const std::vector<float>& values, at::ScalarType dtype) {
  const int64_t n = static_cast<int64_t>(values.size());
  OffloadSetup s;
  s.numel = n;
  s.segments = {{0, n, true}};
  s.master_init = at::tensor(values);
  s.param_dtype = dtype;
  o.setup(s);
  AdamWHyper h;
  h.lr = 0;
  h.weight_decay = 0;
  at::Tensor params = at::empty({n}, at::TensorOptions().dtype(dtype));
  o.step(at::full({n}, 0.5f), 1.0, h, 1, params);
  StateDict sd;
  o.save_state(sd);
  EXPECT_TRUE(at::isclose(ciuic::state_get(sd, "master"), at::tensor(values), 0, 0,
                          /*equal_nan=*/true).all().item<bool>());
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
    {1.0f + 0x1p-11f, 0x3C00},         // tie between 1 and 1 + 2^-10 -> even (1)
    {1.0f + 3 * 0x1p-11f, 0x3C02},     // tie -> even (1 + 2^-9)
    {1.0f + 0x1p-11f + 0x1p-20f, 0x3C01},
    {-(1.0f + 3 * 0x1p-11f), 0xBC02},
    {65504.0f, 0x7BFF},                 // max half
    {65519.0f, 0x7BFF},                 // below the tie with 65536 -> max half
    {65520.0f, 0x7C00},                 // tie -> even = 2^16 = inf
    {1e6f, 0x7C00},                     // overflow -> inf
    {0x1p-25f, 0x0000},                 // half the smallest subnormal: tie -> even (0)
    {3 * 0x1p-25f, 0x0002},             // 1.5 subnormal ulps: tie -> even (2)
    {0x1p-24f, 0x0001},                 // smallest subnormal
    {0x1p-14f, 0x0400},                 // smallest normal
    {-2.5f, 0xC100},
};

// Repeats the cases so that they land in vector bodies and in ragged tails.
template <class T>
std::vector<T> repeated(const std::vector<T>& cases, int times) {
  std::vector<T> out;
  for (int i = 0; i < times; ++i) out.insert(out.end(), cases.begin(), cases.end());
  return out;
}

void check_copy_back(const std::function<std::shared_ptr<Offload>()>& make, const std::string& what) {
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
void check_round_trip(const std::function<std::shared_ptr<Offload>()>& make, const std::string& what) {
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

void check_errors(const std::function<std::shared_ptr<Offload>()>& make, const std::string& who) {
  SCOPED_TRACE(who);
  auto o = make();
  at::Tensor params = at::empty({kNumel});
  std::string e = error_of([&] { o->step(gradient(1, at::kFloat), 1.0, hyper(1), 1, params); });
  EXPECT_TRUE(contains(e, who + ": step() called before setup()")) << e;

  OffloadSetup s = make_setup(at::kFloat, initial_master());
  s.segments = {{0, 100, true}, {120, kNumel, false}};
  e = error_of([&] { o->setup(s); });
  EXPECT_TRUE(contains(e, who + ": setup() segment 1 is [120, 10007)")) << e;
  EXPECT_TRUE(contains(e, "starting at 100")) << e;
  s.segments = {{0, 100, true}};
  e = error_of([&] { o->setup(s); });
  EXPECT_TRUE(contains(e, "segments end at 100 but the shard has 10007 elements")) << e;
  s = make_setup(at::kFloat, at::zeros({5}));
  e = error_of([&] { o->setup(s); });
  EXPECT_TRUE(contains(e, "master_init must be an fp32 tensor of 10007 elements")) << e;
  s = make_setup(at::kDouble, initial_master());
  e = error_of([&] { o->setup(s); });
  EXPECT_TRUE(contains(e, "parameter dtype Double is not supported")) << e;

  o->setup(make_setup(at::kFloat, initial_master()));
  e = error_of([&] { o->step(at::zeros({5}), 1.0, hyper(1), 1, params); });
  EXPECT_TRUE(contains(e, who + ": step() gradient must be a contiguous fp32, bf16 or fp16 tensor of 10007")) << e;
  at::Tensor half_params = params.to(at::kHalf);
  e = error_of([&] { o->step(gradient(1, at::kFloat), 1.0, hyper(1), 1, half_params); });
  EXPECT_TRUE(contains(e, "params_out must be a contiguous Float tensor of 10007 elements on cpu, got Half")) << e;
  e = error_of([&] { o->step(gradient(1, at::kFloat), NAN, hyper(1), 1, params); });
  EXPECT_TRUE(contains(e, "grad_scale must be finite and > 0")) << e;
  e = error_of([&] { o->step(gradient(1, at::kFloat), 1.0, hyper(1), 0, params); });
  EXPECT_TRUE(contains(e, "step count t must be >= 1, got 0")) << e;

  StateDict sd;
  o->save_state(sd);
  StateDict missing = {sd[0], sd[2]};
  e = error_of([&] { o->load_state(missing); });
  EXPECT_TRUE(contains(e, who + ": optimizer state has no \"exp_avg\" tensor")) << e;
  StateDict wrong = sd;
  wrong[2].second = at::zeros({kNumel - 1});
  e = error_of([&] { o->load_state(wrong); });
  EXPECT_TRUE(contains(e, "\"exp_avg_sq\" must be a 1-D fp32 tensor of 10007 elements, got a 1-D Float tensor of 10006")) << e;
  // A refused state leaves the object as it was.
  StateDict after;
  o->save_state(after);
  EXPECT_TRUE(at::equal(after[0].second, sd[0].second));
}

std::shared_ptr<Offload> device_adamw() { return ciuic::optim::make_device_adamw(); }

}  // namespace

TEST(DeviceAdamW, CopyBackRoundsToNearestEven) { check_copy_back(device_adamw, "device AdamW"); }

TEST(CpuAdam, CopyBackRoundsToNearestEven) {
  for (const Variant& v : cpu_adam_variants())
    check_copy_back([&] { return make_cpu_adam(v.options); }, v.name);
}

TEST(DeviceAdamW, StateRoundTripContinuesIdentically) { check_round_trip(device_adamw, "device AdamW"); }

TEST(CpuAdam, StateRoundTripContinuesIdentically) {
  check_round_trip([] { return make_cpu_adam(""); }, "cpu_adam direct");
  check_round_trip([] { return make_cpu_adam("pipeline = \"staged\"\ntile_size = 4096"); }, "cpu_adam staged");
}

TEST(DeviceAdamW, BadInputMessages) { check_errors(device_adamw, "device AdamW"); }

TEST(CpuAdam, BadInputMessages) {
  check_errors([] { return make_cpu_adam(""); }, "offload cpu_adam");
  auto o = make_cpu_adam("pipeline = \"staged\"");
  o->setup(make_setup(at::kFloat, initial_master()));
  const std::string e = error_of([&] { o->grad_ready(10000, at::zeros({100})); });
  EXPECT_TRUE(contains(e, "offload cpu_adam: grad_ready(10000, region) needs a contiguous fp32/bf16/fp16 region on cpu inside [0, 10007)")) << e;
}

TEST(CpuAdam, OptionErrors) {
  // Checked by the recipe against the plugin's declared options.
  std::string e = error_of([] { cpu_adam_config("simd = \"sse\""); });
  EXPECT_TRUE(contains(e, "simd")) << e;
  EXPECT_TRUE(contains(e, "auto")) << e;
  e = error_of([] { cpu_adam_config("tile_size = 10"); });
  EXPECT_TRUE(contains(e, "tile_size")) << e;
  e = error_of([] { cpu_adam_config("threads = -1"); });
  EXPECT_TRUE(contains(e, "threads")) << e;
  // Checked by the plugin: a forced SIMD level this CPU lacks.
  for (const char* level : {"avx512", "avx2"}) {
    e = error_of([&] { make_cpu_adam(std::string("simd = \"") + level + "\""); });
    if (e == "(no error)") continue;  // supported here
    EXPECT_TRUE(contains(e, "test.toml:")) << e;
    EXPECT_TRUE(contains(e, "[offload] simd = \"" + std::string(level) + "\": this CPU does not support")) << e;
    EXPECT_TRUE(contains(e, "it supports")) << e;
  }
}
