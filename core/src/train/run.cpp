// build_run() and the small helpers the loop uses (train/run.h).
#include "train/run.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <thread>
#include <vector>

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/ops/tensor.h>
#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <ciuic/config.h>
#include <ciuic/error.h>
#include <ciuic/log.h>

#include "model/config.h"
#include "model/fused_ops.h"
#include "model/llama.h"
#include "model/safetensors.h"
#include "plan/plan.h"
#include "quant/nf4.h"
#include "recipe/recipe.h"
#include "registry/registry.h"
#include "schedule/schedule.h"
#include "tokenizer/factory.h"
#include "train/checkpoints.h"
#include "train/comm_traffic.h"
#include "train/device_info.h"
#include "train/elastic.h"
#include "train/worker.h"

namespace fs = std::filesystem;

namespace ciuic::train {
namespace {

// Recipe sections -> RunContext for this worker.
RunContext make_context(const Recipe& recipe, const TrainOptions& opt,
                        const launch::WorkerEnv& env) {
  RunContext ctx;
  launch::apply_worker_env(env, ctx);
  ctx.timeout = std::chrono::milliseconds(static_cast<int64_t>(opt.timeout_s * 1000.0));
  ctx.run_name = opt.run_name;
  ctx.output_dir = opt.output_dir;
  ctx.recipe_dir = recipe.dir();
  ctx.seed = opt.seed;
  // CPU threads: OMP_NUM_THREADS when set (ciuic-run's launcher sets usable cores / ranks per node
  // unless the user did), else that share computed here (torchrun, srun, mpirun workers).
  const int share = std::max(1, launch::usable_cores() / std::max(1, env.local_world_size));
  const char* omp = std::getenv("OMP_NUM_THREADS");
  const std::optional<int> asked = launch::parse_omp_num_threads(omp);
  ctx.cpu_threads = asked.value_or(share);
  if (omp && !asked && env.rank == 0)
    log_warn("OMP_NUM_THREADS=\"" + std::string(omp) +
             "\" is not a thread count (expected an integer >= 1, e.g. 8); "
             "using " +
             std::to_string(share) + " threads per worker (usable cores / ranks on this node)");
  if (opt.cuda) {
    ctx.device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank));
    set_current_device(ctx.device);
    launch::apply_memory_cap(env.local_rank, opt.memory_cap_gib);
  }
  at::set_num_threads(ctx.cpu_threads);
  ctx.store = launch::connect_store(env, ctx.timeout);
  return ctx;
}

// The slot's plugin with its recipe section, "auto" planned options replaced by what the planner
// chose (`planned`).
template <class T>
std::shared_ptr<T> make_plugin(const Recipe& recipe, const Registry& registry, Slot slot,
                               const RunContext& ctx,
                               const std::vector<plan::PlannedOption>& planned) {
  const std::string name = recipe.plugin_name(slot);
  const PluginDescriptor& d = registry.get(slot, name);
  return registry.create<T>(
      slot, name, plan::with_planned(recipe.plugin_config(slot, *d.info), slot, planned), ctx);
}

// Runs a call into a plugin so that whatever it throws names the plugin and its file, as the
// factory's errors do (Registry::create_object); the exit code is kept.
template <typename F>
void as_plugin(const Recipe& recipe, const Registry& registry, Slot slot, F&& call) {
  try {
    call();
  } catch (const Error& e) {
    throw e.with_context(registry.describe(slot, recipe.plugin_name(slot)));
  } catch (const c10::Error& e) {
    throw Error(registry.describe(slot, recipe.plugin_name(slot)) + ": " +
                e.what_without_backtrace());
  } catch (const std::exception& e) {
    throw Error(registry.describe(slot, recipe.plugin_name(slot)) + ": " + e.what());
  }
}

