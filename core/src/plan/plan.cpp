// The memory planner (plan/plan.h): model terms here, everything else from the plugins.
#include "plan/plan.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <sstream>

#include <ciuic/config.h>
#include <ciuic/error.h>

#include "base/text.h"
#include "model/config.h"
#include "model/llama.h"
#include "plan/recipe_inputs.h"
#include "quant/nf4_size.h"
#include "recipe/recipe.h"
#include "registry/registry.h"

namespace ciuic::plan {

namespace {
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kMiB = 1024.0 * 1024.0;
}  // namespace

std::string bytes_text(double b) {
  char buf[32];
  if (b >= kGiB || b == 0)
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / kGiB);
  else
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / kMiB);
  return buf;
}

double physical_memory() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0.0;
}

namespace {

// The slots that answer, in the order of ciuic/plan.h.
constexpr Slot kOrder[] = {Slot::kPrecision, Slot::kSharding, Slot::kOptimizer, Slot::kComm,
                           Slot::kData};

// A plugin as the planner uses it: its info and options (the recipe's, or its defaults when it
// stands in as an alternative).
struct Choice {
  std::string name;
  const PluginInfo* info = nullptr;
  std::optional<Config> options;
};

struct Inputs {
  PlanContext base;  // the planner's inputs, no answers yet
  model::LlamaConfig model;
  bool checkpointing = false;
  int64_t checkpoint_layers = 0;  // 0 = all
  bool fused = false;  // the fused CUDA kernels run (the gated MLP keeps gate and up only)
  bool loss_in_forward = false;   // [model] loss_backward = "in_forward"
  std::string auto_note;          // how checkpoint_layers = "auto" was resolved (activations' note)
  int64_t frozen_parameters = 0;  // [adapter]: the frozen base (no gradient, no optimizer state)
  bool head_frozen = false;       // [adapter] without lm_head (or a tied, saved embed_tokens)
  // [adapter] base_quantization = "nf4": the decoder's linear weights among frozen_parameters,
  // their bytes as NF4 (quant/nf4_size.h, per tensor) and the largest one's elements (dequantized
  // for one multiply at a time).
  int64_t nf4_parameters = 0, nf4_bytes = 0, nf4_largest = 0;
  std::vector<int> lora_targets;  // [adapter] the adapted linear slots (LayerWeights::kQ ...)
  double lora_dropout = 0;        // [adapter] dropout
};

// Runs every slot's answer, then the model terms; `unknown` collects what was not counted.
PlanContext run(const Inputs& in, const Choice (&choices)[kNumSlots],
                std::vector<std::string>* unknown) {
  PlanContext ctx = in.base;
  for (Slot slot : kOrder) {
    const Choice& c = choices[static_cast<int>(slot)];
    const std::string who = std::string(slot_name(slot)) + " " + c.name;
    if (!c.info) {
      if (unknown && !c.name.empty()) unknown->push_back(who + " (not built or not found here)");
      continue;
    }
    if (!c.info->plan) {
      if (unknown) unknown->push_back(who + " (the plugin gives no memory plan)");
      continue;
    }
    const size_t before = ctx.items.size();
    c.info->plan(*c.options, ctx);
    for (size_t i = before; i < ctx.items.size(); ++i) ctx.items[i].by = who;
  }

  // Model terms. Activations kept for backward, per decoder layer (compute dtype): the residual
  // input, the normed input, q, k, v, the attention output, the second residual and normed input
  // (5 x hidden + q + 2 x kv), and of the MLP gate, up, act(gate) and their product
  // (4 x intermediate; 2 with the fused SwiGLU/GeGLU kernel, which keeps gate and up only).
  // Family terms: q/k norms keep the unnormed q and k (q + kv); sandwich norms the attention and
  // MLP outputs before their norms (2 x hidden); (1 + w) norms in a 16-bit dtype their fp32 inputs
  // (4 x hidden, + q + kv with q/k norms, at 4 bytes) unless fused (the kernels keep the inputs
  // counted above).
  const model::LlamaConfig& m = in.model;
  const double pb = ctx.param_bytes;
  const double N = static_cast<double>(ctx.micro_batch_size * ctx.seq_len);
  const double H = static_cast<double>(m.hidden_size);
  const double kv = static_cast<double>(m.num_key_value_heads * m.head_dim);
  const double q = static_cast<double>(m.num_attention_heads * m.head_dim);
  const double I = static_cast<double>(m.intermediate_size);
  const double V = static_cast<double>(m.vocab_size);
  const double L = static_cast<double>(m.num_hidden_layers);
  double per_token = 5 * H + q + 2 * kv + (in.fused ? 2 : 4) * I;
  if (m.qk_norm) per_token += q + kv;
  if (m.sandwich_norms) per_token += 2 * H;
  double layer = per_token * N * pb;
  // LoRA (llama_ops.cpp lin()): an adapter's A product keeps its input. Without dropout that input
  // is one of the tensors counted above, except for down_proj's with the fused kernels: the MLP
  // then runs fused_glu (gate and up kept) and down's adapter keeps the gated product too (I).
  // With dropout each adapter keeps its own dropped input and the mask (1 byte an element):
  // in-features x (pb + 1) per adapted slot (q_proj ... up_proj read hidden or q width, down_proj
  // the intermediate width; down's replaces the product above).
  using W = model::LayerWeights;
  for (int slot : in.lora_targets) {
    const double in_features = slot == W::kO ? q : slot == W::kDown ? I : H;
    if (in.lora_dropout > 0)
      layer += in_features * N * (pb + 1);
    else if (slot == W::kDown && in.fused)
      layer += I * N * pb;
  }
  if (m.gemma_norm && pb < 4 && !in.fused) layer += (4 * H + (m.qk_norm ? q + kv : 0)) * N * 4;
  const size_t first_model_item = ctx.items.size();
  if (in.frozen_parameters > 0 && in.nf4_parameters > 0) {
    const int64_t dense = in.frozen_parameters - in.nf4_parameters;
    ctx.add("frozen base weights", true,
            static_cast<double>(dense) * pb + static_cast<double>(in.nf4_bytes),
            "[adapter] QLoRA: " + std::to_string(in.nf4_parameters) +
                " linear weights in NF4 (4.13 bits each with double-quantized scales), " +
                std::to_string(dense) +
                " others (embedding, norms, lm_head) in the training dtype; no gradient or "
                "optimizer state");
    ctx.add(
        "NF4 dequantized weight", true, static_cast<double>(in.nf4_largest) * pb,
        "the largest linear weight dequantized for its multiply (one at a time, dropped after)");
  } else if (in.frozen_parameters > 0) {
    ctx.add("frozen base weights", true, static_cast<double>(in.frozen_parameters) * pb,
            "[adapter] LoRA: " + std::to_string(in.frozen_parameters) +
                " base parameters in the training dtype, no gradient or optimizer state");
  }
  if (in.checkpointing) {
    const double c =
        in.checkpoint_layers > 0 ? std::min(L, static_cast<double>(in.checkpoint_layers)) : L;
    ctx.add("activations", true, c * N * H * pb + (L - c) * layer + layer,
            (c == L ? std::string("checkpointing: each layer's input, plus one layer recomputed")
                    : "checkpointing " + std::to_string(static_cast<int64_t>(c)) + " of " +
                          std::to_string(m.num_hidden_layers) + " layers; the others keep " +
                          bytes_text(layer)) +
                in.auto_note);
  } else {
    ctx.add("activations", true, L * layer + 3 * N * H * pb,
            std::to_string(m.num_hidden_layers) + " layers x " + bytes_text(layer) + in.auto_note);
  }
  const double chunk = static_cast<double>(model::LlamaModel::kDefaultLossChunkElements);
  if (in.loss_in_forward) {
    // Token chunks of at least 2048 rows (LlamaModel::loss_chunk_elements): fp32 logits + their
    // gradient in the compute dtype; d lm_head (+ its fp32 accumulator when there are several
    // chunks) and d hidden.
    const double logits = std::min(N * V, std::max(chunk, std::min(N, 2048.0) * V));
    ctx.add("loss chunk", true, logits * (4 + pb),
            "fp32 logits and their gradient, token chunk by token chunk");
    if (in.head_frozen)  // a frozen head has no gradient (autograd_fns.cpp: need_w is false)
      ctx.add("loss gradient", true, N * H * pb,
              "[model] loss_backward = \"in_forward\": d hidden, held from forward to backward "
              "(the LoRA base's lm_head is frozen: no d lm_head)");
    else
      ctx.add("loss gradient", true, (V * H + N * H) * pb + (logits < N * V ? V * H * 4 : 0),
              "[model] loss_backward = \"in_forward\": d lm_head and d hidden, held from forward "
              "to backward");
  } else {
    ctx.add("loss chunk", true, std::min(N * V, chunk) * 8,
            "fp32 logits and their gradient, chunk by chunk");
  }
  for (size_t i = first_model_item; i < ctx.items.size(); ++i) ctx.items[i].by = "model";
  return ctx;
}

double device_total(const PlanContext& ctx) {
  double t = 0;
  for (const auto& it : ctx.items)
    if (it.device) t += it.bytes;
  return t;
}

}  // namespace

