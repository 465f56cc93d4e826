// cpu_adam — the optimizer plugin that keeps the rank's fp32 master weights, AdamW moments and
// gradient shard in host memory and updates them there with a SIMD, multi-threaded AdamW
// (ZeRO-Offload's CPU Adam).
//
// Data flow of one step on a CUDA run:
//
//   accumulate_grad(region, chunk)   (as the Sharding's reductions complete, during backward)
//     chunk --D2H on the current stream--> pinned host memory (reduce dtype), event recorded:
//     straight into the gradient shard when nothing is to be added (the step's first chunk in
//     the shard's dtype), else into the next of kLandingSlots landing slots;
//     the fold thread (host_accumulator.h) waits for the event and folds the slot into the fp32
//     gradient shard (assign on the step's first chunk, add after; squares for the norm on the
//     last)
//   finish_grads()                   waits for the folds still queued -> sum of squares
//   step():
//     for each tile of tile_size elements:
//       threads: AdamW on master/m/v of the tile, parameters rounded into staging slot k % 2
//       staging slot --upload stream--> params_out tile      (overlaps the next tile's update)
//     the current stream waits for the uploads; the host waits for the last two
//
// Early update (`overlap_update = "auto"`, taken when the Sharding offers it: no clipping, no
// loss scale that may skip the step, a run that stops on a non-finite gradient — ciuic/optimizer.h,
// "Early update"): the same AdamW runs per gradient region, as a task the fold thread runs right
// after the region's last fold of the step, while backward goes on with the other buckets:
//
//   accumulate_grad(region, chunk, last = true)
//     fold job (as above), then an update task: AdamW on the region's master/m/v (the fold's
//     team share during backward, the whole team once finish_grads() was called), parameters
//     rounded into host memory (the region's own part of the gradient shard, which the update
//     has consumed: early_out())
//   finish_grads()                   waits for the folds only; updates may still run
//   step(args)                       args must be the offered ones; region by region, in the
//                                    order they were updated: wait for its update, upload its
//                                    parameters to params_out (overlaps the later regions'
//                                    updates); the current stream waits for the uploads, the
//                                    host for the last
// Per element the arithmetic is the same kernel on the same inputs (the final gradient, the step's
// coefficients), so master, moments and parameters are bit-identical to the update in step(); only
// the split into pieces differs, and no result depends on it. Parameters reach params_out only in
// step(), after backward: see step_early().
//
// On a CPU run ("direct"): chunks are host memory and are folded from where they are; the threads
// write params_out in the parameter dtype during the update — no copies. `pipeline = "staged"`
// forces the staged upload path on the CPU (synchronous copies): it exercises the same bookkeeping
// in CPU-only tests.
//
// Rounding: when the precision policy rounds to nearest even (Precision::rounds_to_nearest), the
// kernel writes the parameter dtype itself; otherwise the kernel updates the master only and the
// policy's round_to_param() converts each tile.
//
// Threading: the interface is called on the main thread; the update runs on a private team of
// `threads` threads (the main thread included). Work is split into contiguous, 64-element
// aligned pieces, the same split for first touch at setup() and for every step.
#define CIUIC_PLUGIN_API 9
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <ciuic/config.h>
#include <ciuic/context.h>
#include <ciuic/error.h>
#include <ciuic/kit/adam_options.h>
#include <ciuic/kit/host_buffer.h>
#include <ciuic/log.h>
#include <ciuic/optimizer.h>
#include <ciuic/plan.h>
#include <ciuic/plugin.h>
#include <ciuic/precision.h>

#include "adamw_kernel.h"
#include "copier.h"
#include "host_accumulator.h"
#include <ciuic/thread_pool.h>

namespace ciuic_cpu_adam {
namespace {

constexpr const char* kWho = "optimizer cpu_adam";
constexpr int64_t kAlign = 64;  // elements: every thread's piece starts on a 256-byte boundary

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

Dtype to_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return Dtype::kF32;
    case at::kBFloat16: return Dtype::kBF16;
    case at::kHalf: return Dtype::kF16;
    default: throw ciuic::Error(std::string(kWho) + ": unsupported dtype " + c10::toString(t));
  }
}

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f s", s);
  return buf;
}

std::string gib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / (1u << 30));
  return buf;
}

struct Hyper {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
};

// The coefficients of step t, rounded to fp32 the way torch::optim::AdamW's scalars are.
Coefficients coefficients(const Hyper& h, const ciuic::OptimizerStep& a) {
  Coefficients c;
  const double bias_correction1 = 1.0 - std::pow(h.beta1, static_cast<double>(a.t));
  const double bias_correction2 = 1.0 - std::pow(h.beta2, static_cast<double>(a.t));
  c.grad_scale = static_cast<float>(a.grad_scale);
  c.decay = static_cast<float>(1.0 - a.lr * a.weight_decay);
  c.beta1 = static_cast<float>(h.beta1);
  c.one_minus_beta1 = static_cast<float>(1.0 - h.beta1);
  c.beta2 = static_cast<float>(h.beta2);
  c.one_minus_beta2 = static_cast<float>(1.0 - h.beta2);
  c.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  c.eps = static_cast<float>(h.eps);
  c.neg_step_size = static_cast<float>(-(a.lr / bias_correction1));
  return c;
}

int usable_cpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(std::thread::hardware_concurrency());
}

