// cpu_adam — the offload plugin that keeps the rank's fp32 master weights and AdamW moments in
// host memory and updates them there with a SIMD, multi-threaded AdamW (ZeRO-Offload's CPU Adam).
//
// Data flow of one step on a CUDA run (the "staged" pipeline):
//
//   grad_ready(offset, region)   region --download stream--> host_grad_  (as buckets finish)
//   step():                      the rest of the gradient --download stream--> host_grad_
//     for each tile of tile_size elements:
//       wait for the downloads covering the tile
//       threads: AdamW on master/m/v of the tile, parameters rounded into staging slot k % 2
//       staging slot --upload stream--> params_out tile      (overlaps the next tile's update)
//     the current stream waits for the uploads; the host waits for the last two
//
// wants_host_grad() is true, so a Sharding that honours it (bucket_sharding) accumulates the
// reduced gradient shard in pinned host memory as buckets finish; step() then reads it in place
// and only the parameter uploads remain. The downloads above serve Shardings that keep the
// gradient on the device.
//
// On a CPU run ("direct"): the gradient and params_out are already host memory; the threads read
// the gradient in place and write params_out in the parameter dtype during the update — no copies.
// `pipeline = "staged"` forces the staged path on the CPU (synchronous copies): it exercises the
// same bookkeeping in CPU-only tests.
//
// Threading: the interface is called on the main thread; the update runs on a private team of
// `threads` threads (the main thread included). Work is split into contiguous, 64-element
// aligned pieces, the same split for first touch at setup() and for every step.
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <ciuic/config.h>
#include <ciuic/context.h>
#include <ciuic/error.h>
#include <ciuic/log.h>
#include <ciuic/offload.h>
#include <ciuic/plugin.h>

#include "adamw_kernel.h"
#include "copier.h"
#include <ciuic/thread_pool.h>

namespace ciuic_cpu_adam {
namespace {

constexpr const char* kWho = "offload cpu_adam";
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

std::string gib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / (1u << 30));
  return buf;
}

// The coefficients of step t, rounded to fp32 the way torch::optim::AdamW's scalars are.
Coefficients coefficients(const ciuic::AdamWHyper& h, double grad_scale, int64_t t) {
  Coefficients c;
  const double bias_correction1 = 1.0 - std::pow(h.beta1, static_cast<double>(t));
  const double bias_correction2 = 1.0 - std::pow(h.beta2, static_cast<double>(t));
  c.grad_scale = static_cast<float>(grad_scale);
  c.decay = static_cast<float>(1.0 - h.lr * h.weight_decay);
  c.beta1 = static_cast<float>(h.beta1);
  c.one_minus_beta1 = static_cast<float>(1.0 - h.beta1);
  c.beta2 = static_cast<float>(h.beta2);
  c.one_minus_beta2 = static_cast<float>(1.0 - h.beta2);
  c.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  c.eps = static_cast<float>(h.eps);
  c.neg_step_size = static_cast<float>(-(h.lr / bias_correction1));
  return c;
}

int usable_cpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(std::thread::hardware_concurrency());
}

struct Run {  // consecutive segments with the same weight-decay flag
  int64_t begin, end;
  bool decay;
};

