// BucketSharding: the shared machinery of the ddp and zero2 plugins (ciuic/bucket_sharding.h).
#include <ciuic/bucket_sharding.h>

#include <chrono>
#include <cmath>

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <ciuic/config.h>
#include <ciuic/error.h>

#include "sharding/host_accumulator.h"

namespace ciuic {

BucketSharding::BucketSharding(const Options& options) : options_(options) {}
BucketSharding::~BucketSharding() = default;

BucketSharding::Options BucketSharding::options_from(const Config& config) {
  Options o;
  const double bucket = config.get_float("reduce_bucket_size");
  if (bucket < 1 || bucket != std::floor(bucket))
    config.fail("reduce_bucket_size", "expected a whole number of elements >= 1");
  o.bucket_elements = static_cast<int64_t>(bucket);
  o.overlap_comm = config.get_bool("overlap_comm");
  o.reduce_each_micro_batch = config.get_string("grad_accumulation") == "reduce_each";
  return o;
}

void BucketSharding::setup(const ShardingSetup& s) {
  if (!s.comm || !s.precision || !s.offload)
    throw Error("sharding: setup needs a comm, a precision policy and an offload");
  comm_ = s.comm;
  precision_ = s.precision;
  offload_ = s.offload;
  if (options_.shard_index < 0 || options_.shard_index >= options_.shards)
    throw Error("sharding: shard index out of range");

  FlatBuckets::Options bo;
  bo.bucket_elements = options_.bucket_elements;
  bo.pad_multiple = options_.shards;
  buckets_ = std::make_unique<FlatBuckets>(s.params, bo);
  at::Tensor& flat = buckets_->flat();

  // Every rank starts from rank 0's parameters.
  if (comm_->size() > 1) {
    at::Tensor t = flat.device() == comm_->device() ? flat : flat.to(comm_->device());
    comm_->broadcast(t, 0)->wait();
    if (!t.is_same(flat)) flat.copy_(t);
  }

  const int64_t S = buckets_->shard_numel();
  const auto dev = flat.options();
  // The fp32 master shard is built where the offload keeps it: in host memory for a host
  // optimizer (a 7B shard on 2 ranks is 12.9 GiB: it must not pass through a 24 GB card).
  const bool host_master = flat.is_cuda() && offload_->wants_host_grad();
  at::Tensor master = at::empty({S}, host_master ? at::TensorOptions().dtype(at::kFloat)
                                                 : dev.dtype(at::kFloat));
  {
    c10::NoGradGuard ng;
    for (size_t b = 0; b < buckets_->buckets().size(); ++b) {
      const auto& bk = buckets_->buckets()[b];
      const int64_t ch = bk.numel / options_.shards;
      master.narrow(0, buckets_->shard_offset(static_cast<int>(b)), ch)
          .copy_(flat.narrow(0, bk.offset + options_.shard_index * ch, ch));
    }
  }
  OffloadSetup os;
  os.numel = S;
  os.segments = buckets_->shard_segments(options_.shard_index);
  os.master_init = master;
  os.param_dtype = flat.scalar_type();
  os.device = flat.device();
  offload_->setup(os);

  host_grad_ = offload_->wants_host_grad();
  grad_shard_ = host_grad_ ? at::zeros({S}, at::TensorOptions().dtype(at::kFloat).pinned_memory(flat.is_cuda()))
                           : at::zeros({S}, dev.dtype(at::kFloat));
  host_acc_.reset();
  host_stage_ = at::Tensor();
  if (host_grad_)  // half the rank's cores fold gradients; the rest keep the GPU and comm fed
    host_acc_ = std::make_unique<HostAccumulator>(static_cast<int>(buckets_->buckets().size()),
                                                  std::max(1, at::get_num_threads() / 2));
  if (options_.shards == 1) param_shard_ = flat;
  buckets_->install_hooks([this](int b) { on_bucket_ready(b); });
}

void BucketSharding::begin_micro_batch(int64_t index, bool last) {
  if (!buckets_) throw Error("sharding: begin_micro_batch before setup");
  if (index == 0) {
    // The host path assigns each region on its first contribution: no pass to zero it.
    if (!host_grad_) grad_shard_.zero_();
    micro_batches_ = 0;
    sum_sq_valid_ = !host_grad_;  // the host path takes its squares in the fold
    if (sum_sq_valid_)
      sum_sq_ = at::zeros({1}, at::TensorOptions().dtype(at::kDouble).device(buckets_->flat().device()));
  } else if (options_.reduce_each_micro_batch) {
    buckets_->flush();
    drain();
  }
  ++micro_batches_;
  last_micro_batch_ = last;
  buckets_->arm(options_.reduce_each_micro_batch || last);
}

void BucketSharding::on_bucket_ready(int bucket) {
  if (!options_.overlap_comm) {
    std::lock_guard<std::mutex> l(pending_mu_);
    deferred_.push_back(bucket);
    return;
  }
  launch(bucket);
}

void BucketSharding::launch(int bucket) {
  c10::NoGradGuard ng;
  at::Tensor packed = buckets_->pack_grads(bucket, precision_->reduce_dtype(), /*release=*/true);
  at::Tensor out = reduce_in_place()
                       ? packed
                       : at::empty({packed.numel() / options_.shards}, packed.options());
  std::unique_ptr<Work> work = reduce(packed, out);
  {
    std::lock_guard<std::mutex> l(pending_mu_);
    pending_bytes_ += packed.nbytes() + (out.is_same(packed) ? 0 : out.nbytes());
    peak_pending_bytes_ = std::max(peak_pending_bytes_, pending_bytes_);
    pending_.push_back(Pending{bucket, std::move(work), std::move(packed), std::move(out)});
  }
  retire(kMaxInFlight);
}

void BucketSharding::retire(size_t keep) {
  c10::NoGradGuard ng;
  for (;;) {
    Pending p;
    {
      std::lock_guard<std::mutex> l(pending_mu_);
      if (pending_.empty()) return;
      if (pending_.size() <= keep && !pending_.front().work->is_completed()) return;
      p = std::move(pending_.front());
      pending_.erase(pending_.begin());
      pending_bytes_ -= p.packed.nbytes() + (p.out.is_same(p.packed) ? 0 : p.out.nbytes());
    }
    p.work->wait();
    const int64_t off = buckets_->shard_offset(p.bucket);
    const int64_t n = p.out.numel();
    at::Tensor region = grad_shard_.narrow(0, off, n);
    // The region's first contribution this step (reduce_each: micro-batch 1; no_sync: the only).
    const bool first = !options_.reduce_each_micro_batch || micro_batches_ == 1;
    if (!host_grad_) {
      // The only contribution: its squares count towards the step's norm now.
      if (first && last_micro_batch_) add_squares(p.out);
      else sum_sq_valid_ = false;
      region.add_(p.out);
      continue;
    }
    // Host path: the chunk goes to the host in the reduce dtype; host_acc_'s thread folds it into
    // the fp32 shard (assigning on the first contribution) and, on the last micro-batch, sums the
    // squares of the result. Nothing here waits for the GPU.
    at::Tensor src = p.out;
    std::unique_ptr<c10::Event> ready;
    if (!p.out.is_cpu()) {
      if (!host_stage_.defined() || host_stage_.scalar_type() != p.out.scalar_type())
        host_stage_ = at::empty({grad_shard_.numel()},
                                p.out.options().device(at::kCPU).pinned_memory(true));
      host_acc_->wait_free(p.bucket);  // the previous micro-batch's fold of this region is done
      src = host_stage_.narrow(0, off, n);
      src.copy_(p.out, /*non_blocking=*/true);
      const at::Device dev = p.out.device();
      ready = std::make_unique<c10::Event>(dev.type());
      ready->record(c10::impl::VirtualGuardImpl(dev.type()).getStream(dev));
    }
    host_acc_->submit(p.bucket, region, src, std::move(ready), /*assign=*/first,
                      /*squares=*/last_micro_batch_);
  }
}

void BucketSharding::add_squares(const at::Tensor& reduced) {
  if (!sum_sq_valid_) return;
  sum_sq_.add_(sum_of_squares(reduced));
}

void BucketSharding::drain() {
  std::vector<int> deferred;
  {
    std::lock_guard<std::mutex> l(pending_mu_);
    deferred.swap(deferred_);
  }
  for (int b : deferred) launch(b);
  retire(0);
}

StepResult BucketSharding::step(const StepInput& in) {
  using Clock = std::chrono::steady_clock;
  auto since = [](Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); };
  auto t = Clock::now();
  buckets_->flush();
  drain();
  if (host_acc_) {  // the gradient shard is read next: the folds still queued are exposed time
    host_sum_sq_ = host_acc_->wait_all();
    const HostAccumulator::Times ht = host_acc_->take_times();
    host_busy_s_ = ht.busy_s;
    host_blocked_s_ = ht.blocked_s;
  }
  if (last_micro_batch_ && options_.shards >= 1) {
    const auto& bks = buckets_->buckets();
    for (size_t b = 0; b < bks.size(); ++b) {
      const int64_t off = buckets_->shard_offset(static_cast<int>(b));
      offload_->grad_ready(off, grad_shard_.narrow(0, off, bks[b].numel / options_.shards));
    }
  }
  phase_.drain_s = since(t);