// How many reduced chunks may wait in pinned host memory for their fold (CUDA runs that add
// chunks): as many as the Sharding keeps reductions in flight (BucketSharding: up to 4).
constexpr int kLandingSlots = 4;

// Part of a region's rounded parameters in host memory, and where it goes in the region.
struct Piece {
  at::Tensor host;
  int64_t offset;
};

constexpr ciuic::Option<int64_t> kThreads{
    "threads", "0",
    "CPU threads for the update; 0 = the cores this rank may use (host cores / local ranks)", 0,
    4096};
constexpr ciuic::Option<std::string> kSimd{
    "simd", "\"auto\"", "AdamW kernel: auto (the best this CPU supports), avx512, avx2, scalar",
    NAN,    NAN,        "auto|avx512|avx2|scalar"};
constexpr ciuic::Option<bool> kPinMemory{
    "pin_memory", "true",
    "page-lock the host buffers that copies use on CUDA runs (the gradient shard, the landing "
    "slots of reduced chunks, the upload tiles: asynchronous, faster copies); master and "
    "moments are never pinned, no copy touches them"};
constexpr ciuic::Option<int64_t> kTileSize{
    "tile_size", "4194304", "elements per tile: the unit in which copies and the update overlap",
    4096, 1073741824.0};
constexpr ciuic::Option<std::string> kPipeline{
    "pipeline",
    "\"auto\"",
    "auto: staged copies on CUDA, direct in-memory update on CPU; staged: always stage (tests)",
    NAN,
    NAN,
    "auto|staged"};
constexpr ciuic::Option<std::string> kOverlapUpdate{
    "overlap_update",
    "\"auto\"",
    "auto: update each gradient region while backward goes on, as soon as its last chunk of the "
    "step is folded, whenever that is exact (no gradient clipping, bf16/fp32, [train] nonfinite = "
    "\"stop\"; bit-identical results); off: always update after backward",
    NAN,
    NAN,
    "auto|off"};

struct Run {  // consecutive segments with the same weight-decay flag
  int64_t begin, end;
  bool decay;
};

class CpuAdam final : public ciuic::Optimizer {
 public:
  CpuAdam(const ciuic::Config& cfg, const ciuic::RunContext& ctx) : rank_(ctx.rank) {
    const int64_t threads = cfg.get(kThreads);
    threads_ = static_cast<int>(threads > 0 ? threads : std::max(1, ctx.cpu_threads));
    if (threads_ > usable_cpus())
      ciuic::log_warn(std::string(kWho) + ": " + std::to_string(threads_) + " threads on " +
                      std::to_string(usable_cpus()) +
                      " usable CPUs: the update will be slower than with fewer threads");

    const std::string simd = cfg.get(kSimd);
    if (simd == "auto") {
      simd_ = simd_best();
    } else {
      simd_ = simd == "avx512" ? SimdLevel::kAvx512
              : simd == "avx2" ? SimdLevel::kAvx2
                               : SimdLevel::kScalar;
      if (!simd_supported(simd_)) {
        std::string have = "scalar";
        if (simd_supported(SimdLevel::kAvx2)) have = "avx2, " + have;
        if (simd_supported(SimdLevel::kAvx512)) have = "avx512, " + have;
        cfg.fail(kSimd.key(), std::string("this CPU does not support ") +
                                  (simd_ == SimdLevel::kAvx512 ? "AVX-512 (avx512f + avx512bw)"
                                                               : "AVX2 (avx2 + fma + f16c)") +
                                  "; it supports " + have + " (or use \"auto\")");
      }
    }
    kernel_ = kernel_for(simd_);
    pin_option_ = cfg.get(kPinMemory);
    tile_ = cfg.get(kTileSize);
    force_staged_ = cfg.get(kPipeline) == "staged";
    overlap_ = cfg.get(kOverlapUpdate) != "off";
    const ciuic::kit::AdamHyper h = ciuic::kit::adam_hyper(cfg);
    hyper_.beta1 = h.beta1;
    hyper_.beta2 = h.beta2;
    hyper_.eps = h.eps;
    pool_ = std::make_unique<ciuic::ThreadPool>(threads_);
  }

