// FlatBuckets: the flat, bucketed parameter layout and gradient-readiness hooks shared by the
// sharding plugins (see ciuic/kit/flat_buckets.h for the contract).
#include <ciuic/kit/flat_buckets.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <thread>

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <ciuic/comm.h>
#include <ciuic/error.h>
#include <ciuic/kit/host_buffer.h>
#include <ciuic/thread_pool.h>

namespace ciuic::kit {

// ---- readiness tracking ---------------------------------------------------------------------
struct FlatBuckets::HookState {
  std::mutex mu;
  bool armed = false;
  std::vector<char> armed_bucket;  // per bucket, this pass (all 1 when armed as a whole)
  std::vector<char> fired;         // per parameter, this pass
  std::vector<int> remaining;      // per bucket, members not yet fired
  std::vector<char> ready;         // per bucket
  int next = 0;                    // next bucket to deliver
  std::function<void(int)> on_ready;
  const FlatBuckets* owner = nullptr;

  void reset() {
    std::fill(fired.begin(), fired.end(), 0);
    for (size_t b = 0; b < remaining.size(); ++b)
      remaining[b] = static_cast<int>(owner->buckets_[b].members.size());
    std::fill(ready.begin(), ready.end(), 0);
    next = 0;
  }

  // Delivers the ready buckets from `next` on; buckets not armed in this pass are passed over.
  void deliver_in_order() {
    const int n = static_cast<int>(ready.size());
    while (next < n && (ready[next] || !armed_bucket[next])) {
      if (armed_bucket[next]) on_ready(next);
      ++next;
    }
  }

  void fire(int param_index) {
    std::lock_guard<std::mutex> lock(mu);
    if (!armed) return;
    const int b = owner->param_bucket_[param_index];
    if (!armed_bucket[b]) return;  // accumulates in param.grad this pass
    if (fired[param_index]) {
      if (b < next)
        throw Error("sharding: parameter " + owner->params_[param_index].name +
                    " received a gradient after its bucket was already reduced (is it used "
                    "twice under activation checkpointing?)");
      return;
    }
    fired[param_index] = 1;
    if (--remaining[b] == 0) {
      ready[b] = 1;
      deliver_in_order();
    }
  }
};

namespace {
class ReadyHook final : public torch::autograd::PostAccumulateGradHook {
 public:
  ReadyHook(std::weak_ptr<void> state, void (*fire)(void*, int), int index)
      : state_(std::move(state)), fire_(fire), index_(index) {}
  void operator()(const torch::autograd::Variable&) override {
    if (auto s = state_.lock()) fire_(s.get(), index_);
  }

