#include "train/plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include <ciuic/bucket_sharding.h>
#include <ciuic/config.h>
#include <ciuic/error.h>

#include "model/config.h"
#include "model/llama.h"
#include "recipe/recipe.h"
#include "registry/registry.h"
#include "train/worker.h"

namespace ciuic::train {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
// BucketSharding's in-flight reductions, plus the one being packed.
constexpr double kInFlight = BucketSharding::kMaxInFlight + 1;
constexpr double kLossChunk = double(model::LlamaModel::kDefaultLossChunkElements);

std::string gib(double b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", b / kGiB);
  return buf;
}

// A plugin option with its declared default (the recipe was validated against the plugin).
Config plugin_config(const Recipe& recipe, const Registry& registry, Slot slot) {
  const std::string name = recipe.plugin_name(slot);
  return recipe.plugin_config(slot, *registry.get(slot, name).info);
}

}  // namespace

MemoryPlan plan_memory(const Recipe& recipe, const Registry& registry) {
  MemoryPlan plan;
  const Config cluster = recipe.section("cluster");
  const Config train = recipe.section("train");
  plan.world_size = static_cast<int>(cluster.get_int("nproc_per_node") * cluster.get_int("nnodes"));
  plan.device = cluster.get_string("device");
  plan.cap = cluster.get_float("memory_per_device_gib") * kGiB;
  const model::LlamaConfig cfg = recipe_model_config(recipe);
  const double P = static_cast<double>(cfg.num_parameters());
  const double micro = static_cast<double>(train.get_int("micro_batch_size"));
  const double seq = static_cast<double>(train.get_int("seq_len"));
  const int64_t accumulation = train.get_int("gradient_accumulation_steps");
  const bool ckpt = recipe.section("model").get_bool("activation_checkpointing");

  // Precision: parameter / compute dtype and the dtype gradients are reduced in.
  for (Slot slot : {Slot::kPrecision, Slot::kSharding, Slot::kOffload})
    if (!recipe.plugin_name(slot).empty()) registry.get(slot, recipe.plugin_name(slot));  // unknown: UsageError
  const std::string precision = recipe.plugin_name(Slot::kPrecision);
  double pbytes = 4, rbytes = 4;
  if (precision == "bf16" || precision == "fp16") {
    pbytes = 2;
    const std::string rd = plugin_config(recipe, registry, Slot::kPrecision).get_string("reduce_dtype");
    rbytes = rd == "fp32" ? 4 : 2;
  } else if (precision != "fp32") {
    plan.unknown.push_back("precision " + precision + " (assumed fp32)");
  }

  // Sharding: ZeRO-2 splits master weights, moments and the gradient shard over the ranks.
  const std::string sharding = recipe.plugin_name(Slot::kSharding);
  double shards = 1, bucket = P;
  bool reduce_each = false;
  if (sharding == "zero2" || sharding == "ddp") {
    const Config sc = plugin_config(recipe, registry, Slot::kSharding);
    shards = sharding == "zero2" ? plan.world_size : 1;
    bucket = std::min(P, sc.get_float("reduce_bucket_size"));
    reduce_each = sc.get_string("grad_accumulation") == "reduce_each";
  } else {
    plan.unknown.push_back("sharding " + sharding);
  }
  const double S = std::ceil(P / shards);
  const std::string offload = recipe.plugin_name(Slot::kOffload);
  const bool host_optim = offload == "cpu_adam";
  if (!offload.empty() && !host_optim) plan.unknown.push_back("offload " + offload);
  const bool gpu = plan.device == "cuda";
  const bool host_state = host_optim && gpu;  // on a CPU run everything is "device" memory

  auto add = [&](const std::string& what, bool device, double bytes, const std::string& note) {
    plan.items.push_back(MemoryItem{what, device, bytes, note});
  };
  add("parameters", true, P * pbytes, std::to_string(cfg.num_parameters()) + " x " +
                                          std::to_string(int(pbytes)) + " bytes, whole on every rank");
  add("master weights + AdamW moments", !host_state, S * 12,
      "fp32 x 3, 1/" + std::to_string(int(shards)) + " of the model" +
          (host_state ? " (cpu_adam: pinned host memory)" : ""));
  add("gradient shard", !host_state, S * 4, "fp32");
  if (host_state)  // BucketSharding's host path: every reduced chunk crosses here before the fold
    add("gradient staging", false, S * rbytes, "pinned, reduced chunks before the host fold");
  const double chunk_factor = shards > 1 ? 1.0 + 1.0 / shards : 1.0;  // packed bucket + output chunk
  add("reductions in flight", true, std::min(P, kInFlight * bucket) * rbytes * chunk_factor,
      "up to " + std::to_string(int(kInFlight)) + " buckets of " + std::to_string(int64_t(bucket)) +
          " elements");
  const bool keep_all_grads = !reduce_each && accumulation > 1;
  add("gradients not yet reduced", true, (keep_all_grads ? P : std::min(P, bucket)) * pbytes,
      keep_all_grads ? "no_sync accumulation keeps every parameter's gradient" : "about one bucket");

  // Activations kept for backward, per decoder layer (compute dtype): the residual input, the
  // normed input, q, k, v, the attention output, the second residual and normed input (6 x hidden
  // counting k and v separately below), gate, up, silu(gate) and their product (4 x intermediate).
  const double N = micro * seq;
  const double H = static_cast<double>(cfg.hidden_size);
  const double kv = static_cast<double>(cfg.num_key_value_heads * cfg.head_dim);
  const double q = static_cast<double>(cfg.num_attention_heads * cfg.head_dim);
  const double I = static_cast<double>(cfg.intermediate_size);
  const double layer = (5 * H + q + 2 * kv + 4 * I) * N * pbytes;
  const double L = static_cast<double>(cfg.num_hidden_layers);
  if (ckpt)
    add("activations", true, L * N * H * pbytes + layer,
        "checkpointing: each layer's input, plus one layer recomputed");
  else
    add("activations", true, L * layer + 3 * N * H * pbytes,
        std::to_string(cfg.num_hidden_layers) + " layers x " + gib(layer));
  add("loss chunk", true, std::min(N * cfg.vocab_size, kLossChunk) * 8,
      "fp32 logits and their gradient, chunk by chunk");

  for (const auto& it : plan.items) (it.device ? plan.device_peak : plan.host_total) += it.bytes;
  plan.fits = plan.cap <= 0 || plan.device_peak <= plan.cap;
  if (!plan.fits) {
    auto find = [&](const char* what) {
      for (const auto& it : plan.items)
        if (it.what == what && it.device) return it.bytes;
      return 0.0;
    };
    const double states = find("master weights + AdamW moments") + find("gradient shard");
    if (states > 0)
      plan.advice.push_back("[offload] plugin = \"cpu_adam\" moves master weights, moments and the "
                            "gradient shard to host memory: -" + gib(states));
    if (!ckpt)
      plan.advice.push_back("[model] activation_checkpointing = true keeps each layer's input and one "
                            "layer's activations: -" + gib(find("activations") - (L * N * H * pbytes + layer)));
    if (micro > 1)
      plan.advice.push_back("a smaller [train] micro_batch_size (with more gradient_accumulation_steps): "
                            "activations scale with it");
    if (sharding == "ddp" && plan.world_size > 1)
      plan.advice.push_back("[sharding] plugin = \"zero2\" shards master weights, moments and gradients");
    if (P * pbytes > plan.cap)
      plan.advice.push_back("the parameters alone (" + gib(P * pbytes) +
                            ") exceed the cap: ZeRO-2 keeps them whole on every rank");
  }
  return plan;
}