// The model's BOS/EOS ids and the tokenizer's must agree, or the exported model never stops
// generating (transformers' generate() stops at config.json's eos_token_id). An id nobody chose
// (no model folder, not set in [model.config]: LlamaConfig's default) becomes the tokenizer's; an
// id the model folder or the recipe chose is kept, and a disagreement is a warning naming both.
model::LlamaConfig with_tokenizer_special_ids(const model::LlamaConfig& cfg, const Tokenizer& tok,
                                              const std::string& tok_path, const Recipe& recipe,
                                              bool from_model_folder, bool say) {
  const Config mc = recipe.section("model.config");
  nlohmann::json take = nlohmann::json::object();
  auto reconcile = [&](const char* key, std::optional<int32_t> tok_id, bool agrees,
                       const std::string& model_id) {
    if (!tok_id || agrees) return;
    if (!from_model_folder && !mc.has(key)) {
      take[key] = *tok_id;
      return;
    }
    if (say)
      log_warn(std::string("the model's ") + key + " is " + model_id + " (" +
               (mc.has(key) ? mc.location(key) : std::string("the model folder's config.json")) +
               ") but the tokenizer's (" + tok_path + ") is " + std::to_string(*tok_id) + " (" +
               tok.decode({*tok_id}) + "): the exported model keeps the model's");
  };
  const std::optional<int32_t> bos = tok.bos_id(), eos = tok.eos_id();
  reconcile("bos_token_id", bos, bos && cfg.bos_token_id == static_cast<int64_t>(*bos),
            cfg.bos_token_id ? std::to_string(*cfg.bos_token_id) : "null");
  std::string eos_ids;
  for (int64_t e : cfg.eos_token_ids) eos_ids += (eos_ids.empty() ? "" : ", ") + std::to_string(e);
  reconcile("eos_token_id", eos,
            eos && std::find(cfg.eos_token_ids.begin(), cfg.eos_token_ids.end(),
                             static_cast<int64_t>(*eos)) != cfg.eos_token_ids.end(),
            cfg.eos_token_ids.size() == 1 ? eos_ids : "[" + eos_ids + "]");
  if (take.empty()) return cfg;
  if (say) log_info("special token ids from the tokenizer " + tok_path + ": " + take.dump());
  return cfg.with_overrides(take, "the tokenizer's special tokens");
}

}  // namespace

void check_sharded_parameters(const Recipe& recipe, const Registry& registry,
                              const Sharding& sharding, const Optimizer& optimizer,
                              const Precision& precision) {
  bool shards = false;
  as_plugin(recipe, registry, Slot::kSharding, [&] { shards = sharding.shards_parameters(); });
  if (!shards) return;
  auto key = [&](Slot slot) {
    return "[" + std::string(slot_name(slot)) + "] plugin = \"" + recipe.plugin_name(slot) +
           "\" (" + recipe.plugin_location(slot) + ")";
  };
  std::string problems;
  auto ask = [&](Slot slot, const std::string& iface, const std::string& what, auto&& accepts) {
    bool yes = false;
    as_plugin(recipe, registry, slot, [&] { yes = accepts(); });
    if (yes) return;
    problems += "\n  " + key(slot) + ": " + registry.describe(slot, recipe.plugin_name(slot)) +
                " does not accept sharded parameters (" + iface +
                "::accepts_sharded_parameters() is false, the default of plugins written before "
                "plugin API 9), which " +
                key(Slot::kSharding) + " hands it; expected " + what + " that accepts them";
  };
  ask(Slot::kOptimizer, "Optimizer", "an optimizer",
      [&] { return optimizer.accepts_sharded_parameters(); });
  ask(Slot::kPrecision, "Precision", "a precision policy",
      [&] { return precision.accepts_sharded_parameters(); });
  if (problems.empty()) return;
  throw UsageError(
      "the plugins do not compose:" + problems +
      "\n  (every optimizer and precision policy shipped with ciuic does; docs/plugins.md, "
      "\"Sharded parameters\"), or a [sharding] plugin that keeps the parameters whole. The author "
      "of a plugin that keeps the promises of ciuic/optimizer.h or ciuic/precision.h returns true "
      "from accepts_sharded_parameters() and builds it for plugin API 9");
}

