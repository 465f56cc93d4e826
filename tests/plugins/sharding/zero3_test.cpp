// The zero3 sharding plugin in one process (world 1, gloo) on a small Llama model, against
// references that are not zero3's own accounting:
//   * gathers counted by a Comm that wraps gloo (all-gathers per group and pass, per step);
//   * the parameter memory gathered at every layer boundary, read from the model's own tensors
//     (the storages that hold memory), against the configured max_live_parameters;
//   * the trained weights against zero2's (zero2 is held to torch's AdamW in sharding_step_test),
//     with and without activation checkpointing, tied and untied embeddings, prefetch on and off,
//     reshard_after_forward on and off, persistent small parameters;
//   * refusals (exit code 2, the key and what was expected);
//   * the start without the whole model (Zero3Start): each rank of worlds 2-4 builds only its shard
//     from the core's values (random initialisation, safetensors), the bytes the CPU allocator
//     hands out counted by a wrapping allocator, the shard's values against the unsharded model's.
// Multi-rank equivalence, cpu_adam, offload and checkpoints through ciuic-run: zero3_e2e_test.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/CPUAllocator.h>
#include <torch/csrc/autograd/autograd.h>

#include <ciuic/comm.h>
#include <ciuic/config.h>
#include <ciuic/context.h>
#include <ciuic/error.h>
#include <ciuic/optimizer.h>
#include <ciuic/precision.h>
#include <ciuic/sharding.h>

#include "model/llama.h"
#include "model/safetensors.h"
#include "plugin_env.h"
#include "registry/registry.h"
#include "train/step.h"

namespace {

using ciuic::Config;
using ciuic::GroupPass;
using ciuic::Slot;

using ciuic_test::Env;

// Forwards to another Comm and counts its all-gathers.
class CountingComm final : public ciuic::Comm {
 public:
  explicit CountingComm(ciuic::Comm& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  c10::Device device() const override { return inner_.device(); }
  std::string backend_name() const override { return inner_.backend_name(); }
  std::unique_ptr<ciuic::Work> all_reduce(at::Tensor& t, ciuic::ReduceOp op) override {
    return inner_.all_reduce(t, op);
  }
  std::unique_ptr<ciuic::Work> reduce_scatter(at::Tensor& o, const at::Tensor& i,
                                              ciuic::ReduceOp op) override {
    return inner_.reduce_scatter(o, i, op);
  }
  std::unique_ptr<ciuic::Work> all_gather(at::Tensor& o, const at::Tensor& i) override {
    ++gathers;
    return inner_.all_gather(o, i);
  }
  std::unique_ptr<ciuic::Work> broadcast(at::Tensor& t, int root) override {
    return inner_.broadcast(t, root);
  }
  void barrier() override { inner_.barrier(); }
  ciuic::CommCounters counters() const override { return inner_.counters(); }
  int64_t gathers = 0;

 private:
  ciuic::Comm& inner_;
};

// Bytes of parameter memory the model holds now: the distinct storages of its parameters that have
// memory (a zero3 unit not gathered has none).
int64_t held_parameter_bytes(const ciuic::model::LlamaModel& m) {
  std::set<const void*> seen;
  int64_t bytes = 0;
  for (const auto& [n, t] : m.named_parameters()) {
    const c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
    if (!s->data() || !seen.insert(s).second) continue;
    bytes += static_cast<int64_t>(s->nbytes());
  }
  return bytes;
}

// Forwards every call to the sharding under test and records, at each boundary, the gathers so
// far and the parameter bytes the model holds once the inner call returned.
class Probe final : public ciuic::Sharding {
 public:
  Probe(ciuic::Sharding& inner, CountingComm& comm, const ciuic::model::LlamaModel& model)
      : inner_(inner), comm_(comm), model_(model) {}
  void setup(const ciuic::ShardingSetup& s) override {
    inner_.setup(s);
    groups_ = s.groups;
    params_ = s.params;
  }
  void begin_micro_batch(int64_t i, bool last) override { inner_.begin_micro_batch(i, last); }
  void before_group(int g, GroupPass p) override {
    bool present = true;  // every parameter of the group holds memory already (gathered earlier)
    for (int i : groups_[g].params)
      present = present && params_[i].tensor.storage().unsafeGetStorageImpl()->data();
    if (present) ++ready_on_entry[{g, static_cast<int>(p)}];
    const int64_t before = comm_.gathers;
    inner_.before_group(g, p);
    gathers[{g, static_cast<int>(p)}] += comm_.gathers - before;
    peak_held = std::max(peak_held, held_parameter_bytes(model_));
  }
  void after_group(int g, GroupPass p) override {
    inner_.after_group(g, p);
    peak_held = std::max(peak_held, held_parameter_bytes(model_));
    between = std::max(between, held_parameter_bytes(model_));
  }
  ciuic::GradSquares finish_grads() override { return inner_.finish_grads(); }
  void update(const ciuic::OptimizerStep& a) override { inner_.update(a); }
  std::vector<ciuic::ShardSlice> layout() const override { return inner_.layout(); }
  void save_state(ciuic::StateDict& out) const override { inner_.save_state(out); }
  void load_state(const ciuic::SliceFetcher& f, int64_t t) override { inner_.load_state(f, t); }
  std::map<std::pair<int, int>, int64_t>
      gathers;  // (group, pass) -> all-gathers issued inside before_group
  std::map<std::pair<int, int>, int64_t>
      training;  // `gathers` when training ended (train() sets it)
  std::map<std::pair<int, int>, int64_t>
      ready_on_entry;     // (group, pass) -> before_group found it gathered
  int64_t peak_held = 0;  // at any boundary
  int64_t between = 0;    // right after a group's pass

