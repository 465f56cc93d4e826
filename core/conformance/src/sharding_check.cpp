// check_sharding (ciuic/testing/conformance.h): the sharding protocol of ciuic/sharding.h driven as
// the trainer drives it (core/src/train/trainer.cpp and step.h: micro-batches, the model's layer
// boundaries, finish_grads -> global norm -> clip -> update), on the engine's own decoder model
// (tiny, fp32, CPU) with the installed gloo, fp32 and adamw plugins, each rank a forked process.
//
// The reference is computed in every rank without any plugin: one model, the whole global batch,
// plain autograd, AdamW in fp64 (torch.optim.AdamW's update), the same clipping. After the steps
// the check reads every parameter through kForward boundaries (a parameter-sharding plugin gathers
// it there) and compares. Then the state saved after step kSaveAfter (layout() + save_state(),
// per rank) is loaded into fresh plugins — of the next world size the check runs — which must go
// on to the reference's parameters as well.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <ciuic/comm.h>
#include <ciuic/error.h>
#include <ciuic/grad_norm.h>
#include <ciuic/optimizer.h>
#include <ciuic/precision.h>
#include <ciuic/sharding.h>
#include <ciuic/testing/conformance.h>

#include "model/config.h"
#include "model/llama.h"
#include "ranks.h"
#include "support.h"

