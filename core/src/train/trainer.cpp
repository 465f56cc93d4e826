// The body of one worker process: build the run from the recipe, then train.
//
// Read it top to bottom: run_worker() builds a Run (context, plugins, model, data, schedule),
// then train() is the loop, one optimizer step per iteration:
//
//   1. data      this step's micro-batches; the global count of label tokens (and whether any
//                rank was asked to stop) agreed in one tiny all-reduce
//   2. backward  per micro-batch: loss = sum of token losses / global label tokens, times the
//                precision's loss scale; backward; the sharding's hooks reduce gradients as
//                buckets complete
//   3. step      the sharding waits for reductions, checks overflow, clips, updates, gathers
//   4. metrics   loss/lr/grad norm/tokens/s (+ MFU and memory on GPU) to metrics.jsonl and the
//                progress line
//   5. eval and checkpoints when due
//
// Loss normalisation is exact whatever the split into ranks and micro-batches: every micro-batch
// contributes sum(token losses) / N, with N the label tokens of the whole global batch, and the
// sharding SUMs gradients across ranks. So the step's gradient is that of the mean token loss of
// the global batch (the trap of averaging per-micro-batch means is avoided).
#include "train/worker.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>

#include <ciuic/comm.h>
#include <ciuic/data.h>
#include <ciuic/error.h>
#include <ciuic/log.h>
#include <ciuic/offload.h>
#include <ciuic/precision.h>
#include <ciuic/sharding.h>
#include <ciuic/tokenizer.h>

#include "checkpoint/checkpoint.h"
#include "model/config.h"
#include "model/hf_export.h"
#include "model/llama.h"
#include "optim/device_adamw.h"
#include "optim/schedule.h"
#include "recipe/recipe.h"
#include "registry/registry.h"
#include "train/device_info.h"
#include "train/exact_match.h"
#include "train/metrics.h"

namespace fs = std::filesystem;

namespace ciuic::train {

namespace {

// ---- signals: SIGINT/SIGTERM ask for a clean stop at the next step boundary -----------------
std::atomic<int> g_stop_signal{0};
extern "C" void on_stop_signal(int sig) { g_stop_signal.store(sig); }

class StopSignals {
 public:
  StopSignals() {
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
  }
  ~StopSignals() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }

 private:
  struct sigaction old_int_ {}, old_term_ {};
};

// ---- the run: everything the loop needs ------------------------------------------------------
struct Run {
  explicit Run(const Recipe& rc)
      : recipe(&rc),
        train(rc.section("train")),
        optimizer(rc.section("optimizer")),
        scheduler(rc.section("scheduler")),
        checkpoint(rc.section("checkpoint")),
        log(rc.section("log")) {}
  const Recipe* recipe;
  RunContext ctx;
  Config train, optimizer, scheduler, checkpoint, log;
  std::shared_ptr<Comm> comm;
  std::shared_ptr<Precision> precision;
  std::shared_ptr<Offload> offload;
  std::shared_ptr<Sharding> sharding;
  std::shared_ptr<DataSource> data;
  std::shared_ptr<const Tokenizer> tokenizer;
  std::unique_ptr<ChatTemplate> chat_template;
  std::unique_ptr<model::LlamaModel> model;
  std::unique_ptr<optim::LrSchedule> schedule;
  DeviceInfo device;
  std::string tokenizer_path;