  t = Clock::now();
  const double scale = precision_->loss_scale();
  const bool sharded = options_.shards > 1;
  const GradNorm gn =
      host_acc_ ? global_grad_norm_from_squares(at::full({1}, host_sum_sq_, at::kDouble), *comm_, sharded)
      : sum_sq_valid_ ? global_grad_norm_from_squares(sum_sq_, *comm_, sharded)
                      : global_grad_norm(grad_shard_, *comm_, sharded);
  const bool skip = precision_->update(gn.nonfinite, in.step) || gn.nonfinite;
  StepResult r;
  r.grad_norm = gn.nonfinite ? gn.norm : gn.norm / scale;
  last_grad_norm_ = r.grad_norm;
  phase_.norm_s = since(t);
  phase_.update_s = phase_.publish_s = 0.0;
  if (skip) {
    r.skipped = true;
    return r;
  }
  double coef = 1.0;
  if (in.max_grad_norm > 0 && r.grad_norm > in.max_grad_norm)
    coef = in.max_grad_norm / (r.grad_norm + 1e-6);
  t = Clock::now();
  acquire_param_shard();
  offload_->step(grad_shard_, coef / scale, in.hyper, in.adam_step, param_shard_);
  phase_.update_s = since(t);
  t = Clock::now();
  publish();
  release_param_shard();
  phase_.publish_s = since(t);
  return r;
}