namespace ciuic::conformance {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr int kSteps = 4, kSaveAfter = 2, kAccumulation = 2;
constexpr int64_t kGlobalRows =
    12;  // rows of one micro-batch over all ranks (1, 2, 3, 4 divide it)
constexpr int64_t kSeqLen = 9;
constexpr double kLr = 3e-2, kWeightDecay = 0.1, kClip = 0.05;  // the clip bites on every step
// eps as large as the clipped gradients' elements: Adam is then not invariant to the gradient's
// scale, so a wrong norm, clip coefficient or reduction (an average for a sum) shows.
constexpr double kBeta1 = 0.9, kBeta2 = 0.999, kEps = 1e-3;
// Agreement: 1e-4 relative, and 1e-5 absolute — a few parts in 1e3 of one step's update (lr): the
// reference sums gradients in another order, and an element whose update nearly cancels over the
// steps carries fp32's relative error of its gradient times lr.
constexpr double kRtol = 1e-4, kAtol = 1e-5;

// One shape of the check: tied embeddings make a parameter belong to two groups (embed, head);
// activation checkpointing adds kRecompute boundaries.
struct Variant {
  const char* name;
  bool tied;
  bool checkpointing;
};
constexpr Variant kVariants[] = {{"untied", false, false},
                                 {"tied, activation checkpointing", true, true}};

model::LlamaConfig tiny_config(bool tied) {
  const nlohmann::json j = {{"model_type", "llama"},    {"vocab_size", 61},
                            {"hidden_size", 16},        {"intermediate_size", 24},
                            {"num_hidden_layers", 3},   {"num_attention_heads", 4},
                            {"num_key_value_heads", 2}, {"max_position_embeddings", 64},
                            {"rms_norm_eps", 1e-6},     {"tie_word_embeddings", tied},
                            {"bos_token_id", 1},        {"eos_token_id", 2}};
  return model::LlamaConfig::from_json(j, "conformance model");
}

// Micro-batch `m` of step `step` (1-based) over all ranks: ids [kGlobalRows, kSeqLen], labels with
// some positions ignored (-100), so ranks hold different numbers of label tokens.
struct Batch {
  at::Tensor ids, labels;
};
Batch global_batch(int step, int m, int64_t vocab, uint64_t seed) {
  auto gen =
      at::make_generator<at::CPUGeneratorImpl>(seed * 7919 + static_cast<uint64_t>(step * 31 + m));
  Batch b;
  b.ids = at::randint(vocab, {kGlobalRows, kSeqLen}, gen, at::TensorOptions().dtype(at::kLong));
  b.labels = at::randint(vocab, {kGlobalRows, kSeqLen}, gen, at::TensorOptions().dtype(at::kLong));
  const at::Tensor drop = at::rand({kGlobalRows, kSeqLen}, gen) < 0.25;
  b.labels.masked_fill_(drop, -100);
  return b;
}
// Rank `rank` of `world` reads rows rank, rank + world, ... (global dealing).
Batch rank_rows(const Batch& b, int rank, int world) {
  const at::Tensor rows = at::arange(rank, kGlobalRows, world, at::kLong);
  return {b.ids.index_select(0, rows), b.labels.index_select(0, rows)};
}
int64_t step_label_tokens(int step, int64_t vocab, uint64_t seed) {
  int64_t n = 0;
  for (int m = 0; m < kAccumulation; ++m)
    n += global_batch(step, m, vocab, seed).labels.ne(-100).sum().item<int64_t>();
  return n;
}

// allocate = false: the parameters without memory, as the core builds them for a sharding that
// builds_parameters() (their values then come from ShardingSetup::values).
std::unique_ptr<model::LlamaModel> make_model(const Variant& v, uint64_t seed,
                                              bool allocate = true) {
  auto m = std::make_unique<model::LlamaModel>(tiny_config(v.tied), at::kFloat,
                                               c10::Device(c10::kCPU), allocate);
  if (allocate) m->init_random(seed, 0.2);
  m->set_fused_kernels(false);
  if (v.checkpointing) m->set_activation_checkpointing(true, 2);
  return m;
}

// The reference: every parameter after each step, in fp64, by name.
using Params = std::map<std::string, at::Tensor>;
std::vector<Params> reference(const Variant& v, uint64_t seed) {
  auto model = make_model(v, seed);
  const auto named = model->named_parameters();
  std::vector<at::Tensor> p, m, s;
  for (const auto& [name, t] : named) {
    p.push_back(t.detach().to(at::kDouble));
    m.push_back(at::zeros_like(p.back()));
    s.push_back(at::zeros_like(p.back()));
  }
  std::vector<Params> out;
  for (int step = 1; step <= kSteps; ++step) {
    const double tokens =
        static_cast<double>(step_label_tokens(step, model->config().vocab_size, seed));
    for (const auto& [name, t] : named) t.mutable_grad() = at::Tensor();
    for (int mb = 0; mb < kAccumulation; ++mb) {
      const Batch b = global_batch(step, mb, model->config().vocab_size, seed);
      (model->loss_sum(b.ids, b.labels, at::Tensor(), false) / tokens).backward();
    }
    double sq = 0;
    for (const auto& [name, t] : named) sq += t.grad().to(at::kDouble).pow(2).sum().item<double>();
    const double norm = std::sqrt(sq), scale = norm > kClip ? kClip / (norm + 1e-6) : 1.0;
    const double bc1 = 1 - std::pow(kBeta1, step), bc2 = 1 - std::pow(kBeta2, step);
    Params now;
    c10::NoGradGuard ng;
    for (size_t i = 0; i < named.size(); ++i) {
      const at::Tensor g = named[i].second.grad().to(at::kDouble) * scale;
      m[i] = m[i] * kBeta1 + g * (1 - kBeta1);
      s[i] = s[i] * kBeta2 + g * g * (1 - kBeta2);
      const bool decay = named[i].second.dim() >= 2;
      p[i] = p[i] * (decay ? 1 - kLr * kWeightDecay : 1.0) -
             (m[i] / bc1) / ((s[i] / bc2).sqrt() + kEps) * kLr;
      named[i].second.copy_(p[i]);  // the model computes the next step with the updated values
      now[named[i].first] = p[i].clone();
    }
    out.push_back(std::move(now));
  }
  return out;
}

// The plugins of one rank: the sharding under test with the installed gloo, fp32 and adamw.
struct Slots {
  std::shared_ptr<PluginObject> comm_obj, precision_obj, optimizer_obj, sharding_obj;
  Comm* comm = nullptr;
  Precision* precision = nullptr;
  Optimizer* optimizer = nullptr;
  Sharding* sharding = nullptr;
};
Slots make_slots(const PluginUnderTest& plugin, const Config& cfg, const RunContext& ctx) {
  Slots s;
  s.comm_obj = plugin.create_helper(Slot::kComm, "gloo", "threads = 1\n", ctx);
  s.precision_obj = plugin.create_helper(Slot::kPrecision, "fp32", "", ctx);
  s.optimizer_obj =
      plugin.create_helper(Slot::kOptimizer, "adamw", "kernel = \"aten\"\neps = 1e-3\n", ctx);
  s.sharding_obj = plugin.create(cfg, ctx);
  s.comm = dynamic_cast<Comm*>(s.comm_obj.get());
  s.precision = dynamic_cast<Precision*>(s.precision_obj.get());
  s.optimizer = dynamic_cast<Optimizer*>(s.optimizer_obj.get());
  s.sharding = dynamic_cast<Sharding*>(s.sharding_obj.get());
  if (!s.sharding) throw Error("the plugin's factory made no ciuic::Sharding");
  if (!s.comm || !s.precision || !s.optimizer)
    throw Error("a helper plugin (gloo, fp32, adamw) is not what its slot needs");
  return s;
}

void setup(Slots& s, model::LlamaModel& model, const ParamValues& values = {}) {
  ShardingSetup ss;
  ss.values = values;
  for (auto& [name, t] : model.named_parameters())
    ss.params.push_back(ShardingParam{name, t, t.dim() >= 2});
  ss.groups = model.param_groups();
  ss.comm = s.comm;
  ss.precision = s.precision;
  ss.optimizer = s.optimizer;
  ss.gradient_accumulation_steps = kAccumulation;
  s.sharding->setup(ss);
  model.set_group_boundaries(s.sharding);
}

// One optimizer step as the trainer takes it (fp32: loss scale 1, no skip).
void train_step(Slots& s, model::LlamaModel& model, int step, int rank, int world, uint64_t seed) {
  const double tokens =
      static_cast<double>(step_label_tokens(step, model.config().vocab_size, seed));
  for (int mb = 0; mb < kAccumulation; ++mb) {
    s.sharding->begin_micro_batch(mb, mb == kAccumulation - 1);
    const Batch b = rank_rows(global_batch(step, mb, model.config().vocab_size, seed), rank, world);
    (model.loss_sum(b.ids, b.labels, at::Tensor(), false) / tokens).backward();
  }
  const GradSquares sq = s.sharding->finish_grads();
  const GradNorm n = global_grad_norm_from_squares(sq.local_sum_sq, *s.comm, sq.disjoint);
  OptimizerStep args;
  args.lr = kLr;
  args.weight_decay = kWeightDecay;
  args.grad_scale = n.norm > kClip ? kClip / (n.norm + 1e-6) : 1.0;
  args.t = step;
  s.sharding->update(args);
}

// Every parameter's current value, read inside its groups' kForward boundaries.
Params read_params(Slots& s, model::LlamaModel& model) {
  c10::NoGradGuard ng;
  const auto named = model.named_parameters();
  const auto groups = model.param_groups();
  Params out;
  for (size_t g = 0; g < groups.size(); ++g) {
    s.sharding->before_group(static_cast<int>(g), GroupPass::kForward);
    for (int i : groups[g].params)
      out[named[i].first] = named[i].second.detach().to(at::kDouble).clone();
    s.sharding->after_group(static_cast<int>(g), GroupPass::kForward);
  }
  return out;
}

void compare(const Params& got, const Params& want, const std::string& what, Lines& lines) {
  for (const auto& [name, w] : want) {
    auto it = got.find(name);
    if (it == got.end()) {
      lines.add(what + ": parameter " + name + " was not read");
      continue;
    }
    const at::Tensor err = (it->second - w).abs() - (w.abs() * kRtol + kAtol);
    const double worst = err.max().item<double>();
    if (worst > 0) {
      const int64_t at_ = err.reshape({-1}).argmax().item<int64_t>();
      std::ostringstream m;
      m << what << ": " << name << " element " << at_ << " is "
        << it->second.reshape({-1})[at_].item<double>()
        << ", the reference (one process, whole batch, AdamW in fp64) "
        << w.reshape({-1})[at_].item<double>();
      lines.add(m.str());
    }
  }
}

// A rank's saved state: layout lines "param param_offset length shard_offset", one raw fp32 file
// per optimizer state.
void save(const Slots& s, const std::string& dir, int rank) {
  fs::create_directories(dir);
  std::ofstream lay(dir + "/rank" + std::to_string(rank) + ".layout");
  for (const ShardSlice& sl : s.sharding->layout())
    lay << sl.param << " " << sl.param_offset << " " << sl.length << " " << sl.shard_offset << "\n";
  StateDict sd;
  s.sharding->save_state(sd);
  for (const auto& [name, t] : sd) {
    const at::Tensor c = t.contiguous().to(at::kFloat);
    std::ofstream f(dir + "/rank" + std::to_string(rank) + "." + name + ".bin", std::ios::binary);
    f.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.numel() * 4));
  }
}

