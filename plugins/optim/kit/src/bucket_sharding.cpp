// BucketSharding: the shared machinery of the bucketed sharding plugins
// (ciuic/kit/bucket_sharding.h).
#include <ciuic/kit/bucket_sharding.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <unordered_map>

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>

#include <ciuic/config.h>
#include <ciuic/error.h>
#include <ciuic/grad_norm.h>
#include <ciuic/log.h>

namespace ciuic::kit {

BucketSharding::BucketSharding(const Options& options) : options_(options) {}
BucketSharding::~BucketSharding() = default;

BucketSharding::Options BucketSharding::options_from(const Config& config,
                                                     const OptionDecls& decls) {
  Options o;
  const double bucket = config.get(decls.reduce_bucket_size);
  if (bucket < 1 || bucket != std::floor(bucket))
    config.fail(decls.reduce_bucket_size.key(), "expected a whole number of elements >= 1");
  o.bucket_elements = static_cast<int64_t>(bucket);
  o.overlap_comm = config.get(decls.overlap_comm);
  const std::string accumulation = config.get(decls.grad_accumulation);
  if (accumulation != "reduce_each" && accumulation != "no_sync")  // "auto" is the core's to choose
    config.fail(decls.grad_accumulation.key(),
                "expected \"no_sync\" or \"reduce_each\" here (\"auto\" is chosen by "
                "the core's memory planner before the plugin is created)");
  o.reduce_each_micro_batch = accumulation == "reduce_each";
  if (config.has(kLocalAccumulationOption.key())) {
    try {
      o.local_percent = config.get(kLocalAccumulationOption);
    } catch (const UsageError&) {
      throw;
    } catch (const Error&) {  // "auto" is the core's to choose
      config.fail(kLocalAccumulationOption.key(),
                  "expected an integer 0-100 here (\"auto\" is chosen by the core's "
                  "memory planner before the plugin is created)");
    }
  }
  return o;
}

namespace {
// Which buckets accumulate locally: whole buckets in order while their elements stay within
// `percent` of all the buckets' (with reduce_each; none otherwise).
std::vector<char> local_buckets(const std::vector<int64_t>& sizes, int64_t percent) {
  int64_t total = 0, kept = 0;
  for (int64_t n : sizes) total += n;
  std::vector<char> local(sizes.size(), 0);
  for (size_t b = 0; b < sizes.size(); ++b) {
    if ((kept + sizes[b]) * 100 > percent * total) break;
    kept += sizes[b];
    local[b] = 1;
  }
  return local;
}
}  // namespace

void BucketSharding::plan_buckets(const Config& config, const OptionDecls& decls, PlanContext& plan,
                                  int64_t shards, bool chunk_buffers) {
  const Options o = options_from(config, decls);
  const double P = static_cast<double>(plan.num_parameters);
  // Buckets of reduce_bucket_size elements (a larger parameter gets a bucket of its own; the
  // measured peaks are matched by counting buckets of the configured size).
  const double bucket = std::min(P, static_cast<double>(o.bucket_elements));
  const double s = static_cast<double>(shards);
  plan.shard_numel = static_cast<int64_t>(std::ceil(P / s));
  plan.grad_chunk_elements = static_cast<int64_t>(std::ceil(bucket / s));
  plan.add("parameters", true, P * plan.param_bytes,
           std::to_string(plan.num_parameters) + " x " + std::to_string(plan.param_bytes) +
               " bytes, whole on every rank (flat bucketed buffer)");
  // One rank reduces nothing: buckets go to the optimizer in the parameter dtype, and one chunk a
  // step when nothing accumulates across micro-batches in the optimizer.
  const bool alone = plan.world_size == 1 && shards == 1;
  plan.grad_bytes = alone ? plan.param_bytes : plan.reduce_bytes;
  const bool reduce_each = o.reduce_each_micro_batch && o.local_percent < 100;
  plan.one_chunk_per_step = !reduce_each || plan.gradient_accumulation_steps == 1;
  // The reductions retire() keeps in flight, plus the one being packed: the packed bucket in the
  // reduce dtype and, when the reduction has its own output, the chunk.
  const double in_flight = static_cast<double>(kMaxInFlight + 1);
  const double factor = chunk_buffers ? 1.0 + 1.0 / s : 1.0;
  plan.add(alone ? "gradient buckets in flight" : "reductions in flight", true,
           std::min(P, in_flight * bucket) * plan.grad_bytes * (alone ? 1.0 : factor),
           "up to " + std::to_string(kMaxInFlight + 1) + " buckets of " +
               std::to_string(static_cast<int64_t>(bucket)) + " elements");
  const bool keep_all = !reduce_each && plan.gradient_accumulation_steps > 1;
  // Partly local: whole buckets up to the percentage (at most that share of the elements).
  const double local = o.reduce_each_micro_batch && plan.gradient_accumulation_steps > 1
                           ? std::floor(P * static_cast<double>(o.local_percent) / 100.0)
                           : 0.0;
  plan.add("gradients not yet reduced", true, (keep_all ? P : local + bucket) * plan.param_bytes,
           keep_all    ? "no_sync accumulation keeps every parameter's gradient"
           : local > 0 ? std::to_string(o.local_percent) +
                             "% accumulated on the device, and about one bucket"
                       : "about one bucket");
}

void BucketSharding::setup(const ShardingSetup& s) {
  if (!s.comm || !s.precision || !s.optimizer)
    throw Error("sharding: setup needs a comm, a precision policy and an optimizer");
  comm_ = s.comm;
  precision_ = s.precision;
  optimizer_ = s.optimizer;
  if (options_.bucket_elements < 1) throw Error("sharding: bucket size must be >= 1 element");
  if (options_.shard_index < 0 || options_.shard_index >= options_.shards)
    throw Error("sharding: shard index out of range");

  FlatBuckets::Options bo;
  bo.bucket_elements = options_.bucket_elements;
  bo.pad_multiple = options_.shards;
  const auto t0 = std::chrono::steady_clock::now();
  buckets_ = std::make_unique<FlatBuckets>(s.params, bo);
  at::Tensor& flat = buckets_->flat();
  if (buckets_->parked() && comm_->rank() == 0) {
    char line[200];
    std::snprintf(
        line, sizeof line,
        "sharding: the parameters went through page-locked host memory into the flat buffer "
        "(no room on %s for the model twice): %.1f s",
        flat.device().str().c_str(),
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    log_info(line);
  }

  // Every rank starts from rank 0's parameters.
  if (comm_->size() > 1) {
    at::Tensor t = flat.device() == comm_->device() ? flat : flat.to(comm_->device());
    comm_->broadcast(t, 0)->wait();
    if (!t.is_same(flat)) flat.copy_(t);
  }

  // The optimizer builds its master weights from this rank's chunk of every bucket, wherever it
  // keeps them (a host optimizer's 7B shard must not pass through a 24 GB card).
  OptimizerSetup os;
  os.numel = buckets_->shard_numel();
  os.segments = buckets_->shard_segments(options_.shard_index);
  for (size_t b = 0; b < buckets_->buckets().size(); ++b) {
    const auto& bk = buckets_->buckets()[b];
    const int64_t ch = bk.numel / options_.shards;
    const int64_t off = buckets_->shard_offset(static_cast<int>(b));
    os.grad_regions.push_back(ShardRegion{off, ch});
    os.initial.push_back(
        ShardValues{off, flat.narrow(0, bk.offset + options_.shard_index * ch, ch)});
  }
  {
    // Each shard element's position in the model's flat parameter order (padding: -1).
    std::unordered_map<std::string, int64_t> start;
    int64_t at = 0;
    for (const ShardingParam& p : s.params) {
      start.emplace(p.name, at);
      at += p.tensor.numel();
    }
    int64_t next = 0;
    for (const ShardSlice& sl : buckets_->shard_slices(options_.shard_index)) {
      if (sl.shard_offset > next)
        os.positions.push_back(PositionSpan{next, sl.shard_offset - next, -1});
      os.positions.push_back(
          PositionSpan{sl.shard_offset, sl.length, start.at(sl.param) + sl.param_offset});
      next = sl.shard_offset + sl.length;
    }
    if (next < os.numel) os.positions.push_back(PositionSpan{next, os.numel - next, -1});
  }
  os.param_dtype = flat.scalar_type();
  os.device = flat.device();
  os.precision = precision_;
  os.gradient_accumulation_steps = s.gradient_accumulation_steps;
  alone_ = options_.shards == 1 && comm_->size() == 1;
  grad_dtype_ = alone_ ? flat.scalar_type() : precision_->reduce_dtype();
  os.grad_dtype = grad_dtype_;
  {
    std::vector<int64_t> sizes;
    for (const auto& bk : buckets_->buckets()) sizes.push_back(bk.used);
    local_ = options_.reduce_each_micro_batch && s.gradient_accumulation_steps > 1
                 ? local_buckets(sizes, options_.local_percent)
                 : std::vector<char>(sizes.size(), 0);
    not_local_.resize(local_.size());
    for (size_t b = 0; b < local_.size(); ++b) not_local_[b] = !local_[b];
  }
  const bool all_local = std::find(local_.begin(), local_.end(), 0) == local_.end();
  os.one_chunk_per_step =
      !options_.reduce_each_micro_batch || s.gradient_accumulation_steps == 1 || all_local;
  optimizer_->setup(os);

  if (options_.shards == 1) param_shard_ = flat;
  buckets_->install_hooks([this](int b) { on_bucket_ready(b); });
}

void BucketSharding::begin_micro_batch(int64_t index, bool last) {
  if (!buckets_) throw Error("sharding: begin_micro_batch before setup");
  if (index == 0)
    micro_batches_ = 0;
  else if (options_.reduce_each_micro_batch) {
    buckets_->flush();
    drain();
  }
  ++micro_batches_;
  last_micro_batch_ = last;
  if (last || !options_.reduce_each_micro_batch)
    buckets_->arm(last);
  else
    buckets_->arm(not_local_);  // the local buckets accumulate until the last micro-batch
}

void BucketSharding::on_bucket_ready(int bucket) {
  if (!options_.overlap_comm) {
    std::lock_guard<std::mutex> l(pending_mu_);
    deferred_.push_back(bucket);
    return;
  }
  launch(bucket);
}

namespace {
// The reduction of a world of one: nothing to wait for.
class DoneWork final : public Work {
 public:
  void wait() override {}
  bool is_completed() override { return true; }
};
}  // namespace

void BucketSharding::launch(int bucket) {
  c10::NoGradGuard ng;
  at::Tensor packed = buckets_->pack_grads(bucket, grad_dtype_, /*release=*/true);
  // One rank: the sum over ranks is the packed gradient itself (in the parameter dtype, as autograd
  // produced it), and this rank's chunk is all of it. No collective and no copy into a chunk
  // buffer (at the 7B shape on one GPU those were 139 device copies of 200 MB a step).
  const bool alone = alone_;
  at::Tensor out = reduce_in_place() || alone
                       ? packed
                       : at::empty({packed.numel() / options_.shards}, packed.options());
  std::unique_ptr<Work> work = alone ? std::make_unique<DoneWork>() : reduce(packed, out);
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
    // The region's first contribution this step (reduce_each: micro-batch 1; no_sync and local
    // buckets: the only) and whether it is its last.
    const bool first = !options_.reduce_each_micro_batch || local_[p.bucket] || micro_batches_ == 1;
    at::Tensor chunk = p.out;
    if (options_.shards > 1 && p.out.is_same(p.packed))  // reduced in place: take our chunk
      chunk = p.out.narrow(0, options_.shard_index * (p.out.numel() / options_.shards),
                           p.out.numel() / options_.shards);
    optimizer_->accumulate_grad(p.bucket, chunk, first, last_micro_batch_);
  }
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

GradSquares BucketSharding::finish_grads() {
  if (!buckets_) throw Error("sharding: finish_grads before setup");
  const auto t = std::chrono::steady_clock::now();
  buckets_->flush();
  drain();
  GradSquares sq;
  sq.local_sum_sq = optimizer_->finish_grads();
  sq.disjoint = options_.shards > 1;
  phase_.drain_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  phase_.update_s = phase_.publish_s = 0.0;
  return sq;
}

void BucketSharding::update(const OptimizerStep& args) {
  using Clock = std::chrono::steady_clock;
  auto since = [](Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  };
  auto t = Clock::now();
  acquire_param_shard();
  optimizer_->step(args, param_shard_);
  phase_.update_s = since(t);
  t = Clock::now();
  publish();
  release_param_shard();
  phase_.publish_s = since(t);
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
  m.grad_bytes = peak_pending_bytes_;
  return m;
}

std::vector<ShardSlice> BucketSharding::layout() const {
  return buckets_->shard_slices(options_.shard_index);
}

void BucketSharding::save_state(StateDict& out) const { optimizer_->save_state(out); }

void BucketSharding::load_state(const SliceFetcher& fetch, int64_t t) {
  const int64_t S = buckets_->shard_numel();
  const std::vector<ShardSlice> slices = layout();
  StateDict sd;
  for (const std::string& name : optimizer_->state_names()) {
    at::Tensor t = at::zeros({S}, at::kFloat);
    for (const ShardSlice& sl : slices) {
      at::Tensor part = fetch(name, sl.param, sl.param_offset, sl.length);
      if (!part.defined() || part.numel() != sl.length)
        throw Error("sharding: checkpoint slice of " + name + " for " + sl.param +
                    " has the wrong size");
      t.narrow(0, sl.shard_offset, sl.length).copy_(part.reshape({-1}));
    }
    sd.emplace_back(name, t);
  }
  optimizer_->load_state(sd);
  // Parameters follow the loaded master weights, rounded by the precision policy.
  c10::NoGradGuard ng;
  acquire_param_shard();
  optimizer_->write_params(param_shard_, t);
  publish();
  release_param_shard();
}

void BucketSharding::append_metrics(Metrics& out) const {
  // Memory (shard_*_gib) is the core's to report, from memory(). Host wall time of the last step's
  // phases (see PhaseTimes).
  out.set("step_drain_s", phase_.drain_s);
  out.set("step_update_s", phase_.update_s);
  out.set("step_publish_s", phase_.publish_s);
}

}  // namespace ciuic::kit