void open_data_plugin(const Recipe& recipe, const Registry& registry, DataSource& data,
                      const DataOpenArgs& args) {
  try {
    as_plugin(recipe, registry, Slot::kData, [&] { data.open(args); });
  } catch (const Error& e) {
    // A missing input of a recipe that says how its inputs are made ([run] setup): say it too.
    const std::string setup = TrainOptions::from(recipe).setup;
    const std::string m = e.what();
    if (setup.empty() || (m.find("no such file") == std::string::npos &&
                          m.find("No such file") == std::string::npos &&
                          m.find("matches no file") == std::string::npos))
      throw;
    throw Error(m + "\nhint: this recipe's inputs are made by: " + setup + " ([run] setup)",
                e.exit_code());
  }
}

// What "auto" settings may fill: plan::auto_budget_bytes of the cap ([cluster]
// memory_per_device_gib), else of the device's memory (a CPU worker: its share of the machine's).
// `within` describes it for the log line. Every rank computes the same from the same recipe and
// device kind.
double auto_budget(const Run& r, std::string& within) {
  const auto gib = plan::bytes_text;
  double whole = 0;
  bool dedicated = true;  // device memory (or a cap), not a share of the host's
  std::string of;
  if (r.opt.memory_cap_gib > 0) {
    whole = r.opt.memory_cap_gib * 1073741824.0;
    of = "the " + gib(whole) + " cap";
  } else if (r.ctx.device.is_cuda()) {
    whole = static_cast<double>(device_info(r.ctx.device, 0.0).total_bytes);
    of = "the device's " + gib(whole);
  } else {
    whole = plan::physical_memory() / std::max(1, r.ctx.local_world_size);
    dedicated = false;
    of = "this worker's share of the machine's memory, " + gib(whole);
  }
  const double budget = plan::auto_budget_bytes(whole, dedicated);
  within = gib(budget) + " (" + plan::auto_budget_share(whole, dedicated) + of + ")";
  return budget;
}

// [train] micro_batch_size = "auto": the largest micro-batch that divides the rows per rank and
// whose memory plan fits; the accumulation takes the rest (the global batch is the recipe's).
void resolve_auto_micro_batch(const Recipe& recipe, const Registry& registry, Run& r) {
  std::string within;
  const double budget = auto_budget(r, within);
  const int64_t rows = r.opt.micro_batch * r.opt.accumulation;
  const int64_t m = budget > 0 ? plan::largest_micro_batch(recipe, registry, budget) : 0;
  r.opt.micro_batch = std::max<int64_t>(m, 1);
  r.opt.accumulation = rows / r.opt.micro_batch;
  if (r.ctx.rank != 0) return;
  const std::string split = std::to_string(r.opt.micro_batch) + " x " +
                            std::to_string(r.opt.accumulation) + " accumulation (" +
                            std::to_string(rows) + " sequences per rank a step)";
  if (m > 0)
    log_info("[train] micro_batch_size = \"auto\": " + split +
             ", the largest micro-batch whose memory plan fits " + within);
  else
    log_warn("[train] micro_batch_size = \"auto\": " + split +
             "; even a micro-batch of 1 does not fit " + within + " by the memory plan");
}

// [model] checkpoint_layers = "auto": the fewest checkpointed layers whose memory plan fits (at the
// micro-batch chosen above).
void resolve_auto_checkpointing(const Recipe& recipe, const Registry& registry, Run& r) {
  const int64_t L = r.model->config().num_hidden_layers;
  std::string within;
  const double budget = auto_budget(r, within);
  const int64_t c =
      budget > 0 ? plan::fewest_checkpointed_layers(recipe, registry, budget, r.opt.micro_batch)
                 : -1;
  if (c < 0) {
    r.model->set_activation_checkpointing(true, 0);
    if (r.ctx.rank == 0)
      log_warn(
          "[model] checkpoint_layers = \"auto\": every layer checkpointed; even so the memory plan "
          "does not fit " +
          within);
    return;
  }
  r.model->set_activation_checkpointing(c > 0, c == L ? 0 : c);
  if (r.ctx.rank == 0)
    log_info("[model] checkpoint_layers = \"auto\": " + std::to_string(c) + " of " +
             std::to_string(L) + " layers checkpointed, the fewest whose memory plan fits " +
             within);
}