 private:
  ciuic::Sharding& inner_;
  CountingComm& comm_;
  const ciuic::model::LlamaModel& model_;
  std::vector<ciuic::ParamGroup> groups_;
  std::vector<ciuic::ShardingParam> params_;
};

ciuic::model::LlamaConfig tiny(bool tied, int layers = 3) {
  ciuic::model::LlamaConfig c;
  c.vocab_size = 96;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = layers;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.max_position_embeddings = 64;
  c.tie_word_embeddings = tied;
  c.pad_token_id.reset();
  return c;
}

struct Trained {
  std::map<std::string, at::Tensor> master;  // fp32, from the optimizer's saved state and layout
  std::vector<double> losses;
  Probe* probe = nullptr;
};

struct Case {
  std::string sharding = "zero3";
  std::string options;  // TOML of the sharding's section
  bool tied = false;
  int checkpoint_layers = -1;  // -1: none, 0: all
  int micro_batches = 1;
  int steps = 3;
};

// Trains `c.steps` steps of a fresh model (same seed for every case) and returns its master
// weights. `probe_out`: the probe, for zero3 cases.
Trained train(const Case& c, std::unique_ptr<Probe>* probe_out = nullptr) {
  Env env;
  auto gloo = env.make<ciuic::Comm>(Slot::kComm, "gloo");
  CountingComm comm(*gloo);
  auto prec = env.make<ciuic::Precision>(Slot::kPrecision, "fp32");
  auto shard =
      env.make<ciuic::Sharding>(Slot::kSharding, c.sharding,
                                c.sharding == "zero3" ? c.options : "reduce_bucket_size = 3000\n");
  auto opt = env.make<ciuic::Optimizer>(Slot::kOptimizer, "adamw");
  ciuic::model::LlamaModel model(tiny(c.tied), at::kFloat, at::kCPU);
  model.init_random(11, 0.05);
  if (c.checkpoint_layers >= 0) model.set_activation_checkpointing(true, c.checkpoint_layers);
  auto probe = std::make_unique<Probe>(*shard, comm, model);
  ciuic::ShardingSetup s;
  for (auto& [n, t] : model.named_parameters()) s.params.push_back({n, t, t.dim() >= 2});
  s.groups = model.param_groups();
  s.comm = &comm;
  s.precision = prec.get();
  s.optimizer = opt.get();
  s.gradient_accumulation_steps = c.micro_batches;
  probe->setup(s);
  model.set_group_boundaries(probe.get());

  Trained out;
  for (int step = 1; step <= c.steps; ++step) {
    ciuic::train::StepInput in;
    in.lr = 1e-2;
    in.weight_decay = 0.1;
    in.max_grad_norm = 0.5;
    in.step = in.t = step;
    ciuic::train::Step st({&comm, prec.get(), opt.get(), probe.get()}, in);
    for (int m = 0; m < c.micro_batches; ++m) {
      at::manual_seed(1000 * step + m);
      const at::Tensor ids = at::randint(0, 96, {2, 16}, at::kLong);
      const at::Tensor labels = at::randint(0, 96, {2, 16}, at::kLong);
      probe->begin_micro_batch(m, m + 1 == c.micro_batches);
      const at::Tensor loss = model.loss_sum(ids, labels, {}, false);
      torch::autograd::backward({loss / 64.0});
      out.losses.push_back(loss.item<double>());
    }
    const auto r = ciuic::train::run_step(st);
    EXPECT_FALSE(r.skipped);
  }
  ciuic::StateDict sd;
  probe->save_state(sd);
  at::Tensor master;
  for (auto& [k, v] : sd)
    if (k == "master") master = v;
  EXPECT_TRUE(master.defined());
  for (const auto& sl : probe->layout()) {
    at::Tensor& t = out.master[sl.param];
    if (!t.defined()) {
      int64_t n = 0;
      for (const auto& [name, p] : model.named_parameters())
        if (name == sl.param) n = p.numel();
      t = at::zeros({n}, at::kDouble);
    }
    t.narrow(0, sl.param_offset, sl.length).copy_(master.narrow(0, sl.shard_offset, sl.length));
  }
  // Evaluation after training (no autograd): forward boundaries only, parameters current.
  probe->training = probe->gathers;
  {
    at::NoGradGuard ng;
    at::manual_seed(5);
    out.losses.push_back(model
                             .loss_sum(at::randint(0, 96, {1, 8}, at::kLong),
                                       at::randint(0, 96, {1, 8}, at::kLong), {}, false)
                             .item<double>());
  }
  if (probe_out) *probe_out = std::move(probe);
  return out;
}

double rel(const std::map<std::string, at::Tensor>& a, const std::map<std::string, at::Tensor>& b) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (const auto& [k, t] : b) {
    if (!a.count(k)) {
      ADD_FAILURE() << "missing " << k;
      return INFINITY;
    }
    num += (a.at(k) - t).pow(2).sum().item<double>();
    den += t.pow(2).sum().item<double>();
  }
  return std::sqrt(num / den);
}

void expect_same_losses(const Trained& a, const Trained& b) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i)
    EXPECT_NEAR(a.losses[i], b.losses[i], 1e-5 * std::abs(b.losses[i])) << i;
}