class CpuAdam final : public ciuic::Offload {
 public:
  CpuAdam(const ciuic::Config& cfg, const ciuic::RunContext& ctx) {
    const int64_t threads = cfg.get_int("threads");
    threads_ = static_cast<int>(threads > 0 ? threads : std::max(1, ctx.cpu_threads));
    if (threads_ > usable_cpus())
      ciuic::log_warn(std::string(kWho) + ": " + std::to_string(threads_) +
                      " threads on " + std::to_string(usable_cpus()) +
                      " usable CPUs: the update will be slower than with fewer threads");

    const std::string simd = cfg.get_string("simd");
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
        cfg.fail("simd", std::string("this CPU does not support ") +
                             (simd_ == SimdLevel::kAvx512 ? "AVX-512 (avx512f + avx512bw)"
                                                          : "AVX2 (avx2 + fma + f16c)") +
                             "; it supports " + have + " (or use \"auto\")");
      }
    }
    kernel_ = kernel_for(simd_);
    pin_option_ = cfg.get_bool("pin_memory");
    tile_ = cfg.get_int("tile_size");
    force_staged_ = cfg.get_string("pipeline") == "staged";
    pool_ = std::make_unique<ciuic::ThreadPool>(threads_);
  }

  void setup(const ciuic::OffloadSetup& s) override {
    ciuic::check_offload_setup(s, kWho);
    ready_ = false;
    numel_ = s.numel;
    device_ = s.device;
    param_dtype_ = s.param_dtype;
    staged_ = force_staged_ || !device_.is_cpu();
    pinned_ = pin_option_ && device_.is_cuda();
    runs_.clear();
    for (const ciuic::ShardSegment& seg : s.segments) {
      if (seg.end == seg.begin) continue;
      if (!runs_.empty() && runs_.back().decay == seg.weight_decay)
        runs_.back().end = seg.end;
      else
        runs_.push_back({seg.begin, seg.end, seg.weight_decay});
    }

    master_ = host_empty(numel_, at::kFloat);
    exp_avg_ = host_empty(numel_, at::kFloat);
    exp_avg_sq_ = host_empty(numel_, at::kFloat);
    at::Tensor init = s.master_init.reshape({numel_});
    if (!init.device().is_cpu() || !init.is_contiguous()) init = init.to(at::kCPU).contiguous();
    const float* src = init.const_data_ptr<float>();
    float* p = master_.data_ptr<float>();
    float* m = exp_avg_.data_ptr<float>();
    float* v = exp_avg_sq_.data_ptr<float>();
    // First touch by the thread that will update each piece.
    pool_->run([&](int i) {
      auto [b, e] = ciuic::ThreadPool::piece(0, numel_, pool_->size(), i, kAlign);
      std::memcpy(p + b, src + b, (e - b) * sizeof(float));
      std::memset(m + b, 0, (e - b) * sizeof(float));
      std::memset(v + b, 0, (e - b) * sizeof(float));
    });

    host_grad_ = at::Tensor();
    staging_[0] = staging_[1] = at::Tensor();
    copier_.reset();
    pending_.clear();
    if (staged_) {
      const int64_t tile = std::min(tile_, numel_);
      staging_[0] = host_empty(tile, param_dtype_);
      staging_[1] = host_empty(tile, param_dtype_);
      copier_ = std::make_unique<Copier>(device_);
    }
    ready_ = true;
    ciuic::log_info(std::string(kWho) + ": " + std::to_string(numel_) + " elements, " +
                    gib(memory().host_bytes) + (pinned_ ? " of pinned" : " of") +
                    " host memory, " + std::to_string(threads_) + " threads, " +
                    simd_name(simd_) + " kernel, " +
                    (staged_ ? "staged copies in tiles of " + std::to_string(tile_)
                             : std::string("direct in-memory update")));
  }

  // On CUDA runs the Sharding then keeps the reduced gradient shard in pinned host memory, so
  // no gradient crosses PCIe inside step().
  bool wants_host_grad() const override { return true; }

  void grad_ready(int64_t offset, const at::Tensor& region) override {
    require_setup("grad_ready");
    // Read in place by step(): a CPU run, or a host-memory gradient (wants_host_grad()).
    if (!staged_ || (region.defined() && region.is_cpu() && !device_.is_cpu())) return;
    if (!region.defined() || region.device() != device_ || !region.is_contiguous() ||
        offset < 0 || offset + region.numel() > numel_ ||
        (region.scalar_type() != at::kFloat && region.scalar_type() != at::kBFloat16 &&
         region.scalar_type() != at::kHalf))
      throw ciuic::Error(std::string(kWho) + ": grad_ready(" + std::to_string(offset) +
                         ", region) needs a contiguous fp32/bf16/fp16 region on " +
                         device_.str() + " inside [0, " + std::to_string(numel_) + ")");
    const int64_t n = region.numel();
    if (n == 0) return;
    // A region overlapping one already announced starts a new step: the previous step was
    // skipped (overflow), so its downloads are stale.
    for (const Pending& p : pending_)
      if (p.begin < offset + n && offset < p.end) {
        drop_pending();
        break;
      }
    ensure_host_grad(region.scalar_type());
    const int64_t ticket =
        copier_->download(host_grad_.narrow(0, offset, n), region.reshape({n}));
    pending_.push_back({offset, offset + n, ticket});
  }

  void step(const at::Tensor& grad, double grad_scale, const ciuic::AdamWHyper& h, int64_t t,
            at::Tensor& params_out) override {
    require_setup("step");
    ciuic::check_offload_step(numel_, device_, param_dtype_, grad, grad_scale, t, params_out,
                              kWho);
    const auto t0 = Clock::now();
    update_s_ = copy_wait_s_ = 0;
    const Coefficients c = coefficients(h, grad_scale, t);
    if (numel_ > 0) {
      if (staged_)
        step_staged(grad, c, params_out);
      else
        update(0, numel_, grad.const_data_ptr(), to_dtype(grad.scalar_type()),
               params_out.data_ptr(), to_dtype(param_dtype_), c);
    }
    step_s_ = seconds_since(t0);
  }

  void save_state(ciuic::StateDict& out) const override {
    require_setup("save_state");
    out.emplace_back("master", master_.clone());
    out.emplace_back("exp_avg", exp_avg_.clone());
    out.emplace_back("exp_avg_sq", exp_avg_sq_.clone());
  }

  void load_state(const ciuic::StateDict& in) override {
    require_setup("load_state");
    // All three are checked before any is copied: a bad state leaves this object unchanged.
    const at::Tensor m = ciuic::offload_state_tensor(in, "master", numel_, kWho);
    const at::Tensor a = ciuic::offload_state_tensor(in, "exp_avg", numel_, kWho);
    const at::Tensor s = ciuic::offload_state_tensor(in, "exp_avg_sq", numel_, kWho);
    master_.copy_(m);
    exp_avg_.copy_(a);
    exp_avg_sq_.copy_(s);
  }

  ciuic::OffloadMemory memory() const override {
    ciuic::OffloadMemory mem;
    for (const at::Tensor* t : {&master_, &exp_avg_, &exp_avg_sq_, &host_grad_, &staging_[0],
                                &staging_[1]})
      if (t->defined()) mem.host_bytes += static_cast<uint64_t>(t->nbytes());
    return mem;
  }

  void append_metrics(ciuic::Metrics& out) const override {
    out.set("offload_host_gib", static_cast<double>(memory().host_bytes) / (1u << 30));
    out.set("offload_step_s", step_s_);
    out.set("offload_update_s", update_s_);
    out.set("offload_copy_wait_s", copy_wait_s_);
  }

 private:
  struct Pending {
    int64_t begin, end, ticket;
  };

  void require_setup(const char* what) const {
    if (!ready_) throw ciuic::Error(std::string(kWho) + ": " + what + "() called before setup()");
  }

  at::Tensor host_empty(int64_t n, at::ScalarType dtype) const {
    const auto opts = at::TensorOptions().dtype(dtype).device(at::kCPU).pinned_memory(pinned_);
    try {
      return at::empty({n}, opts);
    } catch (const std::exception& e) {
      const uint64_t bytes = static_cast<uint64_t>(n) * c10::elementSize(dtype);
      throw ciuic::Error(std::string(kWho) + ": could not allocate " + std::to_string(bytes) +
                         " bytes (" + gib(bytes) + ") of " + (pinned_ ? "pinned " : "") +
                         "host memory" + (pinned_ ? " (try pin_memory = false)" : "") + ": " +
                         e.what());
    }
  }

  void ensure_host_grad(at::ScalarType dtype) {
    if (host_grad_.defined() && host_grad_.scalar_type() == dtype) return;
    if (!pending_.empty())
      throw ciuic::Error(std::string(kWho) + ": gradient regions of one step must share a dtype (" +
                         c10::toString(host_grad_.scalar_type()) + " then " +
                         c10::toString(dtype) + ")");
    host_grad_ = at::Tensor();
    host_grad_ = host_empty(numel_, dtype);
  }

  void drop_pending() {
    for (const Pending& p : pending_) copier_->wait(p.ticket);
    pending_.clear();
    copier_->reset();
  }

  // AdamW on elements [begin, end) with the whole team. `grad` and `out` point at element
  // `begin` of their arrays; out may be null.
  void update(int64_t begin, int64_t end, const void* grad, Dtype gd, void* out, Dtype od,
              const Coefficients& c) {
    const auto t0 = Clock::now();
    const int parts = pool_->size();
    pool_->run([&](int i) {
      auto [b, e] = ciuic::ThreadPool::piece(begin, end, parts, i, kAlign);
      auto run = std::upper_bound(runs_.begin(), runs_.end(), b,
                                  [](int64_t x, const Run& r) { return x < r.end; });
      for (; b < e && run != runs_.end(); ++run) {
        const int64_t f = std::min(e, run->end);
        KernelArgs a;
        a.p = master_.data_ptr<float>() + b;
        a.m = exp_avg_.data_ptr<float>() + b;
        a.v = exp_avg_sq_.data_ptr<float>() + b;
        a.grad = static_cast<const char*>(grad) + (b - begin) * dtype_size(gd);
        a.grad_dtype = gd;
        a.out = out ? static_cast<char*>(out) + (b - begin) * dtype_size(od) : nullptr;
        a.out_dtype = od;
        a.n = f - b;
        a.c = c;
        a.decay = run->decay ? c.decay : 1.0f;
        kernel_(a);
        b = f;
      }
    });
    update_s_ += seconds_since(t0);
  }

  void timed_wait(int64_t ticket) {
    const auto t0 = Clock::now();
    copier_->wait(ticket);
    copy_wait_s_ += seconds_since(t0);
  }

  void step_staged(const at::Tensor& grad, const Coefficients& c, at::Tensor& params_out) {
    const Dtype gd = to_dtype(grad.scalar_type());
    const Dtype od = to_dtype(param_dtype_);
    const char* hg = nullptr;
    if (grad.is_cpu() && !device_.is_cpu()) {
      // Already in host memory (wants_host_grad()): nothing to download.
      drop_pending();
      hg = static_cast<const char*>(grad.const_data_ptr());
    } else {
      download_rest(grad);
      hg = static_cast<const char*>(host_grad_.const_data_ptr());
    }
    at::Tensor out = params_out.view({numel_});
    int64_t slot_ticket[2] = {-1, -1};
    size_t j = 0;
    for (int64_t a = 0, k = 0; a < numel_; a += tile_, ++k) {
      const int64_t b = std::min(numel_, a + tile_);
      for (; j < pending_.size() && pending_[j].begin < b; ++j) {
        timed_wait(pending_[j].ticket);
        if (pending_[j].end > b) break;  // also covers the next tile; already complete
      }
      const int s = static_cast<int>(k % 2);
      if (slot_ticket[s] >= 0) timed_wait(slot_ticket[s]);
      update(a, b, hg + a * dtype_size(gd), gd, staging_[s].data_ptr(), od, c);
      slot_ticket[s] = copier_->upload(out.narrow(0, a, b - a), staging_[s].narrow(0, 0, b - a));
    }
    copier_->current_stream_waits_for_uploads();
    // The staging slots are rewritten by the next step: their uploads must be over by then.
    for (int64_t ticket : slot_ticket)
      if (ticket >= 0) timed_wait(ticket);
    pending_.clear();
    copier_->reset();
  }

  // Enqueues the downloads of what grad_ready() did not announce, a tile at a time; pending_
  // then covers [0, numel) in order.
  void download_rest(const at::Tensor& grad) {
    ensure_host_grad(grad.scalar_type());
    const at::Tensor g = grad.reshape({numel_});
    // Download what grad_ready() did not announce, a tile at a time.
    std::sort(pending_.begin(), pending_.end(),
              [](const Pending& a, const Pending& b) { return a.begin < b.begin; });
    std::vector<Pending> all;
    int64_t pos = 0;
    auto fill = [&](int64_t from, int64_t to) {
      for (int64_t a = from; a < to; a += tile_) {
        const int64_t n = std::min(tile_, to - a);
        all.push_back({a, a + n, copier_->download(host_grad_.narrow(0, a, n), g.narrow(0, a, n))});
      }
    };
    for (const Pending& p : pending_) {
      fill(pos, p.begin);
      all.push_back(p);
      pos = p.end;
    }
    fill(pos, numel_);
    pending_ = std::move(all);
  }

  // Options.
  int threads_ = 1;
  SimdLevel simd_ = SimdLevel::kScalar;
  KernelFn kernel_ = nullptr;
  bool pin_option_ = true;
  int64_t tile_ = 1 << 22;
  bool force_staged_ = false;
  std::unique_ptr<ciuic::ThreadPool> pool_;

  // Set by setup().
  bool ready_ = false;
  int64_t numel_ = 0;
  c10::Device device_{c10::kCPU};
  at::ScalarType param_dtype_ = at::kFloat;
  bool staged_ = false;
  bool pinned_ = false;
  std::vector<Run> runs_;
  at::Tensor master_, exp_avg_, exp_avg_sq_;  // fp32, host
  at::Tensor host_grad_;                      // staged: the downloaded gradient (grad dtype)
  at::Tensor staging_[2];                     // staged: parameter tiles (param dtype)
  std::unique_ptr<Copier> copier_;
  std::vector<Pending> pending_;  // downloads enqueued for this step

  // Last step's timings (seconds).
  double step_s_ = 0, update_s_ = 0, copy_wait_s_ = 0;
};

