// LoRA against PEFT 0.21.2 (tests/fixtures/gen_lora.py): a llama (all-linear) and a qwen2
// (q_proj + v_proj, rslora, tied, biases, a sliding layer) adapter loaded from PEFT's own
// save_pretrained files: logits and loss to 1e-5, adapter gradients to 1e-4 (relative, fp32),
// with and without activation checkpointing (and with dropout, checkpointed = plain); the base
// frozen (no gradient); PEFT's init; bad target names and adapters for another base refused naming
// the key or tensor.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <ATen/Context.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/ones.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>

#include <ciuic/context.h>
#include <ciuic/files.h>
#include <ciuic/optimizer.h>
#include <ciuic/store.h>

#include "model/llama.h"
#include "model/llama_ops.h"
#include "model/lora.h"
#include "model_test_util.h"
#include "recipe/recipe.h"
#include "registry/registry.h"
#include "schedule/schedule.h"

namespace ciuic::model {
namespace {

using testing::expect_error;
using testing::max_rel_diff;

const SafetensorsReader& want() {
  static const SafetensorsReader r =
      SafetensorsReader::open(testing::fixture("lora/expected.safetensors"));
  return r;
}

LoraSpec spec_of(const std::string& c) {
  std::ifstream in(testing::fixture("lora/cases.json"));
  const auto j = nlohmann::json::parse(in)[c];
  LoraSpec s;
  s.r = j["r"].get<int64_t>();
  s.alpha = j["alpha"].get<double>();
  s.rslora = j["rslora"].get<bool>();
  if (j["targets"].is_string())
    s.target_names = {j["targets"].get<std::string>()};
  else
    s.target_names = j["targets"].get<std::vector<std::string>>();
  s.targets = lora_target_slots(s.target_names, "target_modules");
  for (const auto& m : j["modules_to_save"]) {
    s.save_embed = s.save_embed || m == "embed_tokens";
    s.save_lm_head = s.save_lm_head || m == "lm_head";
  }
  return s;
}

std::unique_ptr<LlamaModel> load(const std::string& c, c10::Device device = at::kCPU) {
  std::ifstream in(testing::fixture("lora/cases.json"));
  const std::string base = nlohmann::json::parse(in)[c]["base"].get<std::string>();
  auto m = LlamaModel::from_pretrained(testing::fixture("families/" + base), at::kFloat, device);
  m->enable_lora(spec_of(c));
  m->load_lora(
      SafetensorsReader::open(testing::fixture("lora/" + c + "/adapter_model.safetensors")));
  return m;
}

class LoraVsPeft : public ::testing::TestWithParam<std::string> {};

// On the CPU, and on a CUDA device when there is one (fp32: the adapters' shared A product and the
// in-place B GEMM through cuBLAS).
TEST_P(LoraVsPeft, LogitsLossAndAdapterGradients) {
  const std::string c = GetParam();
  std::vector<std::pair<c10::Device, bool>> runs{{at::kCPU, false}, {at::kCPU, true}};
  if (at::hasCUDA()) runs.insert(runs.end(), {{{at::kCUDA, 0}, false}, {{at::kCUDA, 0}, true}});
  for (const auto& [dev, ckpt] : runs) {
    SCOPED_TRACE(std::string(ckpt ? "checkpointed" : "plain") + " on " + dev.str());
    auto m = load(c, dev);
    m->set_activation_checkpointing(ckpt);
    const at::Tensor ids = want().tensor(c + ".input_ids").to(dev),
                     labels = want().tensor(c + ".labels").to(dev);
    {
      at::NoGradGuard ng;
      EXPECT_LT(max_rel_diff(m->forward(ids, at::Tensor(), false), want().tensor(c + ".logits")),
                1e-5);
    }
    at::Tensor loss = m->loss_sum(ids, labels, at::Tensor(), false);
    EXPECT_LT(max_rel_diff(loss, want().tensor(c + ".loss_sum")), 1e-5);
    loss.backward();
    const auto trainable = m->trainable_parameters();
    EXPECT_EQ(trainable.size(), m->lora_parameters().size() + 1);  // + the modules_to_save
    for (const auto& [name, t] : trainable) {
      SCOPED_TRACE(name);
      ASSERT_TRUE(t.grad().defined());
      EXPECT_LT(max_rel_diff(t.grad(), want().tensor(c + ".grad.base_model.model." + name)), 1e-4);
    }
    for (const auto& [name, t] : m->named_parameters()) {
      if (name == "lm_head.weight" || name == "model.embed_tokens.weight") continue;
      EXPECT_FALSE(t.requires_grad()) << name;
      EXPECT_FALSE(t.grad().defined()) << name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, LoraVsPeft, ::testing::Values("llama", "qwen2"));

// merge_lora() with PEFT's adapter after its 20 AdamW steps equals PEFT's merge_and_unload().
TEST(Lora, MergeEqualsPeftMergeAndUnload) {
  for (const std::string c : {"llama", "qwen2"}) {
    SCOPED_TRACE(c);
    auto m = load(c);
    {
      at::NoGradGuard ng;
      for (const auto& [name, t] : m->trainable_parameters())
        t.copy_(want().tensor(c + ".adamw20.base_model.model." + name));
    }
    m->merge_lora();
    for (auto& w : m->lora_parameters()) {
      at::NoGradGuard ng;
      w.second.zero_();  // the merged base alone
    }
    at::NoGradGuard ng;
    EXPECT_LT(max_rel_diff(m->forward(want().tensor(c + ".input_ids"), at::Tensor(), false),
                           want().tensor(c + ".adamw20.merged.logits")),
              1e-5);
  }
}

// The PEFT folder ciuic writes (write_peft_folder): check_peft_export.py loads it with
// peft.PeftModel.from_pretrained on the same base and compares with ciuic's logits, saved beside.
TEST(Lora, ExportedPeftFolder) {
  for (const std::string c : {"llama", "qwen2"}) {
    auto m = load(c);
    {
      at::NoGradGuard ng;
      // not the fixture's adapter; modules_to_save changed too, so that PEFT must read them (and
      // tie qwen2's lm_head to the trained embedding) to give ciuic's logits
      for (const auto& [name, t] : m->trainable_parameters()) t.mul_(-1.5);
    }
    const std::string dir = testing::temp_dir(c);
    std::ifstream in(testing::fixture("lora/cases.json"));
    const std::string base = nlohmann::json::parse(in)[c]["base"].get<std::string>();
    write_peft_folder(dir + "/adapter",
                      peft_adapter_config(*m->lora(), testing::fixture("families/" + base)),
                      m->trainable_parameters(), at::kFloat);
    at::NoGradGuard ng;
    write_safetensors(
        dir + "/ciuic.safetensors",
        {{"input_ids", want().tensor(c + ".input_ids")},
         {"logits", m->forward(want().tensor(c + ".input_ids"), at::Tensor(), false)}});
    // And it reads back (continue training from a PEFT folder).
    auto again =
        LlamaModel::from_pretrained(testing::fixture("families/" + base), at::kFloat, at::kCPU);
    const std::string cfg = dir + "/adapter/adapter_config.json";
    again->enable_lora(lora_spec_from_peft(read_peft_adapter_config(cfg), cfg));
    again->load_lora(SafetensorsReader::open(dir + "/adapter/adapter_model.safetensors"));
    EXPECT_EQ(max_rel_diff(again->forward(want().tensor(c + ".input_ids"), at::Tensor(), false),
                           m->forward(want().tensor(c + ".input_ids"), at::Tensor(), false)),
              0.0);
  }
}

// 20 optimizer steps as a run takes them: ciuic's `adamw` plugin over the flat trainable
// parameters (weight decay on every parameter of dim >= 2, as train/run.cpp marks them), the lr of
// ciuic's warmup_cosine schedule, on the mean token loss; against PEFT + torch.optim.AdamW on
// PEFT's trainable parameters (the LoRA matrices and modules_to_save), after every step.
TEST(Lora, TwentyAdamWStepsEqualPeftAndTorchAdamW) {
  const ciuic::Recipe recipe = ciuic::Recipe::parse(
      "[train]\nmax_steps = 20\n[data]\nplugin = \"synthetic\"\n[optimizer]\nplugin = "
      "\"adamw\"\nlr = 1e-2\nweight_decay = 0.01\n[scheduler]\ntype = \"warmup_cosine\"\n"
      "warmup_num_steps = 4\nwarmup_type = \"linear\"\nwarmup_min_ratio = 0.1\n"
      "cos_min_ratio = 0.1\n",
      "lora20.toml");
  const auto sched = ciuic::schedule::LrSchedule::create(recipe.section("scheduler"), 1e-2, 20);
  const ciuic::Registry reg = ciuic::Registry::from_paths(
      {ciuic_test_paths::plugin_dir() + "/libciuic_optimizer_adamw.so"});
  ciuic::RunContext ctx;
  ctx.store = ciuic::make_local_store(std::chrono::seconds(1));
  ctx.cpu_threads = 1;
  const ciuic::Precision fp32{};
  for (const std::string c : {"llama", "qwen2"}) {
    SCOPED_TRACE(c);
    auto m = load(c);
    const auto params = m->trainable_parameters();
    ciuic::OptimizerSetup su;
    std::vector<at::Tensor> flat;
    for (const auto& [name, t] : params) {
      su.segments.push_back({su.numel, su.numel + t.numel(), t.dim() >= 2});
      su.numel += t.numel();
      flat.push_back(t.detach().reshape(-1));
    }
    su.grad_regions = {{0, su.numel}};
    su.initial = {ciuic::ShardValues{0, at::cat(flat)}};
    su.precision = &fp32;
    auto opt = reg.create<ciuic::Optimizer>(
        ciuic::Slot::kOptimizer, "adamw",
        recipe.plugin_config(ciuic::Slot::kOptimizer,
                             *reg.get(ciuic::Slot::kOptimizer, "adamw").info),
        ctx);
    opt->setup(su);
    const at::Tensor ids = want().tensor(c + ".input_ids"), labels = want().tensor(c + ".labels");
    const double n = labels.ne(-100).sum().item<double>();
    const at::Tensor lrs = want().tensor(c + ".adamw.lr");
    double worst = 0;
    for (int64_t k = 1; k <= 20; ++k) {
      const double lr = sched->lr(k - 1);
      ASSERT_NEAR(lr, lrs[k - 1].item<double>(), 1e-15) << "the fixture's schedule, step " << k;
      for (const auto& p : params) p.second.mutable_grad() = at::Tensor();
      m->loss_sum(ids, labels, at::Tensor(), false).div(n).backward();
      std::vector<at::Tensor> grads;
      for (const auto& p : params) grads.push_back(p.second.grad().reshape(-1));
      opt->accumulate_grad(0, at::cat(grads), true, true);
      opt->finish_grads();
      ciuic::OptimizerStep h;
      h.lr = lr;
      h.weight_decay = 0.01;
      h.t = k;
      at::Tensor out = at::empty({su.numel});
      opt->step(h, out);
      at::NoGradGuard ng;
      int64_t off = 0;
      for (const auto& [name, t] : params) {
        t.copy_(out.narrow(0, off, t.numel()).view(t.sizes()));
        off += t.numel();
        const double d = max_rel_diff(
            t, want().tensor(c + ".adamw" + std::to_string(k) + ".base_model.model." + name));
        EXPECT_LT(d, 1e-5) << name << " after step " << k;
        worst = std::max(worst, d);
      }
    }
    std::cout << c << ": 20 AdamW steps, worst relative difference to PEFT " << worst << "\n";
  }
}

TEST(Lora, PeftInitialisation) {
  auto m =
      LlamaModel::from_pretrained(testing::fixture("families/llama_pad"), at::kFloat, at::kCPU);
  LoraSpec s;
  s.r = 4;
  s.targets = lora_target_slots({"all-linear"}, "k");
  m->enable_lora(s);
  m->init_lora(7);
  for (const auto& [name, t] : m->lora_parameters()) {
    SCOPED_TRACE(name);
    if (name.ends_with("lora_B.weight")) {
      EXPECT_EQ(t.abs().max().item<double>(), 0.0);
    } else {  // kaiming_uniform_(a = sqrt(5)) = U(-1/sqrt(in), 1/sqrt(in))
      const double bound = 1.0 / std::sqrt(static_cast<double>(t.size(1)));
      EXPECT_LE(t.abs().max().item<double>(), bound);
      EXPECT_GT(t.abs().max().item<double>(), 0.8 * bound);
    }
  }
  // The model with B = 0 computes the base model's logits.
  auto base =
      LlamaModel::from_pretrained(testing::fixture("families/llama_pad"), at::kFloat, at::kCPU);
  const at::Tensor ids = want().tensor("llama.input_ids");
  at::NoGradGuard ng;
  EXPECT_EQ(
      max_rel_diff(m->forward(ids, at::Tensor(), false), base->forward(ids, at::Tensor(), false)),
      0.0);
}

TEST(Lora, TargetsThatMatchNothingListTheLinearModules) {
  expect_error(
      [] {
        lora_target_slots({"q_proj", "qkv_proj"}, "[adapter] target_modules");
      },
      {"[adapter] target_modules", "qkv_proj",
       "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj"});
  expect_error([] { lora_target_slots({}, "[adapter] target_modules"); },
               {"[adapter] target_modules", "empty"});
}

TEST(Lora, AnAdapterForAnotherRankOrBaseIsRefusedNamingTheTensor) {
  auto m =
      LlamaModel::from_pretrained(testing::fixture("families/llama_pad"), at::kFloat, at::kCPU);
  LoraSpec s = spec_of("llama");
  s.r = 8;
  m->enable_lora(s);
  expect_error(
      [&] {
        m->load_lora(
            SafetensorsReader::open(testing::fixture("lora/llama/adapter_model.safetensors")));
      },
      {"adapter_model.safetensors",
       "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"});
  auto q = LlamaModel::from_pretrained(testing::fixture("families/qwen2"), at::kFloat, at::kCPU);
  LoraSpec qs = spec_of("qwen2");
  qs.save_embed = false;  // the shapes of layer 0 differ first
  q->enable_lora(qs);
  expect_error(
      [&] {
        q->load_lora(
            SafetensorsReader::open(testing::fixture("lora/llama/adapter_model.safetensors")));
      },
      {"adapter_model.safetensors", "base_model.model.model.layers.0"});
}

// lora_dropout's statistics (the fixtures compare with dropout 0): over 2^20 elements the branch's
// input is zeroed at rate p, within 5 binomial standard deviations, and every kept element is
// x / (1 - p); at evaluation (no autograd recording: eval, generation) it is x itself.
TEST(Lora, DropoutZeroesAtRatePAndScalesTheRestOnlyWhileTraining) {
  const int64_t n = int64_t{1} << 20;
  const at::Tensor x = at::ones({n});
  for (double p : {0.1, 0.5}) {
    SCOPED_TRACE(p);
    const at::Tensor d = lora_input(x, p);
    const double zeros = d.eq(0).sum().item<double>();
    const double sd = std::sqrt(static_cast<double>(n) * p * (1 - p));
    EXPECT_LT(std::abs(zeros - p * static_cast<double>(n)), 5 * sd)
        << zeros / static_cast<double>(n);
    const at::Tensor kept = d.masked_select(d.ne(0));
    EXPECT_EQ(kept.numel() + static_cast<int64_t>(zeros), n);
    EXPECT_LT(kept.sub(1.0 / (1.0 - p)).abs().max().item<double>(), 1e-6);
    // another draw, another mask
    EXPECT_FALSE(at::equal(d, lora_input(x, p)));
    at::NoGradGuard ng;
    EXPECT_TRUE(lora_input(x, p).is_same(x));
  }
  EXPECT_TRUE(lora_input(x, 0.0).is_same(x));
  // Wired into the model: with dropout 0.5 the training forward differs from run to run, the
  // evaluation forward is the dropout-0 model's, exactly.
  LoraSpec s = spec_of("llama");
  s.dropout = 0.5;
  auto drop =
      LlamaModel::from_pretrained(testing::fixture("families/llama_pad"), at::kFloat, at::kCPU);
  drop->enable_lora(s);
  drop->load_lora(
      SafetensorsReader::open(testing::fixture("lora/llama/adapter_model.safetensors")));
  auto plain = load("llama");
  const at::Tensor ids = want().tensor("llama.input_ids"), labels = want().tensor("llama.labels");
  const at::Tensor l1 = drop->loss_sum(ids, labels, at::Tensor(), false),
                   l2 = drop->loss_sum(ids, labels, at::Tensor(), false),
                   l0 = plain->loss_sum(ids, labels, at::Tensor(), false);
  EXPECT_NE(l1.item<double>(), l2.item<double>());
  EXPECT_NE(l1.item<double>(), l0.item<double>());
  at::NoGradGuard ng;
  EXPECT_TRUE(
      at::equal(drop->forward(ids, at::Tensor(), false), plain->forward(ids, at::Tensor(), false)));
}

// Dropout under activation checkpointing: the recomputation draws the forward's masks and the
// generator is left where the plain layer leaves it. With dropout 0.1 and one seed, two steps of
// the checkpointed model give the plain model's losses and adapter gradients (fp32, 1e-6), which
// differ from the dropout-0 model's (the masks are in use) and from step to step. Both fixtures
// (llama all-linear; qwen2 q/v with biases and a sliding layer); on CUDA too when there is one.
TEST(Lora, DropoutWithCheckpointingEqualsWithout) {
  std::vector<c10::Device> devices{at::kCPU};
  if (at::hasCUDA()) devices.emplace_back(at::kCUDA, 0);
  for (const c10::Device dev : devices)
    for (const std::string c : {"llama", "qwen2"}) {
      SCOPED_TRACE(c + " on " + dev.str());
      struct Steps {
        std::vector<double> loss;
        std::vector<std::vector<at::Tensor>> grads;  // per step, trainable_parameters() order
      };
      auto run = [&](double dropout, bool ckpt) {
        std::ifstream in(testing::fixture("lora/cases.json"));
        const std::string base = nlohmann::json::parse(in)[c]["base"].get<std::string>();
        auto m = LlamaModel::from_pretrained(testing::fixture("families/" + base), at::kFloat, dev);
        LoraSpec s = spec_of(c);
        s.dropout = dropout;
        m->enable_lora(s);
        m->load_lora(
            SafetensorsReader::open(testing::fixture("lora/" + c + "/adapter_model.safetensors")));
        m->set_activation_checkpointing(ckpt);
        const at::Tensor ids = want().tensor(c + ".input_ids").to(dev),
                         labels = want().tensor(c + ".labels").to(dev);
        at::manual_seed(1234);
        Steps out;
        for (int step = 0; step < 2; ++step) {
          at::Tensor loss = m->loss_sum(ids, labels, at::Tensor(), false);
          loss.backward();
          out.loss.push_back(loss.item<double>());
          out.grads.emplace_back();
          for (auto& [name, t] : m->trainable_parameters()) {
            out.grads.back().push_back(t.grad().detach().cpu().clone());
            t.mutable_grad() = at::Tensor();
          }
        }
        return out;
      };
      const Steps plain = run(0.1, false), ckpt = run(0.1, true), none = run(0.0, false);
      ASSERT_EQ(ckpt.grads.size(), 2u);
      for (int step = 0; step < 2; ++step) {
        SCOPED_TRACE(step);
        EXPECT_NEAR(ckpt.loss[step], plain.loss[step], 1e-6 * std::abs(plain.loss[step]));
        EXPECT_NE(plain.loss[step], none.loss[step]);
        ASSERT_EQ(ckpt.grads[step].size(), plain.grads[step].size());
        for (size_t i = 0; i < plain.grads[step].size(); ++i)
          EXPECT_LT(max_rel_diff(ckpt.grads[step][i], plain.grads[step][i]), 1e-6) << i;
      }
      EXPECT_NE(plain.loss[0], plain.loss[1]);  // each step draws new masks
    }
}

// [adapter] init_from: PEFT's own folder (save_pretrained of the fixture) gives the spec, fills the
// keys the recipe left unset, and with its tensors loaded the model computes PEFT's logits; keys
// set to other values are refused naming the key and both values.
TEST(Lora, InitFromAPeftFolderFillsTheSpecAndGivesPeftsLogits) {
  const std::vector<std::string> all = {"r",          "alpha",          "dropout",
                                        "use_rslora", "target_modules", "modules_to_save"};
  for (const std::string c : {"llama", "qwen2"}) {
    SCOPED_TRACE(c);
    const std::string folder = testing::fixture("lora/" + c);
    const LoraSpec s = lora_spec_init_from(folder, LoraSpec{}, all, "[adapter] init_from");
    const LoraSpec want_spec = spec_of(c);
    EXPECT_EQ(s.r, want_spec.r);
    EXPECT_EQ(s.alpha, want_spec.alpha);
    EXPECT_EQ(s.rslora, want_spec.rslora);
    EXPECT_EQ(s.targets, want_spec.targets);
    EXPECT_EQ(s.save_embed, want_spec.save_embed);
    EXPECT_EQ(s.save_lm_head, want_spec.save_lm_head);
    EXPECT_EQ(s.init_from, folder);
    std::ifstream in(testing::fixture("lora/cases.json"));
    const std::string base = nlohmann::json::parse(in)[c]["base"].get<std::string>();
    auto m =
        LlamaModel::from_pretrained(testing::fixture("families/" + base), at::kFloat, at::kCPU);
    m->enable_lora(s);
    m->load_lora(SafetensorsReader::open(folder + "/adapter_model.safetensors"));
    at::NoGradGuard ng;
    const double d = max_rel_diff(m->forward(want().tensor(c + ".input_ids"), at::Tensor(), false),
                                  want().tensor(c + ".logits"));
    EXPECT_LT(d, 1e-5);
    std::cout << c << ": logits from PEFT's folder, max relative difference " << d << "\n";
  }
  // The recipe's own values: equal ones pass, others are refused by name.
  const std::string q = testing::fixture("lora/qwen2");
  LoraSpec r;
  r.r = 2;
  r.alpha = 3;
  r.rslora = true;
  r.target_names = {"v_proj", "q_proj"};
  r.targets = lora_target_slots(r.target_names, "k");
  r.save_embed = true;
  EXPECT_EQ(lora_spec_init_from(q, r, {"dropout"}, "w").r, 2);
  auto refused = [&](const LoraSpec& bad, std::initializer_list<std::string> parts) {
    expect_error([&] { lora_spec_init_from(q, bad, {"dropout"}, "here.toml:3:1"); }, parts);
  };
  LoraSpec b = r;
  b.r = 8;
  refused(b, {"[adapter] r = 8", "r = 2", "here.toml:3:1", "adapter_config.json"});
  b = r;
  b.alpha = 16;
  refused(b, {"[adapter] alpha = 16", "lora_alpha = 3"});
  b = r;
  b.rslora = false;
  refused(b, {"[adapter] use_rslora = false", "use_rslora = true"});
  b = r;
  b.targets = lora_target_slots({"all-linear"}, "k");
  refused(b, {"[adapter] target_modules = [q_proj, k_proj", "target_modules = [q_proj, v_proj]"});
  b = r;
  b.save_embed = false;
  refused(b, {"[adapter] modules_to_save = []", "modules_to_save = [embed_tokens]"});
  expect_error([] { lora_spec_init_from("/nonexistent/adapter", LoraSpec{}, {}, "where"); },
               {"where", "/nonexistent/adapter", "adapter_config.json"});
}

// A hostile adapter_config.json: a rank its tensors do not have is refused naming a tensor, before
// anything of that rank is allocated (r = 1e11 would ask for r x hidden per layer); a deep nest
// is refused by the JSON depth bound, not parsed.
TEST(Lora, InitFromChecksTheRankAgainstTheTensorsAndBoundsTheConfig) {
  const std::string src = testing::fixture("lora/llama");
  const std::string dir = std::string(CIUIC_TEST_TMP) + "/lora-hostile";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::filesystem::copy(src + "/adapter_model.safetensors", dir + "/adapter_model.safetensors");
  std::ifstream in(src + "/adapter_config.json");
  nlohmann::json j = nlohmann::json::parse(in);
  const std::vector<std::string> all = {"r",          "alpha",          "dropout",
                                        "use_rslora", "target_modules", "modules_to_save"};
  for (const int64_t r : {int64_t{100000000000}, j["r"].get<int64_t>() + 1}) {
    j["r"] = r;
    std::ofstream(dir + "/adapter_config.json") << j.dump();
    expect_error([&] { lora_spec_init_from(dir, LoraSpec{}, all, "w"); },
                 {"adapter_model.safetensors", "lora_A.weight", "rank-" + std::to_string(r)});
  }
  std::ofstream(dir + "/adapter_config.json")
      << std::string(100000, '[') << std::string(100000, ']');
  expect_error([&] { lora_spec_init_from(dir, LoraSpec{}, all, "w"); },
               {"adapter_config.json", "nest"});
}

// modules_to_save on a tied model: an adapter_config.json without ensure_weight_tying means
// PEFT trained the embedding apart from the tied lm_head, which ciuic cannot represent: refused.
TEST(Lora, UntiedModulesToSaveOnATiedModelIsRefused) {
  std::ifstream in(testing::fixture("lora/qwen2/adapter_config.json"));
  nlohmann::json j = nlohmann::json::parse(in);
  j["ensure_weight_tying"] = false;
  const LoraSpec s = lora_spec_from_peft(j, "adapter_config.json");
  auto q = LlamaModel::from_pretrained(testing::fixture("families/qwen2"), at::kFloat, at::kCPU);
  expect_error([&] { q->enable_lora(s); }, {"modules_to_save", "ensure_weight_tying"});
  // On an untied model the flag does not matter.
  auto l =
      LlamaModel::from_pretrained(testing::fixture("families/llama_pad"), at::kFloat, at::kCPU);
  l->enable_lora(s);
}

// adapter_config.json is read as every JSON input (ciuic/files.h, ciuic/json.h): a regular file of
// at most kMaxJsonInputBytes, nested at most 128 deep, and a value of the wrong type is a clear
// UsageError (exit 2) naming the file and key, never a JSON library exception.
TEST(Lora, AdapterConfigFileIsBoundedAndTyped) {
  const std::string dir = testing::temp_dir("cfg"), path = dir + "/adapter_config.json";
  auto usage = [&](const std::string& text, std::initializer_list<std::string> parts) {
    std::ofstream(path, std::ios::trunc) << text;
    try {
      lora_spec_from_peft(read_peft_adapter_config(path), path);
      ADD_FAILURE() << "accepted " << text;
    } catch (const UsageError& e) {
      for (const auto& p : parts)
        EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
  };
  EXPECT_EQ(lora_spec_from_peft(
                read_peft_adapter_config(testing::fixture("lora/llama/adapter_config.json")), "x")
                .r,
            4);
  // Each was nlohmann's type_error, uncaught (the fuzz target's first finds).
  usage("{\"peft_type\": 1}", {path, "peft_type must be a string, got 1"});
  usage("{\"peft_type\": \"LORA\", \"bias\": false, \"r\": 2}", {path, "bias must be a string"});
  usage(
      "{\"peft_type\": \"LORA\", \"r\": 1e300, \"lora_alpha\": 1, \"target_modules\": \"q_proj\"}",
      {path, "r must be an integer, got 1e+300"});
  usage(
      "{\"peft_type\": \"LORA\", \"r\": 2, \"lora_alpha\": 1, \"lora_dropout\": \"x\", "
      "\"target_modules\": \"q_proj\"}",
      {path, "lora_dropout must be a number"});
  usage("{\"peft_type\": \"LORA\", \"r\": 2, \"lora_alpha\": 1, \"target_modules\": [3]}",
        {path, "malformed adapter config"});
  usage("{oops", {path, "malformed JSON"});
  usage(std::string(200, '[') + std::string(200, ']'), {path, "nested deeper than 128"});
  std::ofstream(path, std::ios::trunc).close();
  std::filesystem::resize_file(path, kMaxJsonInputBytes + 1);  // sparse: nothing is written
  try {
    read_peft_adapter_config(path);
    ADD_FAILURE() << "read a file over the bound";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("over the limit of 268435456 bytes"), std::string::npos)
        << e.what();
  }
  try {
    read_peft_adapter_config("/dev/zero");
    ADD_FAILURE() << "read /dev/zero";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ciuic::model