TEST(Zero3, MatchesZero2InOneProcess) {
  for (bool tied : {false, true})
    for (int ckpt : {-1, 0, 2}) {
      SCOPED_TRACE(std::string(tied ? "tied" : "untied") + ", checkpoint_layers " +
                   std::to_string(ckpt));
      Case z2{.sharding = "zero2", .tied = tied, .checkpoint_layers = ckpt, .micro_batches = 2};
      Case z3 = z2;
      z3.sharding = "zero3";
      const Trained ref = train(z2), got = train(z3);
      EXPECT_LT(rel(got.master, ref.master), 1e-6);
      expect_same_losses(got, ref);
    }
  // Options that change when, not what: no prefetch, reshard off, small parameters persistent.
  const Trained ref = train(Case{.sharding = "zero2"});
  for (const char* options : {"prefetch_bucket_size = 0\n", "reshard_after_forward = false\n",
                              "param_persistence_threshold = 100\n", "offload_params = true\n"}) {
    SCOPED_TRACE(options);
    const Trained got = train(Case{.options = options});
    EXPECT_LT(rel(got.master, ref.master), 1e-6);
    expect_same_losses(got, ref);
  }
}

// Each layer's unit is all-gathered once in its forward and once in its backward (its
// recomputation under activation checkpointing needs no gather of its own); the head stays
// gathered from its forward to its backward; between layers the model holds at most
// max_live_parameters gathered elements.
TEST(Zero3, GathersEachLayerOnceInForwardAndOnceInBackward) {
  const int layers = 3;
  // One layer of the tiny model: 4 x 32 x 32 / 2 (q, o; k and v are half) ... counted from the
  // model.
  ciuic::model::LlamaModel shape(tiny(false, layers), at::kFloat, at::kCPU);
  int64_t layer = 0;
  for (const auto& [n, t] : shape.named_parameters())
    if (n.rfind("model.layers.0.", 0) == 0) layer += t.numel();
  const int64_t padded = (layer + 63) / 64 * 64;
  for (int ckpt : {-1, 0}) {
    for (int64_t live_layers : {1, 2}) {
      SCOPED_TRACE("checkpoint_layers " + std::to_string(ckpt) + ", live layers " +
                   std::to_string(live_layers));
      // The embedding and lm_head (96 x 32) are larger than a layer: the bound holds them too.
      const int64_t live = std::max<int64_t>(live_layers * padded, 96 * 32);
      std::unique_ptr<Probe> probe;
      Case c{.options = "max_live_parameters = " + std::to_string(live) + "\n",
             .checkpoint_layers = ckpt,
             .steps = 1};
      train(c, &probe);
      auto& trained = probe->training;
      for (int g = 1; g <= layers; ++g) {
        const int64_t fwd = trained[{g, 0}], bwd = trained[{g, 1}], rec = trained[{g, 2}];
        // A gather is issued in the group's own before_group or earlier, as a prefetch.
        EXPECT_LE(fwd, 1) << "layer " << g;
        EXPECT_LE(bwd, 1) << "layer " << g;
        EXPECT_EQ(rec, 0) << "layer " << g;
      }
      int64_t total = 0, all = 0;
      for (const auto& [k, n] : trained) total += n;
      for (const auto& [k, n] : probe->gathers) all += n;
      // The step: 3 layers x 2, the embedding x 2, the head x 1; the evaluation forward after
      // training: each of the 5 groups once.
      EXPECT_EQ(total, 2 * layers + 2 + 1);
      EXPECT_EQ(all - total, layers + 2);
      if (live_layers ==
          1) {  // no room to prefetch a layer: each gather happens in its own before_group
        for (int g = 1; g <= layers; ++g) {
          EXPECT_EQ((trained[{g, 0}]), 1) << "layer " << g;
          EXPECT_EQ((trained[{g, 1}]), 1) << "layer " << g;
        }
      }
      // Measured from the model's tensors: never more than the bound (plus nothing persistent).
      EXPECT_LE(probe->peak_held, live * 4);
      EXPECT_GE(probe->peak_held, padded * 4);
    }
  }
}