// Slices of the state a world of `world` ranks saved in `dir`.
SliceFetcher fetcher(const std::string& dir, int world) {
  return [dir, world](const std::string& state, const std::string& param, int64_t offset,
                      int64_t length) {
    at::Tensor out = at::full({length}, NAN, at::kFloat);
    at::Tensor have = at::zeros({length}, at::kBool);  // replicated state (ddp) is read once
    for (int r = 0; r < world; ++r) {
      std::ifstream lay(dir + "/rank" + std::to_string(r) + ".layout");
      std::string p;
      int64_t po, len, so;
      while (lay >> p >> po >> len >> so) {
        if (p != param) continue;
        const int64_t b = std::max(po, offset), e = std::min(po + len, offset + length);
        if (b >= e) continue;
        std::ifstream f(dir + "/rank" + std::to_string(r) + "." + state + ".bin", std::ios::binary);
        if (!f) throw Error("no saved state " + state + " of rank " + std::to_string(r));
        at::Tensor part = at::empty({e - b}, at::kFloat);
        f.seekg((so + (b - po)) * 4);
        f.read(static_cast<char*>(part.data_ptr()), (e - b) * 4);
        at::Tensor dst = out.narrow(0, b - offset, e - b), got = have.narrow(0, b - offset, e - b);
        dst.copy_(at::where(got, dst, part));
        got.fill_(true);
      }
    }
    const int64_t covered = have.sum().item<int64_t>();
    if (covered != length)
      throw Error("the saved layouts cover " + std::to_string(covered) + " of " +
                  std::to_string(length) + " elements of " + param + " [" + std::to_string(offset) +
                  ", +" + std::to_string(length) + ")");
    return out;
  };
}

}  // namespace