const ciuic::OptionSpec kOptions[] = {
    {"threads", ciuic::OptionType::kInt, "0",
     "CPU threads for the update; 0 = the cores this rank may use (host cores / local ranks)", 0,
     4096, nullptr},
    {"simd", ciuic::OptionType::kString, "\"auto\"",
     "AdamW kernel: auto (the best this CPU supports), avx512, avx2, scalar", NAN, NAN,
     "auto|avx512|avx2|scalar"},
    {"pin_memory", ciuic::OptionType::kBool, "true",
     "page-locked host buffers on CUDA runs (asynchronous, faster copies)", NAN, NAN, nullptr},
    {"tile_size", ciuic::OptionType::kInt, "4194304",
     "elements per tile: the unit in which copies and the update overlap", 4096, 1073741824.0,
     nullptr},
    {"pipeline", ciuic::OptionType::kString, "\"auto\"",
     "auto: staged copies on CUDA, direct in-memory update on CPU; staged: always stage (tests)",
     NAN, NAN, "auto|staged"},
};

}  // namespace
}  // namespace ciuic_cpu_adam

CIUIC_DEFINE_PLUGIN(ciuic::Slot::kOffload, "cpu_adam", "1.0.0",
                    "AdamW of the shard in host memory: AVX-512/AVX2 (chosen at run time), "
                    "multi-threaded, copies overlapped with the update in tiles",
                    ciuic_cpu_adam::kOptions,
                    [](const ciuic::PluginArgs& a) -> ciuic::PluginObject* {
                      return new ciuic_cpu_adam::CpuAdam(a.config, a.context);
                    })