// A prefetch bucket smaller than a layer still gathers the next layer ahead (with room for two
// layers): each layer's before_group finds it gathered already, in forward (training and
// evaluation) and in backward (the group above prefetched it); without prefetch, never.
TEST(Zero3, TheNextLayerIsPrefetchedWhateverTheBucket) {
  const int layers = 3;
  for (const char* prefetch : {"1", "0"}) {
    SCOPED_TRACE(std::string("prefetch_bucket_size = ") + prefetch);
    std::unique_ptr<Probe> probe;
    train(Case{.options = std::string("prefetch_bucket_size = ") + prefetch +
                          "\nmax_live_parameters = 40000\n",
               .steps = 1},
          &probe);
    const bool on = std::string(prefetch) == "1";
    auto& r = probe->ready_on_entry;  // one step, then one evaluation forward
    for (int g = 1; g <= layers; ++g) EXPECT_EQ((r[{g, 0}]), on ? 2 : 0) << "forward, layer " << g;
    for (int g = 1; g <= layers; ++g) EXPECT_EQ((r[{g, 1}]), on ? 1 : 0) << "backward, layer " << g;
  }
}

// Plugin API 9: zero3 says it shards the parameters (the core then asks the optimizer and the
// precision policy, train/run.cpp); ddp and zero2 keep them whole. The shipped optimizers and
// policies accept sharded parameters — in every option setting that changes how they round or
// where their state lives — as the zero3 runs of zero3_e2e_test (adamw, cpu_adam with and without
// offload, fp32, bf16 nearest and stochastic, fp16) and their conformance tests show they may.
TEST(Zero3, DeclaresShardedParametersAndTheShippedOptimizersAndPoliciesAcceptThem) {
  Env env;
  EXPECT_TRUE(env.make<ciuic::Sharding>(Slot::kSharding, "zero3")->shards_parameters());
  EXPECT_TRUE(env.make<ciuic::Sharding>(Slot::kSharding, "zero3", "offload_params = true\n")
                  ->shards_parameters());
  EXPECT_FALSE(env.make<ciuic::Sharding>(Slot::kSharding, "zero2")->shards_parameters());
  EXPECT_FALSE(env.make<ciuic::Sharding>(Slot::kSharding, "ddp")->shards_parameters());
  EXPECT_TRUE(env.make<ciuic::Optimizer>(Slot::kOptimizer, "adamw")->accepts_sharded_parameters());
  EXPECT_TRUE(env.make<ciuic::Optimizer>(Slot::kOptimizer, "adamw", "kernel = \"aten\"\n")
                  ->accepts_sharded_parameters());
  EXPECT_TRUE(env.make<ciuic::Optimizer>(Slot::kOptimizer, "cpu_adam", "threads = 1\n")
                  ->accepts_sharded_parameters());
  for (const auto& [name, toml] : std::vector<std::pair<std::string, std::string>>{
           {"fp32", ""}, {"bf16", ""}, {"bf16", "rounding = \"stochastic\"\n"}, {"fp16", ""}})
    EXPECT_TRUE(
        env.make<ciuic::Precision>(Slot::kPrecision, name, toml)->accepts_sharded_parameters())
        << name << " " << toml;
  // The interface's defaults, which a plugin written before API 9 keeps: no.
  struct Old final : public ciuic::Precision {};
  EXPECT_FALSE(Old().accepts_sharded_parameters());
}