  int64_t micro_batch = 1, accumulation = 1, seq_len = 1, max_steps = 1;
  AdamWHyper hyper;
  double clip = 0.0;
};

std::string resolve_input(const std::string& p, const std::string& base) {
  if (p.empty()) return p;
  fs::path path(p);
  return path.is_absolute() ? p : (fs::path(base) / path).lexically_normal().string();
}

// Recipe sections -> RunContext for this worker.
RunContext make_context(const Recipe& recipe, const launch::WorkerEnv& env) {
  const Config run = recipe.section("run");
  const Config cluster = recipe.section("cluster");
  RunContext ctx;
  launch::apply_worker_env(env, ctx);
  ctx.timeout = std::chrono::milliseconds(
      static_cast<int64_t>(cluster.get_float("timeout_s") * 1000.0));
  ctx.run_name = run.get_string("name");
  ctx.output_dir = run.get_string("output_dir");
  ctx.recipe_dir = recipe.dir();
  ctx.seed = static_cast<uint64_t>(run.get_int("seed"));
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  ctx.cpu_threads = std::max(1, static_cast<int>(hw) / std::max(1, env.local_world_size));

  if (cluster.get_string("device") == "cuda") {
    ctx.device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank));
    set_current_device(ctx.device);
    launch::apply_memory_cap(env.local_rank, cluster.get_float("memory_per_device_gib"));
  }
  at::set_num_threads(ctx.cpu_threads);
  std::error_code ec;
  fs::create_directories(ctx.output_dir, ec);
  if (ec) throw Error("cannot create output_dir " + ctx.output_dir + ": " + ec.message());
  ctx.store = launch::connect_store(env, ctx.timeout);
  return ctx;
}

template <class T>
std::shared_ptr<T> make_plugin(const Recipe& recipe, const Registry& registry, Slot slot,
                               const RunContext& ctx) {
  const std::string name = recipe.plugin_name(slot);
  const PluginDescriptor& d = registry.get(slot, name);
  return registry.create<T>(slot, name, recipe.plugin_config(slot, *d.info), ctx);
}

// [model] -> LlamaConfig: the folder's config.json with [model.config] on top, or
// [model.config] alone for a randomly initialised model.
model::LlamaConfig model_config(const Recipe& recipe, const std::string& model_path) {
  const Config mc = recipe.section("model.config");
  nlohmann::json overrides = nlohmann::json::object();
  for (const std::string& k : mc.keys()) {
    if (k == "tie_word_embeddings") overrides[k] = mc.get_bool(k);
    else if (k == "rope_theta" || k == "rms_norm_eps" || k == "rope_scaling_factor")
      overrides[k] = mc.get_float(k);
    else if (k == "rope_scaling_type") overrides[k] = mc.get_string(k);
    else overrides[k] = mc.get_int(k);
  }
  const std::string origin = recipe.path().empty() ? "[model.config]" : recipe.path() + " [model.config]";
  if (!model_path.empty())
    return model::LlamaConfig::from_file((fs::path(model_path) / "config.json").string())
        .with_overrides(overrides, origin);
  return model::LlamaConfig{}.with_overrides(overrides, origin);
}

}  // namespace

model::LlamaConfig recipe_model_config(const Recipe& recipe) {
  return model_config(recipe, resolve_input(recipe.section("model").get_string("path"), recipe.dir()));
}

void check_recipe(const Recipe& recipe) {
  const Config train = recipe.section("train");
  optim::LrSchedule::create(recipe.section("scheduler"), recipe.section("optimizer").get_float("lr"),
                            train.get_int("max_steps"));
}