  void setup(const ciuic::OptimizerSetup& s) override {
    ciuic::check_optimizer_setup(s, kWho);
    const auto t_setup = Clock::now();
    if (fold_) fold_->wait_all();  // a second setup(): nothing of the old shard may still run
    ready_ = false;
    early_ = Early{};
    early_incomplete_ = false;
    early_buf_ = at::Tensor();
    setup_ = s;
    setup_.initial.clear();  // views into the model: not kept
    numel_ = s.numel;
    device_ = s.device;
    param_dtype_ = s.param_dtype;
    precision_ = s.precision;
    staged_ = force_staged_ || !device_.is_cpu();
    pinned_ = pin_option_ && device_.is_cuda();
    one_chunk_ = s.one_chunk_per_step;
    runs_.clear();
    for (const ciuic::ShardSegment& seg : s.segments) {
      if (seg.end == seg.begin) continue;
      if (!runs_.empty() && runs_.back().decay == seg.weight_decay)
        runs_.back().end = seg.end;
      else
        runs_.push_back({seg.begin, seg.end, seg.weight_decay});
    }

    // The state buffers: exactly their size, zero, each page first touched by the thread that
    // will update it (ciuic/kit/host_buffer.h). Master and moments are never copied anywhere, so
    // never page-locked. The gradient shard (fp32; with one chunk a step kept as it comes, in
    // grad_dtype) is page-locked on CUDA runs (pin_memory): a chunk that needs no fold lands in it
    // directly, and the early update leaves its rounded parameters in it for the upload. The other
    // chunks land in a ring of kLandingSlots pinned slots of one region each, and are folded from
    // there: the host holds 16 bytes an element (12 with one bf16 chunk a step) plus the ring.
    master_ = exp_avg_ = exp_avg_sq_ = grad_ = ring_ = at::Tensor();
    master_ = host_empty(numel_, at::kFloat, false, "master weights");
    exp_avg_ = host_empty(numel_, at::kFloat, false, "AdamW first moment");
    exp_avg_sq_ = host_empty(numel_, at::kFloat, false, "AdamW second moment");
    grad_ = host_empty(numel_, one_chunk_ ? s.grad_dtype : at::kFloat, pinned_, "gradient shard");
    slot_numel_ = 0;
    next_slot_ = 0;
    if (staged_ && !one_chunk_) {
      for (const ciuic::ShardRegion& r : s.grad_regions)
        slot_numel_ = std::max(slot_numel_, r.numel);
      ring_ =
          host_empty(kLandingSlots * slot_numel_, s.grad_dtype, pinned_, "gradient landing slots");
    }
    const double buffers_s = seconds_since(t_setup);
    const auto t_master = Clock::now();
    fill_master(s.initial);
    const double master_s = seconds_since(t_master);

    staging_[0] = staging_[1] = at::Tensor();
    copier_.reset();
    if (staged_) {
      const int64_t tile = std::min(tile_, numel_);
      staging_[0] = host_empty(std::max<int64_t>(tile, 1), param_dtype_, pinned_, "upload tile");
      staging_[1] = host_empty(std::max<int64_t>(tile, 1), param_dtype_, pinned_, "upload tile");
      copier_ = std::make_unique<Copier>(device_);
    }
    // Half the rank's cores fold gradients (and run early updates) while backward runs; the rest
    // keep the GPU and the links fed. After backward, early updates still running get them all.
    fold_ =
        std::make_unique<HostAccumulator>(static_cast<int>(s.grad_regions.size()), fold_threads(),
                                          threads_, ring_.defined() ? kLandingSlots : 0);
    ready_ = true;
    ciuic::log_info(std::string(kWho) + ": " + std::to_string(numel_) + " elements, " +
                    gib(memory().host_bytes + memory().device_bytes) + " of host memory" +
                    (pinned_ ? " (" + gib(pinned_bytes()) + " pinned)" : std::string()) + ", " +
                    std::to_string(threads_) + " threads, " + simd_name(simd_) + " kernel, " +
                    (staged_ ? "staged uploads in tiles of " + std::to_string(tile_)
                             : std::string("direct in-memory update")) +
                    "; set up in " + seconds_text(seconds_since(t_setup)) + " (buffers " +
                    seconds_text(buffers_s) + ", master weights " + seconds_text(master_s) + ")");
  }

  bool offer_early_update(const ciuic::OptimizerStep& args) override {
    require_setup("offer_early_update");
    require_no_partial_update("offer_early_update");
    early_ = Early{};
    if (!overlap_) return false;
    if (!std::isfinite(args.grad_scale) || args.grad_scale <= 0 || args.t < 1)
      throw ciuic::Error(std::string(kWho) + ": offer_early_update with grad_scale " +
                         std::to_string(args.grad_scale) + " and t " + std::to_string(args.t) +
                         " (expected a finite grad_scale > 0 and t >= 1)");
    early_.on = true;
    early_.args = args;
    early_.c = coefficients(hyper_, args);
    early_.done.assign(setup_.grad_regions.size(), 0);
    early_.out.assign(setup_.grad_regions.size(), {});  // each element written by its region's task
    early_busy_s_ = 0;
    fold_->set_task_parts(fold_threads());  // backward is about to run
    return true;
  }

  void accumulate_grad(int region, const at::Tensor& chunk, bool first, bool last) override {
    require_setup("accumulate_grad");
    ciuic::check_grad_chunk(setup_, region, chunk, kWho);
    const ciuic::ShardRegion& r = setup_.grad_regions[static_cast<size_t>(region)];
    if (one_chunk_ && !first)
      throw ciuic::Error(std::string(kWho) + ": region " + std::to_string(region) +
                         " received a second gradient chunk in one step, but the setup said one "
                         "chunk a step (OptimizerSetup::one_chunk_per_step)");
    at::Tensor dst = grad_.narrow(0, r.offset, r.numel);
    at::Tensor src = chunk;
    int slot = -1;
    std::unique_ptr<c10::Event> ready;
    if (staged_) {
      // The chunk crosses to pinned memory in its own dtype (bf16 runs: half the bytes), on the
      // current stream; the fold thread waits for the event (a CPU run with pipeline = "staged"
      // copies the same way, synchronously, for the tests). The step's first chunk in the
      // gradient's own dtype lands in the gradient (nothing to add; with one chunk a step, every
      // chunk), once the region's jobs of the previous step have run (its update task may have
      // left parameters there, uploaded before that step() returned). Any other chunk lands in
      // the next landing slot, once the fold that read it last has run.
      if (first && chunk.scalar_type() == grad_.scalar_type()) {
        fold_->wait_free(region);
        src = dst;
      } else {
        if (!ring_.defined())
          throw ciuic::Error(std::string(kWho) + ": a " + c10::toString(chunk.scalar_type()) +
                             " chunk to add to the gradient, but the shard was set up for one " +
                             c10::toString(grad_.scalar_type()) + " chunk a step");
        slot = next_slot_;
        next_slot_ = (next_slot_ + 1) % kLandingSlots;
        fold_->wait_slot(slot);
        src = ring_.narrow(0, slot * slot_numel_, r.numel);
      }
      src.copy_(chunk, /*non_blocking=*/true);
      if (!chunk.is_cpu()) {
        const at::Device dev = chunk.device();
        ready = std::make_unique<c10::Event>(dev.type());
        ready->record(c10::impl::VirtualGuardImpl(dev.type()).getStream(dev));
      }
    }
    fold_->submit(region, dst, src, std::move(ready), first, last, slot);
    if (early_.on && last) submit_early_update(region);
  }