 private:
  std::weak_ptr<void> state_;
  void (*fire_)(void*, int);
  int index_;
};
}  // namespace

// ---- layout -----------------------------------------------------------------------------------
FlatBuckets::FlatBuckets(std::vector<ShardingParam> params, const Options& options)
    : params_(std::move(params)), options_(options) {
  if (params_.empty()) throw Error("sharding: the model has no parameters");
  if (options_.bucket_elements < 1 || options_.pad_multiple < 1 || options_.align_elements < 1)
    throw Error("sharding: invalid bucket options");
  const auto dtype = params_[0].tensor.scalar_type();
  const auto device = params_[0].tensor.device();
  for (const auto& p : params_) {
    if (p.tensor.scalar_type() != dtype || p.tensor.device() != device)
      throw Error("sharding: parameter " + p.name + " is " +
                  std::string(c10::toString(p.tensor.scalar_type())) + " on " +
                  p.tensor.device().str() + " but the first parameter is " +
                  std::string(c10::toString(dtype)) + " on " + device.str() +
                  "; all parameters must share dtype and device");
    if (!p.tensor.requires_grad())
      throw Error("sharding: parameter " + p.name + " does not require grad");
  }

  // Reverse forward order: the order in which backward finishes gradients.
  param_bucket_.assign(params_.size(), -1);
  Bucket cur;
  auto close = [&] {
    if (cur.members.empty()) return;
    const int64_t unit = options_.pad_multiple * options_.align_elements;
    cur.numel = (cur.used + unit - 1) / unit * unit;
    buckets_.push_back(std::move(cur));
    cur = Bucket{};
  };
  for (int i = static_cast<int>(params_.size()) - 1; i >= 0; --i) {
    const int64_t n = params_[i].tensor.numel();
    if (!cur.members.empty() && cur.used + n > options_.bucket_elements) close();
    cur.members.push_back(Member{i, cur.used, n});
    cur.used += n;
    param_bucket_[i] = static_cast<int>(buckets_.size());
  }
  close();

  int64_t offset = 0, shard_offset = 0;
  for (auto& b : buckets_) {
    b.offset = offset;
    offset += b.numel;
    shard_offsets_.push_back(shard_offset);
    shard_offset += b.numel / options_.pad_multiple;
  }

  c10::NoGradGuard no_grad;
  const auto opts = at::TensorOptions().dtype(dtype).device(device);
  // On an accelerator the flat buffer goes beside the parameters when the device (or its cap)
  // has room for both; else the parameters are parked in host memory first, so that the flat
  // buffer never coexists with a second copy of the model (a 7B model in bf16 is 12.9 GiB: twice
  // that does not fit a 24 GB card).
  bool filled = false;  // parked: flat_ holds the parameters already, padding zero
  if (device.type() != at::kCPU) {
    try {
      flat_ = at::empty({offset}, opts);
    } catch (const c10::OutOfMemoryError&) {
      park_in_host_memory(offset, dtype);
      filled = parked_ = true;
    }
  } else {
    flat_ = at::empty({offset}, opts);
  }
  for (const auto& b : buckets_) {
    for (const auto& m : b.members) {
      auto& p = params_[m.param_index].tensor;
      at::Tensor view = flat_.narrow(0, b.offset + m.offset, m.numel).view(p.sizes());
      if (!filled) view.copy_(p.detach());
      p.set_data(view);
    }
    if (!filled && b.numel > b.used) flat_.narrow(0, b.offset + b.used, b.numel - b.used).zero_();
  }
}

// The parameters, parked: one page-locked host buffer in the flat layout (zero padding), filled by
// one asynchronous copy per parameter and one wait; the parameters become views of it (their
// device memory goes back to the allocator), then the flat buffer is allocated on the device and
// filled by one copy. Each parameter crossed pageable memory on its own before: 11 s each way
// for a 7B model on an H200 (docs/performance.md, "Host memory").
void FlatBuckets::park_in_host_memory(int64_t numel, at::ScalarType dtype) {
  const c10::Device device = params_[0].tensor.device();
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  ciuic::ThreadPool team(static_cast<int>(std::min(16u, std::max(1u, cores / 2))));
  kit::HostBufferOptions ho;
  ho.pin = true;
  ho.team = &team;
  at::Tensor park =
      kit::host_buffer(numel, dtype, ho, "sharding: the parameters parked in host memory");
  c10::impl::VirtualGuardImpl guard(device.type());
  for (const auto& b : buckets_)
    for (const auto& m : b.members)
      park.narrow(0, b.offset + m.offset, m.numel)
          .copy_(params_[m.param_index].tensor.detach().reshape({-1}),
                 /*non_blocking=*/true);
  guard.getStream(device).synchronize();
  for (const auto& b : buckets_)
    for (const auto& m : b.members) {
      auto& p = params_[m.param_index].tensor;
      p.set_data(park.narrow(0, b.offset + m.offset, m.numel).view(p.sizes()));
    }
  flat_ = at::empty({numel}, at::TensorOptions().dtype(dtype).device(device));
  flat_.copy_(park, /*non_blocking=*/true);
  guard.getStream(device).synchronize();  // before `park` goes
}

FlatBuckets::~FlatBuckets() {
  // Hooks hold only weak references to the state; remove them so the parameters do not keep
  // calling into a dead owner.
  if (hooks_)
    for (auto& p : params_) torch::autograd::impl::set_post_acc_grad_hooks(p.tensor, nullptr);
}

int64_t FlatBuckets::used_numel() const {
  int64_t n = 0;
  for (const auto& b : buckets_) n += b.used;
  return n;
}

int64_t FlatBuckets::shard_numel() const {
  int64_t n = 0;
  for (const auto& b : buckets_) n += b.numel / options_.pad_multiple;
  return n;
}

// ---- hooks ------------------------------------------------------------------------------------
void FlatBuckets::install_hooks(std::function<void(int)> on_ready) {
  hooks_ = std::make_shared<HookState>();
  hooks_->owner = this;
  hooks_->on_ready = std::move(on_ready);
  hooks_->fired.assign(params_.size(), 0);
  hooks_->remaining.assign(buckets_.size(), 0);
  hooks_->ready.assign(buckets_.size(), 0);
  hooks_->armed_bucket.assign(buckets_.size(), 0);
  hooks_->reset();
  std::weak_ptr<void> weak = std::static_pointer_cast<void>(hooks_);
  auto fire = [](void* s, int i) { static_cast<HookState*>(s)->fire(i); };
  for (size_t i = 0; i < params_.size(); ++i)
    torch::autograd::impl::set_post_acc_grad_hooks(
        params_[i].tensor, std::make_unique<ReadyHook>(weak, fire, static_cast<int>(i)));
}

void FlatBuckets::arm(bool armed) { arm(std::vector<char>(buckets_.size(), armed ? 1 : 0)); }

void FlatBuckets::arm(const std::vector<char>& armed) {
  if (!hooks_) throw Error("sharding: FlatBuckets::arm before install_hooks");
  if (armed.size() != buckets_.size())
    throw Error("sharding: FlatBuckets::arm with " + std::to_string(armed.size()) + " flags for " +
                std::to_string(buckets_.size()) + " buckets");
  std::lock_guard<std::mutex> lock(hooks_->mu);
  hooks_->armed = std::find(armed.begin(), armed.end(), 1) != armed.end();
  hooks_->armed_bucket = armed;
  hooks_->reset();
}

int FlatBuckets::flush() {
  if (!hooks_) return 0;
  std::lock_guard<std::mutex> lock(hooks_->mu);
  if (!hooks_->armed) return 0;
  int n = 0;
  for (; hooks_->next < static_cast<int>(buckets_.size()); ++hooks_->next)
    if (hooks_->armed_bucket[hooks_->next]) {
      hooks_->on_ready(hooks_->next);
      ++n;
    }
  hooks_->armed = false;
  return n;
}

at::Tensor FlatBuckets::pack_grads(int bucket, at::ScalarType dtype, bool release) {
  const Bucket& b = buckets_.at(bucket);
  at::Tensor out = at::empty({b.numel}, flat_.options().dtype(dtype));
  for (const auto& m : b.members) {
    auto& p = params_[m.param_index].tensor;
    at::Tensor dst = out.narrow(0, m.offset, m.numel);
    const at::Tensor& g = p.grad();
    if (g.defined())
      dst.copy_(g.reshape({-1}));
    else
      dst.zero_();
    if (release) p.mutable_grad().reset();
  }
  if (b.numel > b.used) out.narrow(0, b.used, b.numel - b.used).zero_();
  return out;
}

// ---- shard views ------------------------------------------------------------------------------
std::vector<ShardSegment> FlatBuckets::shard_segments(int64_t chunk_index) const {
  std::vector<ShardSegment> out;
  auto push = [&](int64_t begin, int64_t end, bool decay) {
    if (end <= begin) return;
    if (!out.empty() && out.back().end == begin && out.back().weight_decay == decay)
      out.back().end = end;
    else
      out.push_back(ShardSegment{begin, end, decay});
  };
  for (size_t bi = 0; bi < buckets_.size(); ++bi) {
    const Bucket& b = buckets_[bi];
    const int64_t ch = b.numel / options_.pad_multiple;
    const int64_t lo = chunk_index * ch, hi = lo + ch;
    const int64_t base = shard_offsets_[bi] - lo;  // bucket coordinate -> shard coordinate
    int64_t pos = lo;
    for (const auto& m : b.members) {
      const int64_t s = std::max(lo, m.offset), e = std::min(hi, m.offset + m.numel);
      if (s >= e) continue;
      push(base + pos, base + s, false);  // gap (cannot happen inside used range, but be safe)
      push(base + s, base + e, params_[m.param_index].weight_decay);
      pos = e;
    }
    push(base + pos, base + hi, false);  // padding
  }
  return out;
}

std::vector<ShardSlice> FlatBuckets::shard_slices(int64_t chunk_index) const {
  std::vector<ShardSlice> out;
  for (size_t bi = 0; bi < buckets_.size(); ++bi) {
    const Bucket& b = buckets_[bi];
    const int64_t ch = b.numel / options_.pad_multiple;
    const int64_t lo = chunk_index * ch, hi = lo + ch;
    for (const auto& m : b.members) {
      const int64_t s = std::max(lo, m.offset), e = std::min(hi, m.offset + m.numel);
      if (s >= e) continue;
      out.push_back(ShardSlice{params_[m.param_index].name, s - m.offset, e - s,
                               shard_offsets_[bi] + (s - lo)});
    }
  }
  return out;
}

}  // namespace ciuic::kit