void BucketSharding::acquire_param_shard() {
  if (options_.shards == 1) return;  // the flat buffer itself
  param_shard_ = at::empty({buckets_->shard_numel()}, buckets_->flat().options());
}

void BucketSharding::release_param_shard() {
  if (options_.shards > 1) param_shard_ = at::Tensor();
}

ShardingMemory BucketSharding::memory() const {
  ShardingMemory m;
  if (!buckets_) return m;
  m.param_bytes = buckets_->flat().nbytes();  // + a transient shard-size buffer during step()
  m.grad_bytes = grad_shard_.nbytes() + peak_pending_bytes_;
  const OffloadMemory om = offload_->memory();
  m.optimizer_bytes = om.host_bytes + om.device_bytes;
  m.host_bytes = om.host_bytes;
  if (host_grad_)
    m.host_bytes += grad_shard_.nbytes() + (host_stage_.defined() ? host_stage_.nbytes() : 0);
  return m;
}

std::vector<ShardSlice> BucketSharding::layout() const {
  return buckets_->shard_slices(options_.shard_index);
}

void BucketSharding::save_state(StateDict& out) const { offload_->save_state(out); }

void BucketSharding::load_state(const SliceFetcher& fetch) {
  const int64_t S = buckets_->shard_numel();
  StateDict sd;
  for (const char* name : {"master", "exp_avg", "exp_avg_sq"}) {
    at::Tensor t = at::zeros({S}, at::kFloat);
    for (const ShardSlice& sl : layout()) {
      at::Tensor part = fetch(name, sl.param, sl.param_offset, sl.length);
      if (!part.defined() || part.numel() != sl.length)
        throw Error(std::string("sharding: checkpoint slice of ") + name + " for " + sl.param +
                    " has the wrong size");
      t.narrow(0, sl.shard_offset, sl.length).copy_(part.reshape({-1}));
    }
    sd.emplace_back(name, t);
  }
  offload_->load_state(sd);
  // Parameters follow the loaded master weights.
  c10::NoGradGuard ng;
  acquire_param_shard();
  param_shard_.copy_(state_get(sd, "master").to(param_shard_.device()));
  publish();
  release_param_shard();
}

void BucketSharding::append_metrics(Metrics& out) const {
  const ShardingMemory m = memory();
  out.set("shard_param_gib", m.param_bytes / 1073741824.0);
  out.set("shard_grad_gib", m.grad_bytes / 1073741824.0);
  out.set("shard_optim_gib", m.optimizer_bytes / 1073741824.0);
  if (m.host_bytes) out.set("shard_host_gib", m.host_bytes / 1073741824.0);
  // Host wall time of the last step's phases (see PhaseTimes).
  out.set("step_drain_s", phase_.drain_s);
  out.set("step_norm_s", phase_.norm_s);
  out.set("step_update_s", phase_.update_s);
  out.set("step_publish_s", phase_.publish_s);
  if (host_acc_) {
    out.set("grad_host_fold_s", host_busy_s_);
    out.set("grad_host_blocked_s", host_blocked_s_);
  }
}

}  // namespace ciuic