  at::Tensor finish_grads() override {
    require_setup("finish_grads");
    // Backward is over: early updates still queued or running may use the whole team (tasks that
    // already run keep their share).
    if (early_.on) fold_->set_task_parts(threads_);
    const double sum_sq = early_.on ? fold_->wait_folds() : fold_->wait_all();
    const HostAccumulator::Times t = fold_->take_times();
    fold_busy_s_ = t.busy_s;
    fold_blocked_s_ = t.blocked_s;
    return at::full({1}, sum_sq, at::TensorOptions().dtype(at::kDouble));
  }

  void step(const ciuic::OptimizerStep& args, at::Tensor& params_out) override {
    require_setup("step");
    ciuic::check_optimizer_step(setup_, args, params_out, kWho);
    const auto t0 = Clock::now();
    update_s_ = copy_wait_s_ = update_wait_s_ = 0;
    last_early_ = early_.on;
    if (!path_logged_ && rank_ == 0) {
      path_logged_ = true;
      ciuic::log_info(
          std::string(kWho) + ": " +
          (early_.on ? "updating each gradient region as soon as its last chunk is folded, while "
                       "backward goes on (overlap_update = \"auto\")"
           : overlap_
               ? "updating after backward: the core offered no early update (gradient "
                 "clipping, a loss scale that may skip steps, or [train] nonfinite = \"skip\")"
               : "updating after backward (overlap_update = \"off\")"));
    }
    if (early_.on) {
      step_early(args, params_out);
      step_s_ = seconds_since(t0);
      return;
    }
    const Coefficients c = coefficients(hyper_, args);
    const bool fused_rounding = precision_->rounds_to_nearest();
    if (numel_ > 0) {
      if (staged_) {
        step_staged(&c, args.t, params_out);
      } else {
        update(0, numel_, fused_rounding ? params_out.data_ptr() : nullptr, to_dtype(param_dtype_),
               c);
        if (!fused_rounding) {
          at::Tensor out = params_out.view({numel_});
          precision_->round_to_param(master_, out, args.t, ciuic::positions_of(setup_, 0, numel_));
        }
      }
    }
    step_s_ = seconds_since(t0);
  }

  void write_params(at::Tensor& params_out, int64_t t) override {
    require_setup("write_params");
    if (numel_ == 0) return;
    if (staged_) {
      step_staged(nullptr, t, params_out);
    } else {
      at::Tensor out = params_out.view({numel_});
      precision_->round_to_param(master_, out, t, ciuic::positions_of(setup_, 0, numel_));
    }
  }

  std::vector<std::string> state_names() const override {
    return {"master", "exp_avg", "exp_avg_sq"};
  }

  void save_state(ciuic::StateDict& out) const override {
    require_setup("save_state");
    require_no_partial_update("save_state");
    out.emplace_back("master", master_.clone());
    out.emplace_back("exp_avg", exp_avg_.clone());
    out.emplace_back("exp_avg_sq", exp_avg_sq_.clone());
  }

  void load_state(const ciuic::StateDict& in) override {
    require_setup("load_state");
    // All three are checked before any is copied: a bad state leaves this object unchanged.
    const at::Tensor m = ciuic::optimizer_state_tensor(in, "master", numel_, kWho);
    const at::Tensor a = ciuic::optimizer_state_tensor(in, "exp_avg", numel_, kWho);
    const at::Tensor s = ciuic::optimizer_state_tensor(in, "exp_avg_sq", numel_, kWho);
    // A loaded state replaces a partly updated one (an early update whose step was skipped).
    fold_->wait_all();
    early_ = Early{};
    early_incomplete_ = false;
    master_.copy_(m);
    exp_avg_.copy_(a);
    exp_avg_sq_.copy_(s);
  }

  // Element-wise update; every path writes params_out whole from the master weights and reads none
  // of it (step_staged uploads each tile from host staging): zero3's shard, offloaded or not.
  bool accepts_sharded_parameters() const override { return true; }