namespace {

Run build_run(const Recipe& recipe, const Registry& registry, const launch::WorkerEnv& env) {
  Run r(recipe);
  r.ctx = make_context(recipe, env);
  r.micro_batch = r.train.get_int("micro_batch_size");
  r.accumulation = r.train.get_int("gradient_accumulation_steps");
  r.seq_len = r.train.get_int("seq_len");
  r.max_steps = r.train.get_int("max_steps");
  r.clip = r.train.get_float("gradient_clipping");
  const auto betas = r.optimizer.get_float_list("betas");
  r.hyper.lr = r.optimizer.get_float("lr");
  r.hyper.beta1 = betas.at(0);
  r.hyper.beta2 = betas.at(1);
  r.hyper.eps = r.optimizer.get_float("eps");
  r.hyper.weight_decay = r.optimizer.get_float("weight_decay");
  // The schedule first: a recipe error must not wait for tens of GiB of optimizer state.
  r.schedule = optim::LrSchedule::create(r.scheduler, r.hyper.lr, r.max_steps);
  r.device = device_info(r.ctx.device, r.log.get_float("peak_tflops"));

  // Plugins: comm first (the others may talk through it), then policy, optimizer, data.
  r.comm = make_plugin<Comm>(recipe, registry, Slot::kComm, r.ctx);
  if (r.comm->size() != r.ctx.world_size || r.comm->rank() != r.ctx.rank)
    throw Error("comm plugin " + r.comm->backend_name() + " reports rank " +
                std::to_string(r.comm->rank()) + " of " + std::to_string(r.comm->size()) +
                " but this worker is rank " + std::to_string(r.ctx.rank) + " of " +
                std::to_string(r.ctx.world_size));
  r.precision = make_plugin<Precision>(recipe, registry, Slot::kPrecision, r.ctx);
  if (recipe.plugin_name(Slot::kOffload).empty())
    r.offload = optim::make_device_adamw();
  else
    r.offload = make_plugin<Offload>(recipe, registry, Slot::kOffload, r.ctx);
  r.sharding = make_plugin<Sharding>(recipe, registry, Slot::kSharding, r.ctx);
  r.data = make_plugin<DataSource>(recipe, registry, Slot::kData, r.ctx);

  // Model, tokenizer, chat template.
  const Config m = recipe.section("model");
  const std::string model_path = resolve_input(m.get_string("path"), recipe.dir());
  std::string tok_path = resolve_input(m.get_string("tokenizer"), recipe.dir());
  if (tok_path.empty() && !model_path.empty() &&
      fs::exists(fs::path(model_path) / "tokenizer.json"))
    tok_path = (fs::path(model_path) / "tokenizer.json").string();
  r.tokenizer_path = tok_path;
  if (!tok_path.empty()) {
    r.tokenizer = Tokenizer::from_file(tok_path);
    r.chat_template = ChatTemplate::create(m.get_string("chat_template"), *r.tokenizer);
  }
  const model::LlamaConfig cfg = model_config(recipe, model_path);
  if (r.tokenizer && r.tokenizer->vocab_size() > cfg.vocab_size)
    throw UsageError("tokenizer " + tok_path + " has " + std::to_string(r.tokenizer->vocab_size()) +
                     " tokens but the model's vocab_size is " + std::to_string(cfg.vocab_size));
  r.model = std::make_unique<model::LlamaModel>(cfg, r.precision->param_dtype(), r.ctx.device);
  if (model_path.empty())
    r.model->init_random(r.ctx.seed, m.get_float("init_std"));
  else
    r.model->load_hf(model_path);
  r.model->set_activation_checkpointing(m.get_bool("activation_checkpointing"));

  ShardingSetup ss;
  for (auto& [name, t] : r.model->named_parameters())
    ss.params.push_back(ShardingParam{name, t, /*weight_decay=*/t.dim() >= 2});
  ss.comm = r.comm.get();
  ss.precision = r.precision.get();
  ss.offload = r.offload.get();
  ss.gradient_accumulation_steps = r.accumulation;
  r.sharding->setup(ss);

  DataOpenArgs da;
  da.seq_len = r.seq_len;
  da.micro_batch_size = r.micro_batch;
  da.seed = r.ctx.seed;
  da.rank = r.ctx.rank;
  da.world_size = r.ctx.world_size;
  da.pin_memory = r.ctx.device.is_cuda();
  da.tokenizer = r.tokenizer.get();
  da.chat_template = r.chat_template.get();
  r.data->open(da);
  return r;
}

// ---- helpers of the loop ----------------------------------------------------------------------
struct DeviceBatch {
  at::Tensor input_ids, labels, position_ids;
  bool packed = false;
  // Document boundaries of packed rows (lets the model run varlen flash attention on GPU instead
  // of a dense block-diagonal mask); built from the CPU position_ids, no host sync.
  std::optional<model::PackedDocs> docs;
  const model::PackedDocs* docs_ptr() const { return docs ? &*docs : nullptr; }
};

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

// Sums `values` over ranks (fp64 on the comm's device) and returns them on the host.
std::vector<double> all_sum(Comm& comm, const std::vector<double>& values) {
  at::Tensor t = at::tensor(values, at::kDouble).to(comm.device());
  comm.all_reduce(t, ReduceOp::kSum)->wait();
  t = t.cpu();
  return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
}

struct EvalResult {
  double loss = NAN;
  int64_t tokens = 0;
};

EvalResult evaluate(Run& r) {
  EvalResult e;
  if (!r.data->has_eval()) return e;
  const int64_t limit = r.train.get_int("eval_batches");
  c10::NoGradGuard no_grad;
  r.data->begin_eval();
  at::Tensor loss_sum = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(r.ctx.device));
  double tokens = 0;
  for (int64_t n = 0; limit == 0 || n < limit; ++n) {
    std::optional<Batch> b = r.data->next_eval();
    if (!b) break;
    DeviceBatch d = to_device(*b, r.ctx.device, r.micro_batch);
    loss_sum += r.model->loss_sum(d.input_ids, d.labels, d.position_ids, d.packed, d.docs_ptr());
    tokens += static_cast<double>(b->num_label_tokens);
  }
  const auto g = all_sum(*r.comm, {loss_sum.item<double>(), tokens});
  e.tokens = static_cast<int64_t>(g[1]);
  e.loss = g[1] > 0 ? g[0] / g[1] : NAN;
  return e;
}