namespace {
// Whether a plugin the recipe chose leaves one of its kOptionPlanned options "auto".
bool asks_planned_auto(const Recipe& recipe, const Registry& registry) {
  for (int i = 0; i < kNumSlots; ++i) {
    const Slot slot = static_cast<Slot>(i);
    const std::string name = recipe.plugin_name(slot);
    const PluginInfo* info = name.empty() ? nullptr : registry.find_info(slot, name);
    if (info && plan::has_planned_auto(recipe.plugin_config(slot, *info), *info)) return true;
  }
  return false;
}

// QLoRA's start-up lines (rank 0): what is quantized where, every ~10 s how far it got, and the
// total when done — a 7B base is a few hundred weights (build_run).
model::LlamaModel::QuantizeProgress quantize_progress(const Run& r, bool from_file) {
  if (r.ctx.rank != 0) return {};
  const std::string where = quant::nf4_quantizes_on(r.model->device())
                                ? "on " + r.model->device().str()
                                : std::string("on the CPU");
  const std::string source = from_file ? "read from " + r.opt.model_path : "random init";
  return [where, source, t0 = std::chrono::steady_clock::now(),
          last = std::chrono::steady_clock::now(),
          m = r.model.get()](int64_t done, int64_t total) mutable {
    const auto now = std::chrono::steady_clock::now();
    const double s = std::chrono::duration<double>(now - t0).count();
    char line[320];
    if (done == 0) {
      std::snprintf(line, sizeof line, "QLoRA: quantizing %lld linear weights to NF4 %s (%s)",
                    static_cast<long long>(total), where.c_str(), source.c_str());
    } else if (done == total) {
      std::snprintf(
          line, sizeof line, "QLoRA: base quantized in %.1f s: %lld weights, %.2f GiB NF4", s,
          static_cast<long long>(total), static_cast<double>(m->nf4_bytes()) / 1073741824.0);
    } else if (std::chrono::duration<double>(now - last).count() >= 10.0) {
      std::snprintf(line, sizeof line, "QLoRA: %lld of %lld weights quantized (%.0f s)",
                    static_cast<long long>(done), static_cast<long long>(total), s);
    } else {
      return;
    }
    last = now;
    log_info(line);
  };
}

// The values of parameter i from element `offset` on, for a model built without memory (QLoRA's
// quantize_base, a sharding that builds its own shard): the model folder's byte ranges when
// `weights` is given (it must outlive the function), else the per-parameter random draw that
// init_random makes (the same bits).
ParamValues parameter_values(const Run& r, const model::SafetensorsReader* weights) {
  if (weights)
    return [names = r.model->named_parameters(), weights](int i, int64_t offset,
                                                          const at::Tensor& out) {
      weights->load_slice_into(names[static_cast<size_t>(i)].first, offset, out);
    };
  return [m = r.model.get(), seed = r.ctx.seed, sd = r.opt.init_std](int i, int64_t offset,
                                                                     const at::Tensor& out) {
    m->init_random_values(i, offset, out, seed, sd);
  };
}

// [run] seed fixes the default generators of the CPU and of the rank's device, the only random
// stream training draws from (LoRA dropout masks; every weight init has its own seeded generator):
// a run is repeatable, and ranks draw apart (each drops its own batch independently). Resuming
// at the same world size puts both generators back from the checkpoint (checkpoint/checkpoint.h).
void seed_default_generators(const RunContext& ctx) {
  uint64_t x = ctx.seed ^ (0x9e3779b97f4a7c15ull * (static_cast<uint64_t>(ctx.rank) + 1));
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;  // splitmix64's mix
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  std::vector<c10::Device> devices{c10::Device(at::kCPU)};
  if (!ctx.device.is_cpu()) devices.push_back(ctx.device);
  for (const c10::Device d : devices) {
    at::Generator gen = at::globalContext().defaultGenerator(d);
    const std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_current_seed(x);
  }
}
}  // namespace

void check_recipe(const Recipe& recipe) {
  const TrainOptions opt = TrainOptions::from(recipe);
  schedule::LrSchedule::create(recipe.section("scheduler"), opt.lr, opt.max_steps);
}