TEST(Zero3, RefusesALiveBoundSmallerThanTheLargestGroup) {
  Env env;
  auto comm = env.make<ciuic::Comm>(Slot::kComm, "gloo");
  auto prec = env.make<ciuic::Precision>(Slot::kPrecision, "fp32");
  auto opt = env.make<ciuic::Optimizer>(Slot::kOptimizer, "adamw");
  auto shard = env.make<ciuic::Sharding>(Slot::kSharding, "zero3", "max_live_parameters = 1000\n");
  ciuic::model::LlamaModel model(tiny(false), at::kFloat, at::kCPU);
  model.init_random(1, 0.02);
  ciuic::ShardingSetup s;
  for (auto& [n, t] : model.named_parameters()) s.params.push_back({n, t, t.dim() >= 2});
  s.groups = model.param_groups();
  s.comm = comm.get();
  s.precision = prec.get();
  s.optimizer = opt.get();
  try {
    shard->setup(s);
    FAIL() << "accepted";
  } catch (const ciuic::Error& e) {
    EXPECT_EQ(e.exit_code(), ciuic::kExitUsage);
    const std::string m = e.what();
    EXPECT_NE(m.find("max_live_parameters"), std::string::npos) << m;
    EXPECT_NE(m.find("is 1000 elements, but group embed gathers 3072 elements at once"),
              std::string::npos)
        << m;
  }
  // Without groups there is no boundary to gather at.
  auto other = env.make<ciuic::Sharding>(Slot::kSharding, "zero3");
  s.groups.clear();
  try {
    other->setup(s);
    FAIL() << "accepted";
  } catch (const ciuic::Error& e) {
    EXPECT_EQ(e.exit_code(), ciuic::kExitUsage);
    EXPECT_NE(std::string(e.what()).find("announces no parameter groups"), std::string::npos)
        << e.what();
  }
}

// ---- start: no rank holds the whole model
// ---------------------------------------------------------

// Wraps the CPU allocator and counts the bytes it has handed out and not yet taken back, with the
// peak since reset_peak().
class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* inner) : inner_(inner) {}
  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr d = inner_->allocate(n);
    void* data = d.get();
    const int64_t v = live += static_cast<int64_t>(n);
    for (int64_t p = peak; v > p && !peak.compare_exchange_weak(p, v);) {
    }
    return {data, new Held{std::move(d), n, this}, &release, c10::Device(c10::kCPU)};
  }
  void copy_data(void* dst, const void* src, size_t n) const override {
    default_copy_data(dst, src, n);
  }
  void reset_peak() { peak = live.load(); }
  std::atomic<int64_t> live{0}, peak{0};

 private:
  struct Held {
    c10::DataPtr inner;
    size_t n;
    CountingAllocator* self;
  };
  static void release(void* p) {
    auto* h = static_cast<Held*>(p);
    h->self->live -= static_cast<int64_t>(h->n);
    delete h;
  }
  c10::Allocator* inner_;
};

// Installs the counting allocator for the process (tensors made with it outlive any test).
CountingAllocator& counting_allocator() {
  static CountingAllocator* a = [] {
    auto* c = new CountingAllocator(c10::GetDefaultCPUAllocator());
    c10::SetCPUAllocator(c, /*priority=*/255);
    return c;
  }();
  return *a;
}