// ---- exact-match evaluation of greedy answers (the demo's "did it learn?") --------------------
// Each rank answers every world_size-th question; counts (overall and per category) are summed
// across ranks.
ExactMatchResult exact_match_all_ranks(Run& r, const std::vector<HeldOutQuestion>& qs,
                                       int64_t max_new_tokens) {
  c10::NoGradGuard no_grad;
  std::vector<HeldOutQuestion> mine;
  for (size_t i = r.ctx.rank; i < qs.size(); i += r.ctx.world_size) mine.push_back(qs[i]);
  const std::optional<int32_t> stop = r.tokenizer->eos_id();
  ExactMatchResult local = exact_match(
      mine, *r.tokenizer, *r.chat_template,
      [&](const std::vector<int32_t>& prompt, int64_t max_new) {
        return r.model->generate_greedy(prompt, max_new, stop);
      },
      max_new_tokens);
  std::set<std::string> cats;
  for (const auto& q : qs) cats.insert(q.category);
  std::vector<double> counts = {static_cast<double>(local.correct), static_cast<double>(local.total)};
  for (const auto& c : cats) {
    auto it = local.by_category.find(c);
    counts.push_back(it == local.by_category.end() ? 0.0 : static_cast<double>(it->second.first));
    counts.push_back(it == local.by_category.end() ? 0.0 : static_cast<double>(it->second.second));
  }
  const std::vector<double> g = all_sum(*r.comm, counts);
  ExactMatchResult all;
  all.correct = static_cast<int64_t>(g[0]);
  all.total = static_cast<int64_t>(g[1]);
  size_t i = 2;
  for (const auto& c : cats) {
    all.by_category[c] = {static_cast<int64_t>(g[i]), static_cast<int64_t>(g[i + 1])};
    i += 2;
  }
  all.mistakes = local.mistakes;
  return all;
}