std::string plan_text(const MemoryPlan& plan) {
  std::ostringstream os;
  os << "memory plan per rank (" << plan.world_size << " rank(s), " << plan.device
     << "); peak at the start of backward:\n";
  for (bool device : {true, false}) {
    for (const auto& it : plan.items)
      if (it.device == device) {
        char line[160];
        std::snprintf(line, sizeof line, "  %-6s %-32s %12s  ", device ? plan.device.c_str() : "host",
                      it.what.c_str(), gib(it.bytes).c_str());
        os << line << it.note << "\n";
      }
  }
  os << "  total " << plan.device << ": " << gib(plan.device_peak);
  if (plan.cap > 0)
    os << " of the " << gib(plan.cap) << " cap ([cluster] memory_per_device_gib): "
       << (plan.fits ? "fits" : "does NOT fit");
  os << "\n  total host: " << gib(plan.host_total) << " per rank\n";
  for (const auto& u : plan.unknown) os << "  not counted: " << u << " (the planner does not know this plugin)\n";
  if (!plan.advice.empty()) {
    os << "what would help:\n";
    for (const auto& a : plan.advice) os << "  - " << a << "\n";
  }
  os << "(estimates: model states follow the code; activations within ~10% of measured peaks)\n";
  return os.str();
}

}  // namespace ciuic::train
