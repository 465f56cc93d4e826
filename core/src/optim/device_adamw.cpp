// The core's default Offload: fused AdamW on the run's device (see device_adamw.h).
#include "optim/device_adamw.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/_fused_adamw.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <ciuic/error.h>

namespace ciuic::optim {

namespace {

constexpr const char* kWho = "device AdamW";

// Largest fp32 scratch used to convert / scale gradients before the fused kernel: 4 MiB on the
// CPU (stays in cache between the conversion and the update), 256 MiB on accelerators (few
// launches, small next to the shard itself).
int64_t scratch_chunk(const c10::Device& d) { return d.is_cpu() ? (int64_t{1} << 20) : (int64_t{1} << 26); }

// Consecutive segments with the same weight-decay flag, merged.
struct Run {
  int64_t begin, end;
  bool decay;
};

class DeviceAdamW final : public Offload {
 public:
  void setup(const OffloadSetup& s) override {
    check_offload_setup(s, kWho);
    numel_ = s.numel;
    device_ = s.device;
    param_dtype_ = s.param_dtype;
    const auto opts = at::TensorOptions().dtype(at::kFloat).device(device_);
    master_ = at::empty({numel_}, opts);
    master_.copy_(s.master_init.reshape({numel_}));
    exp_avg_ = at::zeros({numel_}, opts);
    exp_avg_sq_ = at::zeros({numel_}, opts);
    step_t_ = at::zeros({}, opts);
    scratch_ = at::Tensor();
    runs_.clear();
    for (const ShardSegment& seg : s.segments) {
      if (seg.end == seg.begin) continue;
      if (!runs_.empty() && runs_.back().decay == seg.weight_decay && runs_.back().end == seg.begin)
        runs_.back().end = seg.end;
      else
        runs_.push_back({seg.begin, seg.end, seg.weight_decay});
    }
    ready_ = true;
  }

  void step(const at::Tensor& grad, double grad_scale, const AdamWHyper& h, int64_t t,
            at::Tensor& params_out) override {
    if (!ready_) throw Error(std::string(kWho) + ": step() called before setup()");
    check_offload_step(numel_, device_, param_dtype_, grad, grad_scale, t, params_out, kWho);
    const auto t0 = std::chrono::steady_clock::now();
    step_t_.fill_(static_cast<double>(t));
    const at::Tensor g = grad.reshape({numel_});

    if (grad.scalar_type() == at::kFloat && grad_scale == 1.0 && grad.device() == device_) {
      // The gradient is used as it is: one fused call per weight-decay group.
      Lists decay, no_decay;
      for (const Run& r : runs_)
        pick(r, h, decay, no_decay).add(*this, r.begin, r.end - r.begin, g, r.begin);
      flush(decay, no_decay, h);
    } else {
      // Convert / scale (or bring over from host memory) into the scratch buffer a chunk at a
      // time; each chunk is one fused call per group.
      const int64_t chunk = std::min(numel_, scratch_chunk(device_));
      if (!scratch_.defined() || scratch_.numel() < chunk)
        scratch_ = at::empty({chunk}, at::TensorOptions().dtype(at::kFloat).device(device_));
      Lists decay, no_decay;
      int64_t used = 0;
      for (const Run& r : runs_) {
        for (int64_t b = r.begin; b < r.end;) {
          const int64_t n = std::min(r.end - b, chunk - used);
          at::Tensor piece = scratch_.narrow(0, used, n);
          piece.copy_(g.narrow(0, b, n));
          if (grad_scale != 1.0) piece.mul_(grad_scale);
          pick(r, h, decay, no_decay).add(*this, b, n, scratch_, used);
          used += n;
          b += n;
          if (used == chunk) {
            flush(decay, no_decay, h);
            used = 0;
          }
        }
      }
      flush(decay, no_decay, h);
    }
    params_out.view({numel_}).copy_(master_);
    if (device_.is_cpu())
      last_step_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  void save_state(StateDict& out) const override {
    if (!ready_) throw Error(std::string(kWho) + ": save_state() called before setup()");
    const auto cpu = at::TensorOptions().device(at::kCPU).dtype(at::kFloat);
    out.emplace_back("master", master_.to(cpu, /*non_blocking=*/false, /*copy=*/true));
    out.emplace_back("exp_avg", exp_avg_.to(cpu, false, true));
    out.emplace_back("exp_avg_sq", exp_avg_sq_.to(cpu, false, true));
  }

  void load_state(const StateDict& in) override {
    if (!ready_) throw Error(std::string(kWho) + ": load_state() called before setup()");
    // Check all three before touching any, so a bad state leaves this object unchanged.
    at::Tensor m = offload_state_tensor(in, "master", numel_, kWho);
    at::Tensor a = offload_state_tensor(in, "exp_avg", numel_, kWho);
    at::Tensor s = offload_state_tensor(in, "exp_avg_sq", numel_, kWho);
    master_.copy_(m);
    exp_avg_.copy_(a);
    exp_avg_sq_.copy_(s);
  }

  OffloadMemory memory() const override {
    OffloadMemory m;
    m.device_bytes = static_cast<uint64_t>(3 * numel_) * sizeof(float);
    if (scratch_.defined()) m.device_bytes += static_cast<uint64_t>(scratch_.numel()) * sizeof(float);
    return m;
  }

  void append_metrics(Metrics& out) const override {
    out.set("optim_device_gib", static_cast<double>(memory().device_bytes) / (1 << 30));
    if (device_.is_cpu()) out.set("optim_step_s", last_step_s_);
  }

 private:
  // Tensor lists of one fused call.
  struct Lists {
    std::vector<at::Tensor> p, g, m, v, steps;
    void add(const DeviceAdamW& self, int64_t begin, int64_t n, const at::Tensor& grad,
             int64_t grad_begin) {
      p.push_back(self.master_.narrow(0, begin, n));
      g.push_back(grad.narrow(0, grad_begin, n));
      m.push_back(self.exp_avg_.narrow(0, begin, n));
      v.push_back(self.exp_avg_sq_.narrow(0, begin, n));
      steps.push_back(self.step_t_);
    }
    void clear() { p.clear(), g.clear(), m.clear(), v.clear(), steps.clear(); }
  };

  static void fused(Lists& l, const AdamWHyper& h, double weight_decay) {
    if (l.p.empty()) return;
    at::_fused_adamw_(l.p, l.g, l.m, l.v, /*max_exp_avg_sqs=*/{}, l.steps, h.lr, h.beta1,
                      h.beta2, weight_decay, h.eps, /*amsgrad=*/false, /*maximize=*/false,
                      /*grad_scale=*/std::nullopt, /*found_inf=*/std::nullopt);
    l.clear();
  }

  // Without weight decay every run goes into one list (one fused call).
  static Lists& pick(const Run& r, const AdamWHyper& h, Lists& decay, Lists& no_decay) {
    return r.decay && h.weight_decay != 0.0 ? decay : no_decay;
  }

  static void flush(Lists& decay, Lists& no_decay, const AdamWHyper& h) {
    fused(decay, h, h.weight_decay);
    fused(no_decay, h, 0.0);
  }

  bool ready_ = false;
  int64_t numel_ = 0;
  c10::Device device_{c10::kCPU};
  at::ScalarType param_dtype_ = at::kFloat;
  at::Tensor master_, exp_avg_, exp_avg_sq_, step_t_, scratch_;
  std::vector<Run> runs_;
  double last_step_s_ = 0;
};

}  // namespace

std::unique_ptr<Offload> make_device_adamw() { return std::make_unique<DeviceAdamW>(); }

}  // namespace ciuic::optim