// ---- the loop ---------------------------------------------------------------------------------
int train(Run& r, const WorkerOptions& opts) {
  const bool rank0 = r.ctx.rank == 0;
  const int64_t log_every = r.log.get_int("every_steps");
  const int64_t eval_every = r.train.get_int("eval_every_steps");
  const bool nonfinite_skip = r.train.get_string("nonfinite") == "skip";
  const int64_t max_nonfinite = r.train.get_int("max_nonfinite_skips");
  const std::string progress_mode = r.log.get_string("progress");
  const bool force_tty = progress_mode == "on" || std::getenv("CIUIC_PROGRESS_TTY") != nullptr;
  const double flops_per_token = r.model->config().flops_per_token(r.seq_len);
  const int64_t tokens_per_step = r.micro_batch * r.seq_len * r.accumulation * r.ctx.world_size;

  MetricsLog metrics(rank0 ? (fs::path(r.ctx.output_dir) / r.log.get_string("metrics_file")).string()
                           : std::string());
  // Checkpoints: where, how often, and the shape a checkpoint must match to be resumed.
  const std::string ckpt_dir = r.checkpoint.get_string("dir").empty()
                                   ? (fs::path(r.ctx.output_dir) / "checkpoints").string()
                                   : r.checkpoint.get_string("dir");
  const int64_t ckpt_every = r.checkpoint.get_int("every_steps");
  checkpoint::Checkpointer ckpt(ckpt_dir, r.checkpoint.get_int("keep_last"), r.ctx);
  checkpoint::RunShape shape;
  shape.model = r.model->config();
  shape.global_rows = r.micro_batch * r.accumulation * r.ctx.world_size;
  shape.seq_len = r.seq_len;
  for (const auto& [name, t] : r.model->named_parameters())
    shape.params.emplace_back(name, t.sizes().vec());
  const checkpoint::Parts parts{r.comm.get(), r.sharding.get(), r.precision.get(), r.data.get()};

  checkpoint::TrainerState st;  // step = optimizer steps completed; updates = of those applied
  // --resume auto: the newest checkpoint if there is one, else a fresh start (for jobs that are
  // restarted after preemption with the same command line).
  const bool auto_fresh = opts.resume == "auto" && ckpt.latest().empty();
  if (auto_fresh && rank0) log_info("--resume auto: no checkpoint in " + ckpt_dir + "; starting fresh");
  if (!opts.resume.empty() && !auto_fresh) {
    const std::string folder =
        checkpoint::resolve(opts.resume == "auto" ? "latest" : opts.resume, ckpt_dir);
    st = ckpt.load(folder, shape, parts);
    if (rank0) log_info("resumed from " + folder + " at step " + std::to_string(st.step));
  }
  int64_t& step = st.step;
  double last_loss = NAN;
  auto save = [&] {
    const std::string where = ckpt.save(st, shape, parts);
    if (rank0) log_info("checkpoint saved: " + where);
    return where;
  };

  Progress progress(step + 1, r.max_steps, rank0 && progress_mode != "off", force_tty);
  if (rank0) {
    const auto& mc = r.model->config();
    progress.message("training " + std::to_string(mc.num_parameters()) + " parameters (" +
                     std::to_string(mc.num_hidden_layers) + " layers, hidden " +
                     std::to_string(mc.hidden_size) + ") on " + std::to_string(r.ctx.world_size) +
                     " rank(s) of " + r.device.name + ": " + r.comm->backend_name() +
                     ", global batch " + std::to_string(tokens_per_step) + " tokens, " +
                     std::to_string(r.max_steps) + " steps, lr " + r.schedule->describe());
  }
  // Exact-match accuracy of greedy answers before training (and after, at the end).
  std::vector<HeldOutQuestion> questions;
  ExactMatchResult em_before;
  const std::string em_file = resolve_input(r.train.get_string("exact_match_file"), r.recipe->dir());
  const int64_t em_tokens = r.train.get_int("exact_match_max_new_tokens");
  auto score = [&](const char* when) {
    const ExactMatchResult em = exact_match_all_ranks(r, questions, em_tokens);
    if (rank0) {
      nlohmann::json cats = nlohmann::json::object();
      for (const auto& [c, v] : em.by_category) cats[c] = v.second ? double(v.first) / v.second : 0.0;
      metrics.write({{"event", "exact_match"}, {"when", when}, {"step", step},
                     {"accuracy", em.accuracy()}, {"questions", em.total}, {"by_category", cats}});
    }
    return em;
  };
  if (!em_file.empty()) {
    if (!r.tokenizer || !r.chat_template)
      throw UsageError("[train] exact_match_file needs a tokenizer ([model] tokenizer or path)");
    questions = load_held_out(em_file);
    const int64_t limit = r.train.get_int("exact_match_limit");
    if (limit > 0 && static_cast<int64_t>(questions.size()) > limit) questions.resize(limit);
    if (questions.empty()) throw UsageError("[train] exact_match_file " + em_file + " holds no questions");
    em_before = score("before");
    if (rank0)
      progress.message("exact match before training: " + std::to_string(em_before.correct) + "/" +
                       std::to_string(em_before.total) + " held-out questions");
  }
  if (eval_every > 0 && step == 0) {
    const EvalResult e = evaluate(r);
    if (rank0 && e.tokens > 0)
      metrics.write({{"event", "eval"}, {"step", 0}, {"eval_loss", e.loss},
                     {"eval_ppl", std::exp(e.loss)}, {"eval_tokens", e.tokens}});
  }

  StopSignals signals;
  reset_peak_memory(r.ctx.device);
  const auto run_start = std::chrono::steady_clock::now();
  const double tokens_at_start = st.tokens;
  auto window_start = run_start;
  double window_tokens = 0;
  double window_labels = 0;  // global label tokens of the steps since the last log
  at::Tensor loss_acc = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(r.ctx.device));

  while (step < r.max_steps) {
    const int64_t this_step = step + 1;
    const auto t0 = std::chrono::steady_clock::now();

    // 1. Data for the whole step; agree on the global label-token count and on stopping.
    std::vector<Batch> batches;
    batches.reserve(r.accumulation);
    double local_labels = 0;
    for (int64_t i = 0; i < r.accumulation; ++i) {
      batches.push_back(r.data->next());
      local_labels += static_cast<double>(batches.back().num_label_tokens);
    }
    const auto agreed = all_sum(*r.comm, {local_labels, g_stop_signal.load() ? 1.0 : 0.0});
    if (agreed[1] > 0) {
      progress.finish();
      if (rank0) log_info("stopping at step " + std::to_string(step) + " on a signal");
      if (r.checkpoint.get_bool("on_signal") && step > 0) save();
      metrics.write({{"event", "interrupted"}, {"step", step}});
      return kExitInterrupted;
    }
    const double global_labels = std::max(1.0, agreed[0]);
    window_labels += global_labels;

    // 2. Forward and backward, micro-batch by micro-batch. On logged steps the device is
    // synchronised at the phase boundaries so that the phases can be timed.
    const bool timed = (this_step % log_every == 0) || this_step == r.max_steps;
    const auto t_fb = std::chrono::steady_clock::now();
    const double scale = r.precision->loss_scale();
    for (int64_t i = 0; i < r.accumulation; ++i) {
      r.sharding->begin_micro_batch(i, i + 1 == r.accumulation);
      DeviceBatch d = to_device(batches[i], r.ctx.device, r.micro_batch);
      at::Tensor loss_sum =
          r.model->loss_sum(d.input_ids, d.labels, d.position_ids, d.packed, d.docs_ptr());
      at::Tensor loss = loss_sum * (scale / global_labels);
      torch::autograd::backward({loss});
      loss_acc.add_(loss_sum.detach());
    }

    double fwd_bwd_s = 0, optim_s = 0;
    if (timed) {
      synchronize(r.ctx.device);
      fwd_bwd_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_fb).count();
    }

    // 3. Optimizer step.
    const auto t_opt = std::chrono::steady_clock::now();
    StepInput in;
    in.hyper = r.hyper;
    in.hyper.lr = r.schedule->lr(step);
    in.max_grad_norm = r.clip;
    in.step = this_step;
    in.adam_step = st.updates + 1;
    const StepResult res = r.sharding->step(in);
    if (timed) {
      synchronize(r.ctx.device);
      optim_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_opt).count();
    }
    step = this_step;
    if (res.skipped) {
      ++st.skipped;
      if (!std::isfinite(res.grad_norm) && !r.precision->needs_overflow_check()) {
        // Non-finite gradients that no loss scaler accounts for.
        ++st.nonfinite_skips;
        if (!nonfinite_skip || st.nonfinite_skips > max_nonfinite)
          throw Error("non-finite gradient norm (" + std::to_string(res.grad_norm) + ") at step " +
                      std::to_string(this_step) +
                      (nonfinite_skip ? " after " + std::to_string(st.nonfinite_skips - 1) +
                                            " skipped steps ([train] max_nonfinite_skips)"
                                      : "; set [train] nonfinite = \"skip\" to skip such steps") +
                      (ckpt.last_good().empty() ? "; no checkpoint was written"
                                                : "; last good checkpoint: " + ckpt.last_good()));
        if (rank0) progress.message("step " + std::to_string(this_step) +
                                    ": non-finite gradient, step skipped");
      }
    } else {
      ++st.updates;
    }
    st.tokens += static_cast<double>(tokens_per_step);
    window_tokens += static_cast<double>(tokens_per_step);

    // 4. Metrics.
    const bool log_now = step % log_every == 0 || step == r.max_steps;
    if (log_now) {
      // Mean token loss over the steps since the last log.
      const double loss = all_sum(*r.comm, {loss_acc.item<double>()})[0] / window_labels;
      last_loss = loss;
      loss_acc.zero_();
      window_labels = 0;
      const auto now = std::chrono::steady_clock::now();
      const double window_s = std::chrono::duration<double>(now - window_start).count();
      const double step_s = std::chrono::duration<double>(now - t0).count();
      const double tps = window_tokens / std::max(window_s, 1e-9);
      window_start = now;
      window_tokens = 0;
      if (rank0) {
        nlohmann::json rec = {{"step", step},
                              {"loss", loss},
                              {"lr", in.hyper.lr},
                              {"grad_norm", res.grad_norm},
                              {"loss_scale", scale},
                              {"skipped", res.skipped},
                              {"tokens", st.tokens},
                              {"tokens_per_s", tps},
                              {"step_s", step_s},
                              {"fwd_bwd_s", fwd_bwd_s},
                              {"optim_s", optim_s}};
        if (r.ctx.device.is_cuda()) {
          const MemoryStats ms = memory_stats(r.ctx.device);
          rec["mem_gib"] = ms.peak_allocated / 1073741824.0;
          rec["mem_reserved_gib"] = ms.peak_reserved / 1073741824.0;
          if (r.device.peak_tflops > 0)
            rec["mfu"] = flops_per_token * tps / r.ctx.world_size / (r.device.peak_tflops * 1e12);
        }
        Metrics pm;
        for (const PluginObject* p :
             {static_cast<const PluginObject*>(r.comm.get()), static_cast<const PluginObject*>(r.precision.get()),
              static_cast<const PluginObject*>(r.offload.get()), static_cast<const PluginObject*>(r.sharding.get()),
              static_cast<const PluginObject*>(r.data.get())})
          p->append_metrics(pm);
        for (const auto& [k, v] : pm.values) rec[k] = v;
        metrics.write(rec);
      }
      progress.update(step, loss, in.hyper.lr, tps, log_now);
    } else {
      progress.update(step, last_loss, in.hyper.lr,
                      window_tokens / std::max(1e-9, std::chrono::duration<double>(
                                                         std::chrono::steady_clock::now() -
                                                         window_start).count()),
                      false);
    }

    // 5. Evaluation.
    if (eval_every > 0 && (step % eval_every == 0 || step == r.max_steps)) {
      const EvalResult e = evaluate(r);
      if (rank0 && e.tokens > 0) {
        progress.message("eval at step " + std::to_string(step) + ": loss " +
                         std::to_string(e.loss) + ", perplexity " + std::to_string(std::exp(e.loss)));
        metrics.write({{"event", "eval"}, {"step", step}, {"eval_loss", e.loss},
                       {"eval_ppl", std::exp(e.loss)}, {"eval_tokens", e.tokens}});
      }
    }

    // 6. Checkpoint.
    if (ckpt_every > 0 && step % ckpt_every == 0 && step < r.max_steps) save();
  }
  progress.finish();
  if (!questions.empty()) {
    const ExactMatchResult after = score("after");
    if (rank0) {
      std::fputs(format_table(em_before, after).c_str(), stderr);
      for (const auto& m : after.mistakes) log_info("  e.g. " + m);
    }
  }

  // The end: a final checkpoint (unless the recipe turns it off), and the Hugging Face export,
  // made from the checkpoint's fp32 master weights.
  std::string final_ckpt;
  if (r.checkpoint.get_bool("save_final") || r.checkpoint.get_bool("export_hf"))
    final_ckpt = save();
  if (r.checkpoint.get_bool("export_hf") && rank0) {
    const std::string out = (fs::path(r.ctx.output_dir) / "hf").string();
    model::HfExportOptions eo;
    eo.dtype = r.checkpoint.get_string("export_dtype") == "fp32" ? at::kFloat : at::kBFloat16;
    if (!r.tokenizer_path.empty()) {
      eo.extra_files.push_back(r.tokenizer_path);
      const fs::path tc = fs::path(r.tokenizer_path).parent_path() / "tokenizer_config.json";
      if (fs::exists(tc)) eo.extra_files.push_back(tc.string());
    }
    model::write_hf_folder(out, r.model->config(), checkpoint::read_master_weights(final_ckpt), eo);
    log_info("exported Hugging Face model to " + out);
  }

  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
  if (rank0) {
    nlohmann::json end = {{"event", "end"},           {"steps", step},
                          {"world_size", r.ctx.world_size},
                          {"updates", st.updates},    {"skipped", st.skipped},
                          {"tokens", st.tokens},      {"elapsed_s", elapsed},
                          {"tokens_per_s", (st.tokens - tokens_at_start) / std::max(elapsed, 1e-9)},
                          {"final_loss", last_loss}};
    if (r.ctx.device.is_cuda())
      end["peak_mem_gib"] = memory_stats(r.ctx.device).peak_allocated / 1073741824.0;
    metrics.write(end);
    log_info("done: " + std::to_string(step) + " steps, final loss " + std::to_string(last_loss) +
             ", " + human_count((st.tokens - tokens_at_start) / std::max(elapsed, 1e-9)) + " tokens/s, " +
             human_duration(elapsed));
  }
  return kExitOk;
}

}  // namespace