namespace {

// The planner's inputs and the recipe's plugins, read once.
struct Prepared {
  MemoryPlan plan;  // world, device, cap filled in
  Inputs in;
  Choice choices[kNumSlots];
  bool checkpoint_auto = false;
  bool micro_auto = false;  // the batch is micro 1 x accumulation = rows per rank until chosen
  std::vector<PlannedOption> planned;  // kOptionPlanned options chosen, in choices[]' options
};

// A kOptionPlanned option that the recipe leaves "auto", while it is being chosen.
struct OpenOption {
  Slot slot;
  std::string key;
  std::vector<std::string> choices;  // kString: the choices after "auto"
  bool integer = false;              // kInt: the range instead
  int64_t lo = 0, hi = 0;
};

// `options` with `key` at `value` (an integer's decimal text when `integer`).
Config with_choice(const Config& options, const std::string& key, const std::string& value,
                   bool integer) {
  return integer ? with_int(options, key, std::stoll(value)) : with_string(options, key, value);
}
Config set_planned(const Config& options, const OpenOption& o, const std::string& value) {
  return with_choice(options, o.key, value, o.integer);
}

// `options` of plugin `info` with each kOptionPlanned option that is "auto" at its fallback (a
// string's last choice, an integer's minimum); those options are appended to `open` when given.
Config at_last_choices(Config options, const PluginInfo& info, Slot slot,
                       std::vector<OpenOption>* open) {
  for (uint32_t i = 0; i < info.num_options; ++i) {
    const OptionSpec& spec = info.options[i];
    if (!(spec.flags & kOptionPlanned) || !is_auto(options, spec.key)) continue;
    OpenOption o{slot, spec.key, {}, spec.type == OptionType::kInt};
    if (o.integer) {  // the registry checked the finite range
      o.lo = static_cast<int64_t>(std::ceil(spec.min));
      o.hi = static_cast<int64_t>(std::floor(spec.max));
      o.choices = {std::to_string(o.lo)};
    } else {
      o.choices = text::split(spec.choices, '|');
      o.choices.erase(o.choices.begin());  // "auto" (the registry checked the form)
    }
    options = set_planned(options, o, o.choices.back());
    if (open) open->push_back(std::move(o));
  }
  return options;
}

// The kOptionPlanned options that the recipe leaves "auto" (ciuic/plugin.h): each first takes its
// fallback, so that no plan function sees "auto"; then, slot by slot in the planner's order and
// key by key, the first choice (a string) or the largest value (an integer) whose plan fits
// `budget` (the model's terms as prepare() left them: the leanest for its own "auto" settings).
void choose_planned(Prepared& p, double budget) {
  std::vector<OpenOption> open;
  for (Slot slot : kOrder) {
    Choice& c = p.choices[static_cast<int>(slot)];
    if (c.info && c.options) c.options = at_last_choices(*c.options, *c.info, slot, &open);
  }
  for (const OpenOption& o : open) {
    Choice& c = p.choices[static_cast<int>(o.slot)];
    const Config fallback = *c.options;
    auto fits = [&](const std::string& v) {
      c.options = set_planned(fallback, o, v);
      return device_total(run(p.in, p.choices, nullptr)) <= budget;
    };
    const std::string all =
        o.integer ? std::to_string(o.lo) + ".." + std::to_string(o.hi) : text::join(o.choices, "|");
    PlannedOption chosen{o.slot, c.name, o.key, o.choices.back(), "", o.integer};
    if (budget <= 0) {
      chosen.why = (o.integer ? "the least of " : "the last of ") + all +
                   " (chosen at start from the device's memory)";
    } else if (o.integer) {
      // The largest value in [lo, hi] that fits, by bisection (plans grow with the value).
      if (!fits(std::to_string(o.lo))) {
        chosen.why = "the least of " + all + ": none has a memory plan that fits";
      } else {
        int64_t good = o.lo, bad = o.hi + 1;
        if (fits(std::to_string(o.hi)))
          good = o.hi;
        else
          bad = o.hi;
        while (bad - good > 1) {
          const int64_t mid = good + (bad - good) / 2;
          (fits(std::to_string(mid)) ? good : bad) = mid;
        }
        chosen.value = std::to_string(good);
        chosen.why = "the largest of " + all + " whose memory plan fits";
      }
    } else {
      const auto first = std::find_if(o.choices.begin(), o.choices.end(), fits);
      chosen.value = first == o.choices.end() ? o.choices.back() : *first;
      chosen.why = first == o.choices.end()
                       ? "the last of " + all + ": none has a memory plan that fits"
                       : "the first of " + all + " whose memory plan fits";
    }
    c.options = set_planned(fallback, o, chosen.value);
    p.planned.push_back(std::move(chosen));
  }
}

Prepared prepare(const Recipe& recipe, const Registry& registry, double budget) {
  Prepared p;
  MemoryPlan& plan = p.plan;
  Inputs& in = p.in;
  const Config cluster = recipe.section("cluster");
  const Config train = recipe.section("train");
  plan.local_world_size = static_cast<int>(cluster.get_int("nproc_per_node"));
  plan.world_size = static_cast<int>(plan.local_world_size * cluster.get_int("nnodes"));
  plan.device = cluster.get_string("device");
  plan.cap = cluster.get_float("memory_per_device_gib") * kGiB;

  in.model = recipe_model_config(recipe);
  const Config model_section = recipe.section("model");
  in.checkpointing = model_section.get_bool("activation_checkpointing");
  p.checkpoint_auto = is_auto(model_section, "checkpoint_layers");
  in.checkpoint_layers = p.checkpoint_auto ? 0 : model_section.get_int("checkpoint_layers");
  in.loss_in_forward = model_section.get_string("loss_backward") == "in_forward";
  // A CUDA run uses the fused kernels unless they are turned off (a CUDA build has them).
  in.fused =
      cluster.get_string("device") == "cuda" && model_section.get_string("fused_kernels") != "off";
  PlanContext& b = in.base;
  b.world_size = plan.world_size;
  b.local_world_size = plan.local_world_size;
  b.cuda = plan.device == "cuda";
  b.num_parameters = in.model.num_parameters();
  {
    const model::LlamaConfig& m = in.model;
    const int64_t H = m.hidden_size;
    b.largest_parameter = std::max(
        {m.vocab_size * H, m.intermediate_size * H, m.num_attention_heads * m.head_dim * H});
  }
  // LoRA: the plugins plan for what they are handed, the adapter; the base is a model term.
  if (const auto lora = recipe_adapter(recipe)) {
    const int64_t trainable = model::lora_num_parameters(in.model, *lora);
    in.frozen_parameters = b.num_parameters - trainable;
    in.head_frozen = !(lora->save_lm_head || (in.model.tie_word_embeddings && lora->save_embed));
    in.lora_targets = lora->targets;
    in.lora_dropout = lora->dropout;
    b.num_parameters = trainable;
    const model::LlamaConfig& m = in.model;
    if (lora->base_quantization == "nf4") {
      const int64_t h = m.hidden_size, q = m.num_attention_heads * m.head_dim,
                    kv = m.num_key_value_heads * m.head_dim, mi = m.intermediate_size;
      for (const int64_t n : {q * h, kv * h, kv * h, h * q, mi * h, mi * h, h * mi}) {
        in.nf4_parameters += n * m.num_hidden_layers;
        in.nf4_bytes += quant::nf4_bytes(n) * m.num_hidden_layers;
        in.nf4_largest = std::max(in.nf4_largest, n);
      }
    }
    b.largest_parameter =
        lora->save_embed || lora->save_lm_head
            ? m.vocab_size * m.hidden_size
            : lora->r * std::max(m.intermediate_size, m.num_attention_heads * m.head_dim);
  }
  const RecipeBatch batch = recipe_batch(recipe);
  p.micro_auto = batch.micro_auto;
  b.micro_batch_size = batch.micro;
  b.seq_len = train.get_int("seq_len");
  b.gradient_accumulation_steps = batch.accumulation;

  // The recipe's plugins. Those the plan depends on must exist (an error at the recipe's line);
  // comm and data may be missing from this build.
  Choice(&choices)[kNumSlots] = p.choices;
  for (Slot slot : kOrder) {
    Choice& c = choices[static_cast<int>(slot)];
    c.name = recipe.plugin_name(slot);
    c.info = c.name.empty() ? nullptr : registry.find_info(slot, c.name);
    if (!c.info &&
        (slot == Slot::kPrecision || slot == Slot::kSharding || slot == Slot::kOptimizer)) {
      const std::string where = recipe.plugin_location(slot);
      throw UsageError((where == "<default>"
                            ? recipe.path() + ": [" + slot_name(slot) + "] default plugin"
                            : where) +
                       ": " + registry.why_missing(slot, c.name));
    }
    if (c.info) c.options = recipe.plugin_config(slot, *c.info);
  }
  choose_planned(p, budget);
  return p;
}

// The largest micro-batch that divides the rows per rank and whose plan fits `budget` bytes (with
// checkpoint_layers = "auto" counted as every layer checkpointed); 0 when not even 1 fits.
int64_t largest_micro(const Prepared& p, double budget) {
  const int64_t rows = p.in.base.micro_batch_size * p.in.base.gradient_accumulation_steps;
  for (int64_t m = rows; m >= 1; --m) {
    if (rows % m != 0) continue;
    Inputs in = p.in;
    in.base.micro_batch_size = m;
    in.base.gradient_accumulation_steps = rows / m;
    if (device_total(run(in, p.choices, nullptr)) <= budget) return m;
  }
  return 0;
}

void set_micro(Prepared& p, int64_t m) {
  const int64_t rows = p.in.base.micro_batch_size * p.in.base.gradient_accumulation_steps;
  p.in.base.micro_batch_size = m;
  p.in.base.gradient_accumulation_steps = rows / m;
}

// The fewest layers to checkpoint whose plan fits `budget` bytes: 0 (no checkpointing needed) up to
// the layer count (every layer); -1 when even that does not fit.
int64_t fewest_layers(const Prepared& p, double budget) {
  const int64_t L = p.in.model.num_hidden_layers;
  for (int64_t c = 0; c <= L; ++c) {
    Inputs in = p.in;
    in.checkpointing = c > 0;
    in.checkpoint_layers = c == L ? 0 : c;
    if (device_total(run(in, p.choices, nullptr)) <= budget) return c;
  }
  return -1;
}

}  // namespace