std::vector<const PluginObject*> Run::plugins() const {
  return {comm.get(), precision.get(), optimizer.get(), sharding.get(), data.get()};
}

Run build_run(const Recipe& recipe, const Registry& registry, const launch::WorkerEnv& env,
              const WorkerOptions& options) {
  // Where the start-up goes, for the log line at the end (rank 0).
  using Clock = std::chrono::steady_clock;
  const auto t_start = Clock::now();
  auto lap = [t = t_start]() mutable {
    const auto now = Clock::now();
    const double s = std::chrono::duration<double>(now - t).count();
    t = now;
    return s;
  };
  Run r;
  r.opt = TrainOptions::from(recipe);
  r.ctx = make_context(recipe, r.opt, env);
  seed_default_generators(r.ctx);
  // Workers of another launcher (torchrun, srun, mpirun): rank 0 checks and locks the run
  // directory, the other ranks wait for its verdict. Under ciuic-run's launcher, or in one
  // process, ciuic-run claimed it before starting the run.
  if (options.claim_run_dir)
    r.run_dir =
        checkpoint::claim_run_dir(r.opt.run_paths(), {options.resume, options.overwrite}, r.ctx);
  std::error_code ec;
  fs::create_directories(r.opt.output_dir, ec);
  if (ec) throw Error("cannot create output_dir " + r.opt.output_dir + ": " + ec.message());
  // Plugin options the memory planner chooses (kOptionPlanned, "auto"), before the micro-batch:
  // they are planned with the leanest model settings, and the micro-batch and the checkpointed
  // layers are then chosen with them (plan.h). Only when a recipe asks: the planner is not on the
  // path of a run without "auto" options.
  std::vector<plan::PlannedOption> planned;
  if (asks_planned_auto(recipe, registry)) {
    std::string within;
    const double budget = auto_budget(r, within);
    planned = plan::planned_options(recipe, registry, budget);
    if (r.ctx.rank == 0)
      for (const auto& o : planned) log_info(plan::planned_text(o) + " " + within);
  }
  // micro_batch_size = "auto", then resuming on another world size (which keeps the checkpoint's
  // global batch, train/elastic.h, the chosen micro-batch as its largest): decided before anything
  // is sized by the micro-batch or the accumulation.
  if (r.opt.micro_batch_auto) resolve_auto_micro_batch(recipe, registry, r);
  if (const std::string folder = Checkpoints::resume_folder(r.opt.checkpoint_dir, options.resume);
      !folder.empty()) {
    const auto [rows, world] = checkpoint::read_batch_shape(folder);
    const ElasticSplit e =
        elastic_split(rows, world, r.opt.micro_batch, r.opt.accumulation, r.ctx.world_size, folder);
    if (e.changed) {
      r.opt.micro_batch = e.split.micro_batch;
      r.opt.accumulation = e.split.accumulation;
      if (r.ctx.rank == 0) log_info(e.message);
    }
  }
  // The schedule first: a recipe error must not wait for tens of GiB of optimizer state.
  r.schedule = schedule::LrSchedule::create(recipe.section("scheduler"), r.opt.lr, r.opt.max_steps);
  r.device = device_info(r.ctx.device, r.opt.peak_tflops);
  const double context_s = lap();

  r.comm = make_plugin<Comm>(recipe, registry, Slot::kComm, r.ctx, planned);
  if (r.comm->size() != r.ctx.world_size || r.comm->rank() != r.ctx.rank)
    throw Error("comm plugin " + r.comm->backend_name() + " reports rank " +
                std::to_string(r.comm->rank()) + " of " + std::to_string(r.comm->size()) +
                " but this worker is rank " + std::to_string(r.ctx.rank) + " of " +
                std::to_string(r.ctx.world_size));
  r.comm = std::make_shared<TrafficComm>(
      std::move(r.comm));  // link traffic by direction (train/comm_traffic.h)
  r.precision = make_plugin<Precision>(recipe, registry, Slot::kPrecision, r.ctx, planned);
  r.optimizer = make_plugin<Optimizer>(recipe, registry, Slot::kOptimizer, r.ctx, planned);
  r.sharding = make_plugin<Sharding>(recipe, registry, Slot::kSharding, r.ctx, planned);
  check_sharded_parameters(recipe, registry, *r.sharding, *r.optimizer, *r.precision);
  r.data = make_plugin<DataSource>(recipe, registry, Slot::kData, r.ctx, planned);
  const double plugins_s = lap();

  if (!r.opt.tokenizer_path.empty()) {
    r.tokenizer = load_tokenizer(r.opt.tokenizer_path);
    r.chat_template = make_chat_template(r.opt.chat_template, *r.tokenizer);
  }
  model::LlamaConfig cfg = recipe_model_config(recipe);
  if (r.tokenizer)
    cfg = with_tokenizer_special_ids(cfg, *r.tokenizer, r.opt.tokenizer_path, recipe,
                                     !r.opt.model_path.empty(), r.ctx.rank == 0);
  if (r.tokenizer && r.tokenizer->vocab_size() > cfg.vocab_size)
    throw UsageError("tokenizer " + r.opt.tokenizer_path + " has " +
                     std::to_string(r.tokenizer->vocab_size()) +
                     " tokens but the model's vocab_size is " + std::to_string(cfg.vocab_size));
  if (r.opt.seq_len > cfg.max_position_embeddings && r.ctx.rank == 0)
    log_warn("[train] seq_len = " + std::to_string(r.opt.seq_len) +
             " is longer than the model's max_position_embeddings = " +
             std::to_string(cfg.max_position_embeddings) +
             ": positions past it were never trained (rotary embeddings "
             "extrapolate)");
  // A sharding that builds the parameters itself (zero3) gets them without memory and their values
  // as a function: no rank ever holds the whole model (ciuic/sharding.h, builds_parameters).
  // With LoRA the frozen base is built whole (only the adapters reach the sharding).
  bool deferred = false;
  if (!r.opt.lora)
    as_plugin(recipe, registry, Slot::kSharding,
              [&] { deferred = r.sharding->builds_parameters(); });
  // QLoRA: built without memory; quantize_base fills it, each linear weight through a temporary
  // on the model's device quantized to NF4 there (every rank quantizes the whole base: it keeps
  // all of it).
  const bool nf4 = r.opt.lora && r.opt.lora->base_quantization == "nf4";
  r.model = std::make_unique<model::LlamaModel>(cfg, r.precision->param_dtype(), r.ctx.device,
                                                !deferred && !nf4);
  std::optional<model::SafetensorsReader> weights;
  ParamValues values;
  if (!r.opt.model_path.empty()) weights = model::SafetensorsReader::open(r.opt.model_path);
  const model::SafetensorsReader* from = weights ? &*weights : nullptr;
  if (nf4) {
    if (from) r.model->check_hf(*from);  // every refusal before a byte is read
    r.model->quantize_base(parameter_values(r, from), 64, true,
                           quantize_progress(r, from != nullptr));
    weights.reset();
  } else if (!deferred && !weights) {
    r.model->init_random(r.ctx.seed, r.opt.init_std);
  } else if (!deferred) {
    r.model->load_hf(*weights);
    weights.reset();
  } else {
    if (from) r.model->check_hf(*from);  // every refusal before setup() reads a byte
    values = parameter_values(r, from);
  }
  if (r.opt.lora) {  // the base frozen; only the adapters (and modules_to_save) reach the plugins
    r.model->enable_lora(*r.opt.lora);
    if (r.opt.lora->init_from.empty()) {
      r.model->init_lora(r.ctx.seed);
    } else {  // [adapter] init_from: a PEFT folder whose tensors must fit this base
      const std::string file =
          (std::filesystem::path(r.opt.lora->init_from) / "adapter_model.safetensors").string();
      try {
        r.model->load_lora(model::SafetensorsReader::open(file));
      } catch (const UsageError&) {
        throw;
      } catch (const Error& e) {
        throw UsageError(std::string("[adapter] init_from: ") + e.what());
      }
    }
  }
  r.model->set_activation_checkpointing(r.opt.activation_checkpointing, r.opt.checkpoint_layers);
  if (r.opt.activation_checkpointing && r.opt.checkpoint_layers_auto)
    resolve_auto_checkpointing(recipe, registry, r);
  else if (r.opt.checkpoint_layers_auto && r.ctx.rank == 0)
    log_warn(
        "[model] checkpoint_layers = \"auto\" has no effect without activation_checkpointing = "
        "true: no layer "
        "is checkpointed");
  r.model->set_loss_backward(r.opt.loss_backward == "recompute" ? model::LossBackward::kRecompute
                                                                : model::LossBackward::kInForward);
  if (r.opt.fused_kernels == "on" &&
      !model::fused_kernels_supported(r.model->dtype(), r.model->device()))
    throw UsageError(
        std::string(
            "[model] fused_kernels = \"on\": the fused kernels need a CUDA build and device = "
            "\"cuda\" (") +
        (model::fused_kernels_built()
             ? "this build has them; the run is on " + r.model->device().str()
             : std::string("this build has no CUDA")) +
        "); use \"auto\" to fall back to ATen");
  r.model->set_fused_kernels(r.opt.fused_kernels != "off");
  const double model_s = lap();

  ShardingSetup ss;
  for (auto& [name, t] : r.model->trainable_parameters())
    ss.params.push_back(ShardingParam{name, t, /*weight_decay=*/t.dim() >= 2});
  ss.groups = r.model->trainable_param_groups();
  ss.comm = r.comm.get();
  ss.precision = r.precision.get();
  ss.optimizer = r.optimizer.get();
  ss.gradient_accumulation_steps = r.opt.accumulation;
  ss.values = values;
  r.sharding->setup(ss);
  weights.reset();  // the mappings of the model folder's files
  r.model->set_group_boundaries(
      r.sharding.get());  // the model announces its groups to the sharding
  const double sharding_s = lap();
  const ShardingMemory sharding_mem = r.sharding->memory();
  const OptimizerMemory optimizer_mem = r.optimizer->memory();

  DataOpenArgs da;
  da.seq_len = r.opt.seq_len;
  da.micro_batch_size = r.opt.micro_batch;
  da.pin_memory = r.ctx.device.is_cuda();
  da.tokenizer = r.tokenizer.get();
  da.chat_template = r.chat_template.get();
  open_data_plugin(recipe, registry, *r.data, da);
  const double data_s = lap();
  if (r.ctx.rank == 0) {
    char line[320];
    std::snprintf(
        line, sizeof line,
        "set up in %.1f s: device and store %.1f s, plugins (comm %s) %.1f s, model %.1f s, "
        "sharding + "
        "optimizer state %.1f s (%.2f GiB on the device, %.2f GiB in host memory), data %.1f s",
        std::chrono::duration<double>(Clock::now() - t_start).count(), context_s,
        r.comm->backend_name().c_str(), plugins_s, model_s, sharding_s,
        static_cast<double>(sharding_mem.param_bytes + sharding_mem.grad_bytes +
                            optimizer_mem.device_bytes) /
            1073741824.0,
        static_cast<double>(optimizer_mem.host_bytes) / 1073741824.0, data_s);
    log_info(line);
  }
  return r;
}

DeviceBatch to_device(const Batch& b, c10::Device device, int64_t micro_batch) {
  DeviceBatch d;
  const bool async = device.is_cuda();
  d.input_ids = b.input_ids.to(device, /*non_blocking=*/async);
  d.labels = b.labels.to(device, async);
  if (b.position_ids.defined()) d.position_ids = b.position_ids.to(device, async);
  d.packed = b.num_documents > micro_batch;
  if (d.packed && b.position_ids.defined())
    d.docs = model::PackedDocs::from_position_ids(b.position_ids, device);
  return d;
}

at::Tensor loss_sum(Run& r, const DeviceBatch& d) {
  return r.model->loss_sum(d.input_ids, d.labels, d.position_ids, d.packed, d.docs_ptr());
}

std::vector<double> all_sum(Comm& comm, const std::vector<double>& values) {
  at::Tensor t = at::tensor(values, at::kDouble).to(comm.device());
  comm.all_reduce(t, ReduceOp::kSum)->wait();
  t = t.cpu();
  return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
}

}  // namespace ciuic::train