  ciuic::OptimizerMemory memory() const override {
    uint64_t bytes = 0;
    for (const at::Tensor* t : {&master_, &exp_avg_, &exp_avg_sq_, &grad_, &ring_, &staging_[0],
                                &staging_[1], &early_buf_})
      if (t->defined()) bytes += static_cast<uint64_t>(t->nbytes());
    ciuic::OptimizerMemory mem;
    // On a CPU run the run's "device" is host memory.
    (device_.is_cpu() ? mem.device_bytes : mem.host_bytes) = bytes;
    return mem;
  }

  void append_metrics(ciuic::Metrics& out) const override {
    const ciuic::OptimizerMemory m = memory();
    out.set("optim_host_gib", static_cast<double>(m.host_bytes + m.device_bytes) / (1u << 30));
    out.set("optim_step_s", step_s_);
    out.set("optim_update_s", update_s_);
    out.set("optim_copy_wait_s", copy_wait_s_);
    // Which path the last step's update took (1: regions updated during backward), and, on that
    // path, how long step() waited for updates still running (part of optim_step_s, which is on
    // both paths the update time exposed after backward).
    out.set("optim_update_early", last_early_ ? 1.0 : 0.0);
    out.set("optim_update_wait_s", update_wait_s_);
    out.set("grad_host_fold_s", fold_busy_s_);
    out.set("grad_host_blocked_s", fold_blocked_s_);
  }

 private:
  void require_setup(const char* what) const {
    if (!ready_) throw ciuic::Error(std::string(kWho) + ": " + what + "() called before setup()");
  }

  // After an early update whose step() never came (the step was skipped), master and moments are
  // partly updated: they must be neither saved nor trained on (ciuic/optimizer.h).
  void require_no_partial_update(const char* what) const {
    if (early_incomplete_)
      throw ciuic::Error(std::string(kWho) + ": " + what +
                         "() after an early update whose step() never came (the step was "
                         "skipped): the optimizer state is partly updated; load a checkpoint");
  }

  int fold_threads() const { return std::max(1, threads_ / 2); }

  // The master weights from the model's parameters (`initial`: views on the run's device),
  // widened to fp32. On CUDA with a pinned gradient shard wide enough, the pieces in the
  // parameter dtype cross into it with one asynchronous copy each (the shard is free until the
  // first backward), then ATen widens them into the master with its threads: not a pageable,
  // converting copy per parameter. Otherwise piece by piece.
  void fill_master(const std::vector<ciuic::ShardValues>& initial) {
    const int64_t psize = static_cast<int64_t>(c10::elementSize(param_dtype_));
    bool via_grad =
        device_.is_cuda() && pinned_ && grad_.nbytes() >= static_cast<size_t>(numel_ * psize);
    for (const ciuic::ShardValues& piece : initial)
      via_grad = via_grad && piece.values.device() == device_ &&
                 piece.values.scalar_type() == param_dtype_;
    if (!via_grad) {
      for (const ciuic::ShardValues& piece : initial)  // device -> host, converted to fp32
        master_.narrow(0, piece.shard_offset, piece.values.numel())
            .copy_(piece.values.reshape({-1}));
      return;
    }
    at::Tensor landing = at::empty({0}, at::TensorOptions().dtype(param_dtype_));
    landing.set_(grad_.storage(), grad_.storage_offset() * grad_.element_size() / psize, {numel_},
                 {1});
    for (const ciuic::ShardValues& piece : initial)
      landing.narrow(0, piece.shard_offset, piece.values.numel())
          .copy_(piece.values.reshape({-1}), /*non_blocking=*/true);
    c10::impl::VirtualGuardImpl(device_.type()).getStream(device_).synchronize();
    // Only the pieces' elements: a shard's padding keeps its zeros.
    for (const ciuic::ShardValues& piece : initial) {
      const int64_t n = piece.values.numel();
      master_.narrow(0, piece.shard_offset, n).copy_(landing.narrow(0, piece.shard_offset, n));
    }
  }

  // Bytes of page-locked host memory (CUDA runs with pin_memory): what copies read or write.
  uint64_t pinned_bytes() const {
    if (!pinned_) return 0;
    uint64_t bytes = 0;
    for (const at::Tensor* t : {&grad_, &ring_, &staging_[0], &staging_[1], &early_buf_})
      if (t->defined()) bytes += static_cast<uint64_t>(t->nbytes());
    return bytes;
  }

  // Where region `r`'s rounded parameters wait for step(), as pieces (host source, offset in the
  // region) for the uploads. In the region's own part of the gradient shard when its elements are
  // at least as wide as the parameters': the update task is the last job of the region's step,
  // and nothing writes the region again before the next step's first chunk, which
  // accumulate_grad() copies after wait_free(region) (this task), after step_early() waited for
  // the uploads. The kernel rounds each parameter as it reads the element's gradient, one piece
  // per team member (update_on()), so each piece's parameters start at the start of its own
  // gradient bytes: element i's parameter never lies beyond element i's gradient, and no member
  // overwrites gradient another has yet to read. With equal widths that is one contiguous piece.
  // Otherwise (bf16/fp16 gradients kept as they come, fp32 parameters): a buffer of its own.
  std::vector<Piece> early_out(const ciuic::ShardRegion& r, int parts) {
    std::vector<Piece> out;
    const int64_t psize = static_cast<int64_t>(c10::elementSize(param_dtype_));
    const int64_t gsize = grad_.element_size();
    if (gsize < psize) {
      if (!early_buf_.defined())  // on the fold thread: touched by it alone (the team may be busy)
        early_buf_ = host_empty(numel_, param_dtype_, pinned_, "early-update parameters", false);
      out.push_back({early_buf_.narrow(0, r.offset, r.numel), 0});
      return out;
    }
    const int64_t pieces = gsize == psize ? 1 : parts;
    for (int i = 0; i < pieces; ++i) {
      const auto [b, e] = ciuic::ThreadPool::piece(r.offset, r.offset + r.numel,
                                                   static_cast<int>(pieces), i, kAlign);
      if (b == e) continue;
      at::Tensor v = at::empty({0}, at::TensorOptions().dtype(param_dtype_));
      // Byte (b * gsize) of the gradient's storage, as an element index of the parameter dtype.
      v.set_(grad_.storage(), (grad_.storage_offset() + b) * gsize / psize, {e - b}, {1});
      out.push_back({v, b - r.offset});
    }
    return out;
  }