int64_t fewest_checkpointed_layers(const Recipe& recipe, const Registry& registry,
                                   double budget_bytes, int64_t micro_batch) {
  Prepared p = prepare(recipe, registry, budget_bytes);
  if (micro_batch > 0) set_micro(p, micro_batch);
  return fewest_layers(p, budget_bytes);
}

int64_t largest_micro_batch(const Recipe& recipe, const Registry& registry, double budget_bytes) {
  return largest_micro(prepare(recipe, registry, budget_bytes), budget_bytes);
}

std::vector<PlannedOption> planned_options(const Recipe& recipe, const Registry& registry,
                                           double budget_bytes) {
  return prepare(recipe, registry, budget_bytes).planned;
}

std::string planned_text(const PlannedOption& o) {
  std::string t = "[";
  t += slot_name(o.slot);
  t += "] ";
  t += o.key;
  t += " = \"auto\": ";
  t += o.integer ? o.value : '"' + o.value + '"';
  t += ", ";
  t += o.why;
  return t;
}

bool has_planned_auto(const Config& options, const PluginInfo& info) {
  for (uint32_t i = 0; i < info.num_options; ++i)
    if ((info.options[i].flags & kOptionPlanned) && is_auto(options, info.options[i].key))
      return true;
  return false;
}

Config with_planned(const Config& options, Slot slot, const std::vector<PlannedOption>& chosen) {
  Config out = options;
  for (const PlannedOption& o : chosen)
    if (o.slot == slot && is_auto(out, o.key)) out = with_choice(out, o.key, o.value, o.integer);
  return out;
}