// Rank `rank` of `world` without peers: set-up must need no collective.
class LoneRank final : public ciuic::Comm {
 public:
  LoneRank(int rank, int world) : rank_(rank), world_(world) {}
  int rank() const override { return rank_; }
  int size() const override { return world_; }
  c10::Device device() const override { return at::kCPU; }
  std::string backend_name() const override { return "none"; }
  std::unique_ptr<ciuic::Work> all_reduce(at::Tensor&, ciuic::ReduceOp) override {
    return refuse();
  }
  std::unique_ptr<ciuic::Work> reduce_scatter(at::Tensor&, const at::Tensor&,
                                              ciuic::ReduceOp) override {
    return refuse();
  }
  std::unique_ptr<ciuic::Work> all_gather(at::Tensor&, const at::Tensor&) override {
    return refuse();
  }
  std::unique_ptr<ciuic::Work> broadcast(at::Tensor&, int) override { return refuse(); }
  void barrier() override { refuse(); }
  ciuic::CommCounters counters() const override { return {}; }

 private:
  static std::unique_ptr<ciuic::Work> refuse() {
    throw ciuic::Error("a collective during zero3's set-up");
  }
  int rank_, world_;
};

// Keeps what the sharding hands the optimizer: the shard's initial values and their positions.
class Recorder final : public ciuic::Optimizer {
 public:
  void setup(const ciuic::OptimizerSetup& s) override {
    shard = s.initial.at(0).values;
    positions = s.positions;
  }
  void accumulate_grad(int, const at::Tensor&, bool, bool) override {}
  at::Tensor finish_grads() override { return {}; }
  void step(const ciuic::OptimizerStep&, at::Tensor&) override {}
  void write_params(at::Tensor&, int64_t) override {}
  std::vector<std::string> state_names() const override { return {}; }
  void save_state(ciuic::StateDict&) const override {}
  void load_state(const ciuic::StateDict&) override {}
  at::Tensor shard;
  std::vector<ciuic::PositionSpan> positions;
};

ciuic::model::LlamaConfig small(bool tied) {
  ciuic::model::LlamaConfig c = tiny(tied, 4);
  c.vocab_size = 512;
  c.hidden_size = 128;
  c.intermediate_size = 384;
  c.head_dim = 32;
  return c;
}

struct Start {
  int64_t peak = 0;         // bytes the allocator handed out at most, beyond what was held before
  int64_t shard_bytes = 0;  // the shard the optimizer was handed
  bool equal = false;       // the shard holds the reference's values at its positions
};

// What the core does at start for a sharding that builds parameters (train/run.cpp): the model
// without memory, then zero3's setup() with the values; counted from before the model exists.
Start start_rank(int rank, int world, bool tied, const ciuic::ParamValues& values_of,
                 const at::Tensor& reference_flat, const ciuic::model::SafetensorsReader* reader) {
  Env env;
  LoneRank comm(rank, world);
  auto prec = env.make<ciuic::Precision>(Slot::kPrecision, "fp32");
  auto shard = env.make<ciuic::Sharding>(Slot::kSharding, "zero3");
  EXPECT_TRUE(shard->builds_parameters());
  Recorder rec;
  CountingAllocator& a = counting_allocator();
  a.reset_peak();
  const int64_t before = a.live;
  Start out;
  {
    ciuic::model::LlamaModel model(small(tied), at::kFloat, at::kCPU, /*allocate=*/false);
    if (reader) model.check_hf(*reader);
    ciuic::ShardingSetup s;
    for (auto& [n, t] : model.named_parameters()) s.params.push_back({n, t, t.dim() >= 2});
    s.groups = model.param_groups();
    s.comm = &comm;
    s.precision = prec.get();
    s.optimizer = &rec;
    s.values = values_of ? values_of
                         : ciuic::ParamValues([&model](int i, int64_t offset, const at::Tensor& o) {
                             model.init_random_values(i, offset, o, 21, 0.05);
                           });
    shard->setup(s);
    out.peak = a.peak - before;
  }
  out.shard_bytes = static_cast<int64_t>(rec.shard.nbytes());
  out.equal = true;
  for (const auto& p : rec.positions)
    if (p.global >= 0)
      out.equal = out.equal && at::equal(rec.shard.narrow(0, p.offset, p.length),
                                         reference_flat.narrow(0, p.global, p.length));
  return out;
}