int run_worker(const Recipe& recipe, const Registry& registry, const launch::WorkerEnv& env,
               const WorkerOptions& options) {
  set_log_rank(env.world_size > 1 ? env.rank : -1);
  try {
    Run run = build_run(recipe, registry, env);
    return train(run, options);
  } catch (const c10::OutOfMemoryError& e) {
    // LibTorch's message is long and generic: name the rank, the cap and the peaks instead
    // (the first sentence of LibTorch's message, with the size it tried, is kept).
    std::string detail = e.what_without_backtrace();
    if (const auto dot = detail.find(". "); dot != std::string::npos) detail.resize(dot);
    const Config cluster = recipe.section("cluster");
    if (cluster.get_string("device") != "cuda")
      throw Error("rank " + std::to_string(env.rank) + " ran out of host memory: " + detail);
    throw Error(launch::out_of_memory_message(env.rank, env.local_rank,
                                              cluster.get_float("memory_per_device_gib"), detail));
  } catch (const c10::Error& e) {
    // The CPU allocator reports a failed allocation as a plain c10::Error.
    const std::string m = e.what_without_backtrace();
    const auto at = m.find("DefaultCPUAllocator: can't allocate memory");
    if (at == std::string::npos) throw;
    std::string detail = m.substr(at + std::string("DefaultCPUAllocator: ").size());
    if (const auto code = detail.find(". Error code"); code != std::string::npos) detail.resize(code);
    throw Error("rank " + std::to_string(env.rank) + " ran out of host memory: " + detail +
                " (model, optimizer state and batches of this recipe do not fit)");
  }
}

}  // namespace ciuic::train