double auto_budget_bytes(double whole_bytes, bool dedicated) {
  if (whole_bytes <= 0) return 0;
  if (!dedicated) return kAutoMemoryFraction * whole_bytes;
  const double headroom =
      std::min((1 - kAutoMemoryFraction) * whole_bytes,
               std::max(kAutoHeadroomBytes, kAutoHeadroomLargeFraction * whole_bytes));
  return whole_bytes - headroom;
}

std::string auto_budget_share(double whole_bytes, bool dedicated) {
  const double share =
      whole_bytes > 0 ? auto_budget_bytes(whole_bytes, dedicated) / whole_bytes : 0;
  return std::to_string(static_cast<int>(std::floor(share * 100 + 1e-9))) + "% of ";
}

MemoryPlan plan_memory(const Recipe& recipe, const Registry& registry) {
  // kOptionPlanned options against the cap, as the worker chooses them at start; without one, the
  // fallback is shown, and the worker chooses from the device's memory.
  Prepared p = prepare(
      recipe, registry,
      auto_budget_bytes(recipe.section("cluster").get_float("memory_per_device_gib") * kGiB));
  MemoryPlan plan = p.plan;
  plan.planned = p.planned;
  Inputs& in = p.in;
  Choice(&choices)[kNumSlots] = p.choices;
  PlanContext& b = in.base;
  // micro_batch_size = "auto": as the worker does, against the cap when there is one; without, the
  // plan shows micro-batches of 1.
  if (p.micro_auto) {
    const int64_t rows = b.micro_batch_size * b.gradient_accumulation_steps;
    std::string note;
    if (plan.cap > 0) {
      const int64_t m = largest_micro(p, auto_budget_bytes(plan.cap));
      set_micro(p, std::max<int64_t>(m, 1));
      note = m > 0 ? "; micro_batch_size = \"auto\": " + std::to_string(m) + " x " +
                         std::to_string(rows / m) + " accumulation, the largest within " +
                         auto_budget_share(plan.cap) + "the cap"
                   : "; micro_batch_size = \"auto\": not even 1 fits the cap";
    } else {
      note =
          "; micro_batch_size = \"auto\": chosen at start from the device's memory (shown: 1 x " +
          std::to_string(rows) + ")";
    }
    in.auto_note += note;
  }
  // checkpoint_layers = "auto" (with activation checkpointing): resolved against the cap when the
  // recipe sets one, as the worker does at start; otherwise the worker decides from the device's
  // memory, and the plan shows every layer checkpointed.
  if (p.checkpoint_auto && in.checkpointing) {
    const int64_t L = in.model.num_hidden_layers;
    if (plan.cap > 0) {
      const int64_t c = fewest_layers(p, auto_budget_bytes(plan.cap));
      if (c >= 0) {
        in.checkpointing = c > 0;
        in.checkpoint_layers = c == L ? 0 : c;
      }
      in.auto_note +=
          c < 0 ? "; checkpoint_layers = \"auto\": nothing fits the cap, every layer checkpointed"
                : "; checkpoint_layers = \"auto\": " + std::to_string(c) + " of " +
                      std::to_string(L) + " layers, the fewest within " +
                      auto_budget_share(plan.cap) + "the cap";
    } else {
      in.auto_note +=
          "; checkpoint_layers = \"auto\": chosen at start from the device's memory (no cap here)";
    }
  }

  const PlanContext ctx = run(in, choices, &plan.unknown);
  plan.items = ctx.items;
  for (const auto& it : plan.items) (it.device ? plan.device_peak : plan.host_per_rank) += it.bytes;
  plan.start_peak = ctx.start_bytes > 0 ? ctx.start_bytes
                                        : static_cast<double>(b.num_parameters) * ctx.param_bytes;
  plan.start_note = ctx.start_bytes > 0
                        ? "[sharding " + choices[static_cast<int>(Slot::kSharding)].name + "]"
                        : "the whole model, built on each rank before the sharding sees it";
  plan.host_per_node = plan.host_per_rank * plan.local_world_size;
  plan.host_available = physical_memory();
  plan.node_memory =
      plan.host_per_node + (plan.device == "cpu" ? plan.device_peak * plan.local_world_size : 0.0);
  plan.host_fits = plan.host_available <= 0 || plan.node_memory <= plan.host_available;
  plan.fits = plan.cap <= 0 || plan.device_peak <= plan.cap;
  if (plan.cap > 0) {
    // Options the planner could choose (kOptionPlanned) that the recipe sets: does one the plugin
    // lists earlier fit too?
    for (Slot slot : kOrder) {
      const Choice& c = choices[static_cast<int>(slot)];
      if (!c.info || !c.options) continue;
      for (uint32_t i = 0; i < c.info->num_options; ++i) {
        const OptionSpec& o = c.info->options[i];
        if (!(o.flags & kOptionPlanned) || o.type != OptionType::kString) continue;
        if (std::any_of(p.planned.begin(), p.planned.end(),
                        [&](const PlannedOption& q) { return q.slot == slot && q.key == o.key; }))
          continue;  // "auto": chosen above
        const std::string value = c.options->get_string(o.key);
        for (const std::string& v : text::split(o.choices, '|')) {
          if (v == "auto") continue;
          if (v == value) break;
          Choice alt[kNumSlots];
          std::copy(std::begin(choices), std::end(choices), std::begin(alt));
          alt[static_cast<int>(slot)].options = with_string(*c.options, o.key, v);
          const double total = device_total(run(in, alt, nullptr));
          if (total <= auto_budget_bytes(plan.cap)) {
            plan.preferred.push_back(
                "[" + std::string(slot_name(slot)) + "] " + o.key + " = \"" + v +
                "\": " + bytes_text(total) + " per device, within " + auto_budget_share(plan.cap) +
                "the cap (the plugin lists it before \"" + value + "\"; \"auto\" chooses it)");
            break;
          }
        }
      }
    }
  }
  if (plan.fits) return plan;

  // What would help: the other installed sharding and optimizer plugins in place of the
  // recipe's, then the model terms.
  for (Slot slot : {Slot::kOptimizer, Slot::kSharding}) {
    for (const PluginDescriptor& d : registry.list(slot)) {  // loads that slot's plugins only
      if (d.name == choices[static_cast<int>(slot)].name || !d.info->plan) continue;
      Choice alt[kNumSlots];
      std::copy(std::begin(choices), std::end(choices), std::begin(alt));
      Choice& c = alt[static_cast<int>(slot)];
      c.name = d.name;
      c.info = d.info;
      try {
        c.options = at_last_choices(Recipe::plugin_defaults(slot, *d.info), *d.info, slot, nullptr);
      } catch (const Error&) {
        continue;  // a plugin with required options cannot stand in unasked
      }
      const double total = device_total(run(in, alt, nullptr));
      if (total < plan.device_peak)
        plan.advice.push_back("[" + std::string(slot_name(slot)) + "] plugin = \"" + d.name +
                              "\": " + bytes_text(total) + " per device (-" +
                              bytes_text(plan.device_peak - total) + ")" +
                              (total <= plan.cap ? ", fits" : ", still above the cap"));
    }
  }
  if (!in.checkpointing || in.checkpoint_layers > 0) {
    Inputs ck = in;
    ck.checkpointing = true;
    ck.checkpoint_layers = 0;
    const double saved = plan.device_peak - device_total(run(ck, choices, nullptr));
    plan.advice.push_back(std::string("[model] activation_checkpointing = true") +
                          (in.checkpoint_layers > 0 ? " with checkpoint_layers = 0" : "") +
                          " keeps each layer's input and one layer's activations: -" +
                          bytes_text(saved));
  }
  if (b.micro_batch_size > 1)
    plan.advice.push_back(
        "a smaller [train] micro_batch_size (with more gradient_accumulation_steps): "
        "activations scale with it");
  for (const auto& it : plan.items)
    if (it.what == "parameters" && it.bytes > plan.cap)
      plan.advice.push_back("the parameters alone (" + bytes_text(it.bytes) + ", " + it.by +
                            ") exceed the cap");
  return plan;
}