  // Queues the update of `region` (its last chunk of the step has just been submitted to the
  // fold): it runs on the fold thread after that fold, with the offered step's coefficients.
  void submit_early_update(int region) {
    const auto i = static_cast<size_t>(region);
    if (early_.done.at(i))
      throw ciuic::Error(std::string(kWho) + ": region " + std::to_string(region) +
                         " received a second last chunk in one step");
    const ciuic::ShardRegion r = setup_.grad_regions[i];
    early_.done[i] = 1;
    early_.order.push_back(region);
    early_incomplete_ = true;
    const Coefficients c = early_.c;
    const int64_t t = early_.args.t;
    // The pieces depend on the team share the task gets when it starts: it records them in
    // early_.out[i], which step_early() reads after wait_free(region).
    fold_->submit_task(region, [this, r, i, c, t](ciuic::ThreadPool& team, int parts) {
      const auto t0 = Clock::now();
      std::vector<Piece> out = early_out(r, parts);
      if (r.numel > 0) {
        const bool fused_rounding = precision_->rounds_to_nearest();
        const Dtype od = to_dtype(param_dtype_);
        // Piece k of the update writes at out[k] (update_on() splits as early_out() did).
        const int64_t pitch = out.size() > 1 ? grad_.element_size() : dtype_size(od);
        update_on(team, parts, r.offset, r.offset + r.numel,
                  fused_rounding ? out.front().host.data_ptr() : nullptr, od, c, pitch);
        if (!fused_rounding)  // after the whole region's update: no gradient is read any more
          for (Piece& piece : out) {
            at::Tensor master = master_.narrow(0, r.offset + piece.offset, piece.host.numel());
            precision_->round_to_param(
                master, piece.host, t,
                ciuic::positions_of(setup_, r.offset + piece.offset, piece.host.numel()));
          }
      }
      early_.out[i] = std::move(out);
      early_busy_s_ += seconds_since(t0);  // tasks run one at a time; step() reads it after them
    });
  }

  // step() on the early path. The parameters are written here, after backward, and not by the
  // update tasks: backward reads the model's parameters until it returns. With one rank params_out
  // IS the model's flat buffer, and a region whose gradient is final may still be read by the
  // backward of other buckets (a bucket holds several parameters; nothing in the Sharding protocol
  // promises that no later backward node reads a parameter whose gradient is complete — e.g. one
  // saved by an op that does not differentiate with respect to it); on a GPU a host-issued upload
  // would moreover race with kernels still queued on the compute stream. With ZeRO-2 params_out is
  // a device buffer that exists only during step(), so that it costs no memory while activations
  // are alive. So the tasks leave the rounded parameters in host memory (early_out()), and here,
  // region by region in the order they were updated, we wait for the region's task and upload it
  // (CUDA: on the upload stream, overlapping the updates still running; the current stream then
  // waits for the uploads before the all-gather or the next forward reads the parameters).
  void step_early(const ciuic::OptimizerStep& args, at::Tensor& params_out) {
    const ciuic::OptimizerStep& o = early_.args;
    if (args.lr != o.lr || args.weight_decay != o.weight_decay || args.grad_scale != o.grad_scale ||
        args.t != o.t)
      throw ciuic::Error(std::string(kWho) + ": step() with other arguments (lr " +
                         std::to_string(args.lr) + ", t " + std::to_string(args.t) +
                         ") than offer_early_update() (lr " + std::to_string(o.lr) + ", t " +
                         std::to_string(o.t) + "), whose update has already begun");
    for (size_t i = 0; i < early_.done.size(); ++i)
      if (!early_.done[i])
        throw ciuic::Error(std::string(kWho) + ": region " + std::to_string(i) +
                           " received no last gradient chunk this step");
    at::Tensor out = params_out.view({numel_});
    int64_t last_upload = -1;
    for (int region : early_.order) {
      const auto tw = Clock::now();
      fold_->wait_free(region);  // its fold and its update task have run
      update_wait_s_ += seconds_since(tw);
      const ciuic::ShardRegion& r = setup_.grad_regions[static_cast<size_t>(region)];
      if (r.numel == 0) continue;
      for (const Piece& piece : early_.out[static_cast<size_t>(region)]) {
        at::Tensor dst = out.narrow(0, r.offset + piece.offset, piece.host.numel());
        if (staged_)
          last_upload = copier_->upload(dst, piece.host);
        else
          dst.copy_(piece.host);
      }
    }
    if (staged_) {
      copier_->current_stream_waits_for_uploads();
      // Uploads complete in order. Their sources (the gradient shard, early_buf_) are rewritten by
      // the host (folds, the next update): wait for the last one.
      if (last_upload >= 0) timed_wait(last_upload);
      copier_->reset();
    }
    update_s_ = early_busy_s_;
    early_ = Early{};
    early_incomplete_ = false;
  }