void check_sharding(const PluginUnderTest& plugin, const CheckOptions& o) {
  ASSERT_EQ(plugin.slot(), Slot::kSharding) << plugin.path();
  const Config cfg = plugin.config(o.options_toml);
  const std::string dir = work_dir(o, "sharding");
  for (size_t vi = 0; vi < std::size(kVariants); ++vi) {
    const Variant& v = kVariants[vi];
    int saved_world = 0;  // the world size whose step-kSaveAfter state the next world resumes from
    for (int world : o.world_sizes) {
      SCOPED_TRACE(std::string(v.name) + ", world size " + std::to_string(world));
      const std::string save_dir = dir + "/v" + std::to_string(vi) + "-w" + std::to_string(world);
      const std::string load_dir =
          dir + "/v" + std::to_string(vi) + "-w" + std::to_string(saved_world);
      const int load_world = saved_world;
      run_ranks(
          world, 300s,
          [&](int rank, int W, int port, const std::shared_ptr<Store>& store, Lines& lines) {
            const std::string who =
                "rank " + std::to_string(rank) + " of " + std::to_string(W) + " (" + v.name + ")";
            const std::vector<Params> want = reference(v, o.seed);
            RunContext ctx = make_context(rank, W, store, o.device,
                                          dir + "/ctx-r" + std::to_string(rank), o.seed);
            ctx.master_port = port;
            {  // Uninterrupted, saving after step kSaveAfter.
              Slots s = make_slots(plugin, cfg, ctx);
              auto made = make_model(v, o.seed);
              Params initial;  // read before setup(): a parameter-sharding plugin frees them
                               // outside boundaries
              for (const auto& [name, t] : made->named_parameters())
                initial[name] = t.detach().to(at::kDouble).clone();
              // A plugin that builds its parameters gets them without memory and their values, as
              // from the core (train/run.cpp): it must read them through `values` only.
              const bool builds = s.sharding->builds_parameters();
              auto model = builds ? make_model(v, o.seed, /*allocate=*/false) : std::move(made);
              setup(s, *model,
                    builds ? ParamValues([&made](int i, int64_t offset, const at::Tensor& out) {
                      out.copy_(made->named_parameters()
                                    .at(static_cast<size_t>(i))
                                    .second.detach()
                                    .reshape({-1})
                                    .narrow(0, offset, out.numel()));
                    })
                           : ParamValues());
              made.reset();
              compare(read_params(s, *model), initial, who + ", after setup()", lines);
              for (int step = 1; step <= kSteps; ++step) {
                train_step(s, *model, step, rank, W, o.seed);
                compare(read_params(s, *model), want[step - 1],
                        who + ", step " + std::to_string(step), lines);
                if (step == kSaveAfter) save(s, save_dir, rank);
              }
            }
            if (load_world >
                0) {  // Resumed from the previous world size's state of step kSaveAfter.
              const std::string from = who + ", resumed from world size " +
                                       std::to_string(load_world) + " after step " +
                                       std::to_string(kSaveAfter);
              Slots s = make_slots(plugin, cfg, ctx);
              auto model =
                  make_model(v, o.seed + 17);  // other values: load_state must replace them
              setup(s, *model);
              s.sharding->load_state(fetcher(load_dir, load_world), kSaveAfter);
              compare(read_params(s, *model), want[kSaveAfter - 1], from + ", after load_state()",
                      lines);
              for (int step = kSaveAfter + 1; step <= kSteps; ++step) {
                train_step(s, *model, step, rank, W, o.seed);
                compare(read_params(s, *model), want[step - 1],
                        from + ", step " + std::to_string(step), lines);
              }
            }
          });
      saved_world = world;
    }
  }
}

}  // namespace ciuic::conformance