std::string plan_text(const MemoryPlan& plan) {
  std::ostringstream os;
  os << "memory plan per rank (" << plan.world_size << " rank(s), " << plan.local_world_size
     << " per node, " << plan.device << "); peak at the start of backward:\n";
  for (bool device : {true, false}) {
    for (const auto& it : plan.items)
      if (it.device == device) {
        char line[200];
        std::snprintf(line, sizeof line, "  %-6s %-34s %12s  ",
                      device ? plan.device.c_str() : "host", it.what.c_str(),
                      bytes_text(it.bytes).c_str());
        os << line << it.note << "  [" << it.by << "]\n";
      }
  }
  os << "  total " << plan.device << ": " << bytes_text(plan.device_peak);
  if (plan.cap > 0)
    os << " of the " << bytes_text(plan.cap)
       << " cap ([cluster] memory_per_device_gib): " << (plan.fits ? "fits" : "does NOT fit");
  os << "\n  start: " << bytes_text(plan.start_peak) << " per " << plan.device
     << " at most while the model is built, before the first step (" << plan.start_note << ")";
  os << "\n  total host: " << bytes_text(plan.host_per_rank) << " per rank, "
     << bytes_text(plan.host_per_node) << " per node (" << plan.local_world_size << " rank(s))";
  if (plan.node_memory > plan.host_per_node)
    os << ", " << bytes_text(plan.node_memory) << " with the ranks' " << plan.device << " totals";
  if (plan.host_available > 0) {
    os << "; this machine has " << bytes_text(plan.host_available);
    if (!plan.host_fits) os << ": NOT enough host memory";
  }
  os << "\n";
  for (const auto& o : plan.planned) {
    os << "  chosen: " << planned_text(o);
    if (plan.cap > 0) os << " within " << auto_budget_share(plan.cap) << "the cap";
    os << "\n";
  }
  for (const auto& u : plan.unknown) os << "  not counted: " << u << "\n";
  if (!plan.preferred.empty()) {
    os << "also fits:\n";
    for (const auto& a : plan.preferred) os << "  - " << a << "\n";
  }
  if (!plan.advice.empty()) {
    os << "what would help:\n";
    for (const auto& a : plan.advice) os << "  - " << a << "\n";
  }
  os << "(estimates: model states follow the plugins' own accounting; activations within ~10% of "
        "measured peaks)\n";
  return os.str();
}

}  // namespace ciuic::plan