  // n zeros of `dtype` in host memory, page-locked when `pin` (and the run is on CUDA), each page
  // first touched by the update team's thread of its piece.
  at::Tensor host_empty(int64_t n, at::ScalarType dtype, bool pin, const char* what,
                        bool with_team = true) const {
    ciuic::kit::HostBufferOptions o;
    o.pin = pin && device_.is_cuda();
    o.team = with_team ? pool_.get() : nullptr;
    o.align = kAlign;
    return ciuic::kit::host_buffer(n, dtype, o, std::string(kWho) + ": " + what);
  }

  // AdamW on elements [begin, end) with the whole team, reading the gradient shard in place.
  // `out` points at element `begin` of the output (parameter dtype `od`) or is null (master only).
  void update(int64_t begin, int64_t end, void* out, Dtype od, const Coefficients& c) {
    const auto t0 = Clock::now();
    update_on(*pool_, pool_->size(), begin, end, out, od, c);
    update_s_ += seconds_since(t0);
  }

  // The same on `parts` members of `team` (the others return at once). Each element's result
  // depends only on its inputs and `c`, never on the split.
  // `pitch`: piece k's output starts at out + (its first element - begin) * pitch bytes
  // (dtype_size(od): one contiguous output; larger: each piece at the start of its own gradient
  // bytes, early_out()).
  void update_on(ciuic::ThreadPool& team, int parts, int64_t begin, int64_t end, void* out,
                 Dtype od, const Coefficients& c, int64_t pitch = 0) {
    if (pitch == 0) pitch = dtype_size(od);
    const Dtype gd = to_dtype(grad_.scalar_type());
    const char* grad = static_cast<const char*>(grad_.const_data_ptr()) + begin * dtype_size(gd);
    team.run([&](int i) {
      if (i >= parts) return;
      auto [b, e] = ciuic::ThreadPool::piece(begin, end, parts, i, kAlign);
      const int64_t first = b;
      char* piece_out = out ? static_cast<char*>(out) + (first - begin) * pitch : nullptr;
      auto run = std::upper_bound(runs_.begin(), runs_.end(), b,
                                  [](int64_t x, const Run& r) { return x < r.end; });
      for (; b < e && run != runs_.end(); ++run) {
        const int64_t f = std::min(e, run->end);
        KernelArgs a;
        a.p = master_.data_ptr<float>() + b;
        a.m = exp_avg_.data_ptr<float>() + b;
        a.v = exp_avg_sq_.data_ptr<float>() + b;
        a.grad = grad + (b - begin) * dtype_size(gd);
        a.grad_dtype = gd;
        a.out = piece_out ? piece_out + (b - first) * dtype_size(od) : nullptr;
        a.out_dtype = od;
        a.n = f - b;
        a.c = c;
        a.decay = run->decay ? c.decay : 1.0f;
        kernel_(a);
        b = f;
      }
    });
  }

  void timed_wait(int64_t ticket) {
    const auto t0 = Clock::now();
    copier_->wait(ticket);
    copy_wait_s_ += seconds_since(t0);
  }

  // Tile by tile: update (when `c` is given; else only rounding, for write_params) into staging
  // slot k % 2, then upload the slot to params_out while the next tile is computed.
  void step_staged(const Coefficients* c, int64_t t, at::Tensor& params_out) {
    const Dtype od = to_dtype(param_dtype_);
    const bool fused_rounding = c && precision_->rounds_to_nearest();
    at::Tensor out = params_out.view({numel_});
    int64_t slot_ticket[2] = {-1, -1};
    for (int64_t a = 0, k = 0; a < numel_; a += tile_, ++k) {
      const int64_t b = std::min(numel_, a + tile_);
      const int s = static_cast<int>(k % 2);
      if (slot_ticket[s] >= 0) timed_wait(slot_ticket[s]);
      at::Tensor slot = staging_[s].narrow(0, 0, b - a);
      if (c) update(a, b, fused_rounding ? slot.data_ptr() : nullptr, od, *c);
      if (!fused_rounding) {
        at::Tensor master = master_.narrow(0, a, b - a);
        precision_->round_to_param(master, slot, t, ciuic::positions_of(setup_, a, b - a));
      }
      slot_ticket[s] = copier_->upload(out.narrow(0, a, b - a), slot);
    }
    copier_->current_stream_waits_for_uploads();
    // The staging slots are rewritten by the next step: their uploads must be over by then.
    for (int64_t ticket : slot_ticket)
      if (ticket >= 0) timed_wait(ticket);
    copier_->reset();
  }

  // Options.
  int rank_ = 0;
  int threads_ = 1;
  SimdLevel simd_ = SimdLevel::kScalar;
  KernelFn kernel_ = nullptr;
  bool pin_option_ = true;
  int64_t tile_ = 1 << 22;
  bool force_staged_ = false;
  bool overlap_ = true;  // overlap_update != "off": accept early updates
  Hyper hyper_;
  std::unique_ptr<ciuic::ThreadPool> pool_;