at::Tensor flat_values(const ciuic::model::LlamaModel& m) {
  std::vector<at::Tensor> parts;
  for (const auto& [n, t] : m.named_parameters()) parts.push_back(t.detach().reshape({-1}));
  return at::cat(parts);
}

// Random initialisation: each rank of worlds 2-4 holds at most its shard plus one whole parameter
// (the values function draws a parameter whole so that its bits are the unsharded run's), never
// the model; the materialised model for comparison holds all of it. The shard's values are the
// unsharded init_random's, bit for bit.
TEST(Zero3Start, EachRankBuildsOnlyItsShardFromRandomInitialisation) {
  for (bool tied : {false, true}) {
    ciuic::model::LlamaModel ref(small(tied), at::kFloat, at::kCPU);
    ref.init_random(21, 0.05);
    const at::Tensor flat = flat_values(ref);
    int64_t largest = 0;
    for (const auto& [n, t] : ref.named_parameters()) largest = std::max(largest, t.numel());
    const int64_t full = flat.numel() * 4, largest_bytes = largest * 4;
    CountingAllocator& a = counting_allocator();
    a.reset_peak();
    const int64_t before = a.live;
    {
      ciuic::model::LlamaModel whole(small(tied), at::kFloat, at::kCPU);
      whole.init_random(21, 0.05);
    }
    const int64_t whole_peak = a.peak - before;
    EXPECT_GE(whole_peak, full) << "the counting allocator does not see the model's parameters";
    for (int world : {2, 3, 4})
      for (int rank = 0; rank < world; ++rank) {
        SCOPED_TRACE("tied " + std::to_string(tied) + ", rank " + std::to_string(rank) + " of " +
                     std::to_string(world));
        const Start s = start_rank(rank, world, tied, {}, flat, nullptr);
        EXPECT_TRUE(s.equal);
        EXPECT_GE(s.peak, s.shard_bytes);
        EXPECT_LE(s.peak, s.shard_bytes + largest_bytes + (64 << 10));
        EXPECT_LT(s.peak, full * 3 / 4);
        std::printf(
            "start, random init, tied %d, world %d rank %d: peak %lld bytes = shard %lld + %lld "
            "(largest parameter %lld, whole model %lld; built whole: %lld)\n",
            tied, world, rank, static_cast<long long>(s.peak),
            static_cast<long long>(s.shard_bytes), static_cast<long long>(s.peak - s.shard_bytes),
            static_cast<long long>(largest_bytes), static_cast<long long>(full),
            static_cast<long long>(whole_peak));
      }
  }
}

// Safetensors: the rank's ranges are copied out of the mapping, nothing else is allocated; the
// shard holds the file's values.
TEST(Zero3Start, EachRankReadsOnlyItsShardOfASafetensorsFile) {
  ciuic::model::LlamaModel ref(small(false), at::kFloat, at::kCPU);
  ref.init_random(5, 0.05);
  std::filesystem::create_directories(CIUIC_TEST_TMP);
  const std::string path = std::string(CIUIC_TEST_TMP) + "/zero3-start.safetensors";
  ciuic::model::write_safetensors(path, ref.named_parameters());
  const auto reader = ciuic::model::SafetensorsReader::open(path);
  const at::Tensor flat = flat_values(ref);
  const auto names = ref.named_parameters();
  const ciuic::ParamValues values = [&](int i, int64_t offset, const at::Tensor& o) {
    reader.load_slice_into(names[static_cast<size_t>(i)].first, offset, o);
  };
  for (int world : {2, 4})
    for (int rank = 0; rank < world; ++rank) {
      SCOPED_TRACE("rank " + std::to_string(rank) + " of " + std::to_string(world));
      const Start s = start_rank(rank, world, false, values, flat, &reader);
      EXPECT_TRUE(s.equal);
      EXPECT_GE(s.peak, s.shard_bytes);
      EXPECT_LE(s.peak, s.shard_bytes + (64 << 10));
      std::printf(
          "start, safetensors, world %d rank %d: peak %lld bytes, shard %lld, whole model %lld\n",
          world, rank, static_cast<long long>(s.peak), static_cast<long long>(s.shard_bytes),
          static_cast<long long>(flat.numel() * 4));
    }
}

}  // namespace