  // Set by setup().
  bool ready_ = false;
  ciuic::OptimizerSetup setup_;  // without `initial`
  int64_t numel_ = 0;
  c10::Device device_{c10::kCPU};
  at::ScalarType param_dtype_ = at::kFloat;
  const ciuic::Precision* precision_ = nullptr;
  bool staged_ = false;
  bool pinned_ = false;     // pin_memory on a CUDA run: the buffers copies use are page-locked
  bool one_chunk_ = false;  // OptimizerSetup::one_chunk_per_step: the gradient is kept as it comes
  std::vector<Run> runs_;
  at::Tensor master_, exp_avg_, exp_avg_sq_;  // fp32, host
  at::Tensor
      grad_;  // host: the gradient shard (fp32; one chunk a step: grad_dtype); pinned on CUDA
  at::Tensor ring_;  // staged (CUDA), unless one chunk a step: kLandingSlots slots of slot_numel_
  int64_t slot_numel_ = 0;  // the largest gradient region
  int next_slot_ = 0;
  at::Tensor staging_[2];  // staged: parameter tiles (param dtype)
  std::unique_ptr<Copier> copier_;

  // The early update of the current step (offer_early_update() .. step()).
  struct Early {
    bool on = false;  // this step's offer was accepted
    ciuic::OptimizerStep args;
    Coefficients c;
    std::vector<char> done;  // per region: its update was queued
    std::vector<int> order;  // regions in the order their updates were queued
    std::vector<std::vector<Piece>>
        out;  // per region: its rounded parameters until step() (early_out())
  };
  Early early_;
  bool early_incomplete_ = false;  // updates were queued and step() has not finished them
  at::Tensor early_buf_;           // early_out() when the gradient cannot hold parameters
  double early_busy_s_ = 0;        // seconds of this step's update tasks (fold thread)

  // Last step's timings (seconds) and path.
  double step_s_ = 0, update_s_ = 0, copy_wait_s_ = 0, fold_busy_s_ = 0, fold_blocked_s_ = 0;
  double update_wait_s_ = 0;
  bool last_early_ = false;
  bool path_logged_ = false;

  // Last: destroyed first, so its thread has finished the queued tasks (which use the members
  // above) before they go.
  std::unique_ptr<HostAccumulator> fold_;
};

const ciuic::OptionSpec kOptions[] = {kThreads,
                                      kSimd,
                                      kPinMemory,
                                      kTileSize,
                                      kPipeline,
                                      kOverlapUpdate,
                                      ciuic::kit::kAdamBetas,
                                      ciuic::kit::kAdamEps};

// The planner's answer, as setup() allocates (memory() reports the same bytes): master and
// moments; the gradient shard (fp32, or with one chunk a step the chunks' dtype; pinned on GPU
// runs); on GPU runs the landing slots of chunks to fold (unless one chunk a step) and two upload
// tiles; the early update's parameters only where the gradient is narrower than they are.
void plan(const ciuic::Config& cfg, ciuic::PlanContext& p) {
  const double S = static_cast<double>(p.shard_numel > 0 ? p.shard_numel : p.num_parameters);
  const bool host = p.cuda;  // on a CPU run the run's "device" is host memory
  const bool one = p.one_chunk_per_step;
  const std::string pin = host && cfg.get(kPinMemory) ? "pinned, " : "";
  const int grad_bytes = one ? p.grad_bytes : 4;
  p.add("master weights + AdamW moments", !host, S * 12, "fp32 x 3 per shard element");
  p.add("gradient shard", !host, S * grad_bytes,
        pin + (one ? "kept as it comes, one chunk a step; chunks land in it"
                   : "fp32: the step's first fp32 chunk lands in it, the others are added"));
  if (host) {
    if (!one) {
      const double slot =
          static_cast<double>(p.grad_chunk_elements > 0 ? p.grad_chunk_elements : p.shard_numel);
      p.add("gradient landing slots", false, kLandingSlots * std::min(S, slot) * p.grad_bytes,
            pin + std::to_string(kLandingSlots) + " reduced chunks waiting for their fold");
    }
    p.add("parameter upload tiles", false,
          2.0 * std::min<double>(S, static_cast<double>(cfg.get(kTileSize))) * p.param_bytes,
          pin + "two tiles in flight");
  }
  // The early update leaves its parameters in the gradient shard when its elements are at least
  // as wide (early_out()), else in a buffer of their own.
  if (cfg.get(kOverlapUpdate) != "off" && grad_bytes < p.param_bytes)
    p.add("early-update parameters", !host, S * p.param_bytes,
          pin + "rounded parameters of regions updated during backward, until the step");
}

}  // namespace
}  // namespace ciuic_cpu_adam

CIUIC_DEFINE_PLUGIN_PLANNED(
    ciuic::Slot::kOptimizer, "cpu_adam", "1.0.0",
    "AdamW of the shard in host memory: AVX-512/AVX2 (chosen at run "
    "time), multi-threaded, gradients folded on the host during backward, "
    "uploads overlapped with the update in tiles",
    ciuic_cpu_adam::kOptions,
    [](const ciuic::PluginArgs& a) -> ciuic::PluginObject* {
      return new ciuic_cpu_adam::CpuAdam(a.config, a.context);
    },
    ciuic_cpu_adam::plan)
