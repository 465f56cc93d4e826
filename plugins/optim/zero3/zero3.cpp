// sharding/zero3: ZeRO stage 3 (DeepSpeed's parameter partitioning, FSDP2's fully_shard).
//
// Layout. Every parameter belongs to one *unit*: the lowest-numbered model group that lists it
// (ShardingSetup::groups: "embed", "layers.<i>", "head"; a tied embedding listed by "embed" and
// "head" is in embed's unit, whose backward is the last to touch it). A unit is one flat buffer of
// its parameters in forward order, padded to a multiple of world x 64 elements and split into
// `world` equal chunks; rank r keeps chunk r of every unit, in unit order, in its *shard* (the
// parameter dtype: the optimizer's params_out, written in place by each update). Parameters
// smaller than param_persistence_threshold go into one persistent unit instead, kept gathered on
// every rank (all-gathered after each update), its gradient sharded like the others.
//
// Gathered storage. Each unit's parameters are views (param.set_data) into the unit's full
// buffer, whose StorageImpl lives as long as the plugin; between uses its memory is given back to
// the allocator (the storage's data pointer is set to null) and, for the next use, allocated
// again and all-gathered from the shards. Autograd's saved tensors are views of the same storage
// (the parameters themselves, their transposes), so they read the re-gathered values in backward;
// no tensor's version counter moves (the collectives write the storage, not the parameters). A
// parameter read while its unit is not gathered fails loudly ("data is not allocated yet").
//
// Per group g of a pass (the model's boundaries, ciuic/sharding.h):
//   before_group(g, p)  gather g's units (or wait for their prefetch), hold them; then prefetch the
//                       next group's units (g + 1 in forward, g - 1 in backward), and the groups
//                       after it while the prefetch stays within prefetch_bucket_size, as long as
//                       the gathered elements stay within max_live_parameters;
//   after_group(g, p)   release; a unit nobody holds is freed after its backward, after a forward
//                       (reshard_after_forward, or any forward without autograd) and after a
//                       recomputation; kBackward also reduce-scatters (SUM) the gradients of the
//                       units g owns into this rank's chunk and hands the chunk to the optimizer.
// A checkpointed layer's recomputation runs inside its backward, whose hold keeps the unit
// gathered: one gather per layer for backward and recomputation together.
//
// Start. zero3 builds the parameters (Sharding::builds_parameters()): the core creates them
// without memory and hands setup() their values (ShardingSetup::values); each rank writes only the
// ranges of its chunks into its shard, a parameter at a time, and the units' full buffers get
// storage without memory. No rank holds more than its shard plus the values function's transient
// parameter, whatever the model size. Given materialised parameters (no values: the conformance
// kit, tests), rank 0's are broadcast unit by unit as before.
//
// offload_params: the shard lives in (pinned, on CUDA) host memory; a gather uploads the unit's
// chunk first. With cpu_adam this is DeepSpeed's offload_param + offload_optimizer.
#define CIUIC_PLUGIN_API 9
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <c10/core/StorageImpl.h>
#include <torch/csrc/autograd/variable.h>

#include <ciuic/comm.h>
#include <ciuic/config.h>
#include <ciuic/context.h>
#include <ciuic/error.h>
#include <ciuic/kit/host_buffer.h>
#include <ciuic/log.h>
#include <ciuic/metrics.h>
#include <ciuic/optimizer.h>
#include <ciuic/plan.h>
#include <ciuic/precision.h>
#include <ciuic/sharding.h>

namespace {

using ciuic::Error;
using ciuic::GroupPass;

constexpr int64_t kAlign = 64;  // elements per chunk are a multiple of this
constexpr size_t kMaxReductionsInFlight = 3;

constexpr ciuic::Option<bool> kReshardAfterForward{
    "reshard_after_forward", "true",
    "free each group's gathered parameters after its forward and gather them again for its "
    "backward "
    "(FSDP2's reshard_after_forward; false keeps them gathered from forward to backward)"};
constexpr ciuic::Option<double> kMaxLiveParameters{
    "max_live_parameters", "1e9",
    "gathered elements a prefetch may bring the rank to (DeepSpeed's stage3_max_live_parameters); "
    "must hold "
    "the largest group",
    1, NAN};
constexpr ciuic::Option<double> kPrefetchBucketSize{
    "prefetch_bucket_size", "5e7",
    "elements gathered ahead of the group that computes (DeepSpeed's stage3_prefetch_bucket_size): "
    "the next "
    "group in forward and backward order always, the ones after it while their sum stays within "
    "this; 0: no "
    "prefetch",
    0, NAN};
constexpr ciuic::Option<double> kParamPersistenceThreshold{
    "param_persistence_threshold", "0",
    "parameters with fewer elements stay gathered on every rank (DeepSpeed's "
    "stage3_param_persistence_threshold); their optimizer state is still sharded",
    0, NAN};
constexpr ciuic::Option<bool> kOffloadParams{"offload_params", "false",
                                             "keep this rank's parameter shard in host memory and "
                                             "upload a unit's chunk for each gather (DeepSpeed's "
                                             "offload_param)"};
const ciuic::OptionSpec kOptions[] = {kReshardAfterForward, kMaxLiveParameters, kPrefetchBucketSize,
                                      kParamPersistenceThreshold, kOffloadParams};

// Elements of a whole number option given as a float ("5e8").
int64_t elements(const ciuic::Config& c, const ciuic::Option<double>& option) {
  const double v = c.get(option);
  if (v != std::floor(v) || v > 9e18) c.fail(option.key(), "expected a whole number of elements");
  return static_cast<int64_t>(v);
}

struct Options {
  bool reshard_after_forward = true;
  int64_t max_live = 0;
  int64_t prefetch = 0;
  int64_t persistence = 0;
  bool offload = false;
  static Options from(const ciuic::Config& c) {
    Options o;
    o.reshard_after_forward = c.get(kReshardAfterForward);
    o.max_live = elements(c, kMaxLiveParameters);
    o.prefetch = elements(c, kPrefetchBucketSize);
    o.persistence = elements(c, kParamPersistenceThreshold);
    o.offload = c.get(kOffloadParams);
    return o;
  }
};

// The storage of `t` without memory (its views keep their shape; reading them throws) and back.
void free_storage(const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
}
void allocate_storage(const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  if (s->data()) return;
  s->set_data_ptr_noswap(s->allocator()->allocate(s->nbytes()));
}
bool has_storage(const at::Tensor& t) {
  return t.storage().unsafeGetStorageImpl()->data() != nullptr;
}
// `numel` elements of `o` in a storage without memory (allocate_storage gives it some).
at::Tensor unallocated(int64_t numel, const at::TensorOptions& o) {
  at::Tensor t = at::empty({0}, o);
  c10::Storage s(c10::Storage::use_byte_size_t(), numel * static_cast<int64_t>(t.element_size()),
                 at::DataPtr(nullptr, t.device()), t.storage().allocator(), /*resizable=*/false);
  return t.set_(s, 0, {numel}, {1});
}

class DoneWork final : public ciuic::Work {
 public:
  void wait() override {}
  bool is_completed() override { return true; }
};

class Zero3 final : public ciuic::Sharding {
 public:
  Zero3(const ciuic::Config& cfg, const ciuic::RunContext& ctx)
      : opts_(Options::from(cfg)), cfg_(cfg) {
    (void)ctx;
  }
  ~Zero3() override {
    // Pending collectives hold our buffers: let them finish (never throw from here).
    try {
      for (auto& u : units_)
        if (u.work) u.work->wait();
      for (auto& p : pending_) p.work->wait();
    } catch (...) {
    }
  }

  void setup(const ciuic::ShardingSetup& s) override;
  bool builds_parameters() const override { return true; }
  bool shards_parameters() const override { return true; }  // the optimizer and policy must say so
  void begin_micro_batch(int64_t index, bool last) override;
  void before_group(int group, GroupPass pass) override;
  void after_group(int group, GroupPass pass) override;
  ciuic::GradSquares finish_grads() override;
  void update(const ciuic::OptimizerStep& args) override;
  std::vector<ciuic::ShardSlice> layout() const override { return slices_; }
  void save_state(ciuic::StateDict& out) const override { optimizer_->save_state(out); }
  void load_state(const ciuic::SliceFetcher& fetch, int64_t t) override;
  ciuic::ShardingMemory memory() const override;
  void append_metrics(ciuic::Metrics& out) const override;

 private:
  struct Member {
    int param = 0;
    int64_t offset = 0;  // in the unit
    int64_t numel = 0;
  };
  struct Unit {
    std::string name;
    std::vector<Member> members;
    int64_t used = 0, numel = 0, chunk = 0, shard_offset = 0;
    bool persistent = false;
    at::Tensor full;                    // numel elements; memory only while gathered
    std::unique_ptr<ciuic::Work> work;  // the gather in flight
    at::Tensor upload;                  // offload_params on an accelerator: the chunk on the device
    int holds = 0;                      // before_group()s not yet matched by after_group()
    int64_t reduced_in = -1;            // micro-batch whose gradient was last reduced
    bool gathered() const { return has_storage(full); }
  };
  struct Pending {
    int unit;
    std::unique_ptr<ciuic::Work> work;
    at::Tensor packed, out;
  };

  void gather(int u);  // launch (no-op when gathered or in flight)
  void wait_gather(int u);
  void release(int u);  // free the unit's memory
  void prefetch(int group, int step);
  void reduce(int u);
  void retire(size_t keep);
  void reduce_missing();  // units whose backward did not run this micro-batch: reduce zeros
  void free_all_gathered();
  void refresh_persistent();
  at::Tensor chunk_of(int u) { return shard_.narrow(0, units_[u].shard_offset, units_[u].chunk); }
  std::string who() const { return "sharding zero3"; }

  Options opts_;
  ciuic::Config cfg_;
  ciuic::Comm* comm_ = nullptr;
  ciuic::Precision* precision_ = nullptr;
  ciuic::Optimizer* optimizer_ = nullptr;
  std::vector<ciuic::ShardingParam> params_;
  std::vector<Unit> units_;
  std::vector<std::vector<int>> needs_;  // per group: the (not persistent) units it computes with
  std::vector<std::vector<int>>
      owns_;  // per group: the units whose gradient its backward completes
  int persistent_unit_ = -1;
  std::vector<ciuic::ShardSlice> slices_;
  at::Tensor shard_;  // this rank's chunks in unit order, parameter dtype
  c10::Device device_{c10::kCPU};
  int world_ = 1, rank_ = 0;
  at::ScalarType grad_dtype_ = at::kFloat;
  bool forward_grad_ = true;  // the current forward records autograd
  int64_t micro_ = 0;
  bool last_micro_ = true;
  std::mutex mu_;
  std::deque<Pending> pending_;
  // Accounting.
  int64_t live_ = 0, peak_live_ = 0;  // gathered elements (not persistent)
  uint64_t pending_bytes_ = 0, peak_pending_bytes_ = 0;
  int64_t gathers_ = 0, step_gathers_ = 0, last_step_gathers_ = 0;
  double drain_s_ = 0, update_s_ = 0, publish_s_ = 0;
};

void Zero3::setup(const ciuic::ShardingSetup& s) {
  if (!s.comm || !s.precision || !s.optimizer)
    throw Error("sharding zero3: setup needs a comm, a precision policy and an optimizer");
  if (s.params.empty()) throw Error("sharding zero3: the model has no parameters");
  if (s.groups.empty())
    throw ciuic::UsageError(
        "sharding zero3: the model announces no parameter groups (ShardingSetup::groups), so "
        "there is no layer boundary to gather parameters at; use zero2 with this model");
  comm_ = s.comm;
  precision_ = s.precision;
  optimizer_ = s.optimizer;
  params_ = s.params;
  world_ = comm_->size();
  rank_ = comm_->rank();
  const at::ScalarType dtype = params_[0].tensor.scalar_type();
  device_ = params_[0].tensor.device();
  for (const auto& p : params_) {
    if (p.tensor.scalar_type() != dtype || p.tensor.device() != device_)
      throw Error("sharding zero3: parameter " + p.name + " is " +
                  std::string(c10::toString(p.tensor.scalar_type())) + " on " +
                  p.tensor.device().str() + ", the first is " + std::string(c10::toString(dtype)) +
                  " on " + device_.str() + "; all parameters must share dtype and device");
    if (!p.tensor.requires_grad())
      throw Error("sharding zero3: parameter " + p.name + " does not require grad");
  }

  // Owner group of each parameter: the lowest group listing it.
  const int G = static_cast<int>(s.groups.size());
  std::vector<int> owner(params_.size(), -1);
  for (int g = G - 1; g >= 0; --g)
    for (int i : s.groups[g].params) {
      if (i < 0 || i >= static_cast<int>(params_.size()))
        throw Error("sharding zero3: group " + s.groups[g].name + " lists parameter index " +
                    std::to_string(i) + " of " + std::to_string(params_.size()));
      owner[i] = g;
    }
  for (size_t i = 0; i < params_.size(); ++i)
    if (owner[i] < 0)
      throw Error("sharding zero3: parameter " + params_[i].name +
                  " is in no parameter group: it would never be "
                  "gathered");

  // Units: one per owner group (parameters in forward order), the persistent one last.
  const int64_t unit_pad = static_cast<int64_t>(world_) * kAlign;
  std::vector<int> unit_of_group(G, -1);
  Unit persistent;
  persistent.name = "persistent";
  persistent.persistent = true;
  for (size_t i = 0; i < params_.size(); ++i) {
    const int64_t n = params_[i].tensor.numel();
    Unit* u;
    if (n < opts_.persistence) {
      u = &persistent;
    } else {
      int& k = unit_of_group[owner[i]];
      if (k < 0) {
        k = static_cast<int>(units_.size());
        units_.emplace_back();
        units_.back().name = s.groups[owner[i]].name;
      }
      u = &units_[k];
    }
    u->members.push_back(Member{static_cast<int>(i), u->used, n});
    u->used += n;
  }
  if (!persistent.members.empty()) {
    persistent_unit_ = static_cast<int>(units_.size());
    units_.push_back(std::move(persistent));
  }
  int64_t shard_numel = 0;
  for (auto& u : units_) {
    u.numel = std::max<int64_t>(1, (u.used + unit_pad - 1) / unit_pad) * unit_pad;
    u.chunk = u.numel / world_;
    u.shard_offset = shard_numel;
    shard_numel += u.chunk;
  }
  std::vector<int> unit_of_param(params_.size(), -1);
  for (size_t k = 0; k < units_.size(); ++k)
    for (const auto& m : units_[k].members) unit_of_param[m.param] = static_cast<int>(k);
  needs_.assign(G, {});
  owns_.assign(G, {});
  for (int g = 0; g < G; ++g)
    for (int i : s.groups[g].params) {
      const int k = unit_of_param[i];
      if (k == persistent_unit_) continue;
      if (std::find(needs_[g].begin(), needs_[g].end(), k) == needs_[g].end())
        needs_[g].push_back(k);
    }
  for (size_t k = 0; k < units_.size(); ++k) {
    // The persistent unit's gradients are final when the whole backward is: group 0's end.
    const int g = units_[k].persistent ? 0 : owner[units_[k].members.front().param];
    owns_[g].push_back(static_cast<int>(k));
  }

  // The live bound must hold every group's units at once.
  for (int g = 0; g < G; ++g) {
    int64_t n = 0;
    for (int k : needs_[g]) n += units_[k].numel;
    if (n > opts_.max_live)
      cfg_.fail(kMaxLiveParameters.key(),
                "is " + std::to_string(opts_.max_live) + " elements, but group " +
                    s.groups[g].name + " gathers " + std::to_string(n) +
                    " elements at once (its parameters, padded to " + std::to_string(unit_pad) +
                    "); expected at least " + std::to_string(n));
  }

  // The shard, and each unit's full buffer; every rank starts from rank 0's values.
  {
    at::TensorOptions o = at::TensorOptions().dtype(dtype).device(device_);
    if (opts_.offload && device_.type() != at::kCPU) {
      ciuic::kit::HostBufferOptions ho;
      ho.pin = true;
      shard_ = ciuic::kit::host_buffer(shard_numel, dtype, ho,
                                       "sharding zero3: the parameter shard (offload_params)");
    } else {
      shard_ = at::empty({shard_numel}, o);
    }
    c10::NoGradGuard ng;
    for (auto& u : units_) {
      at::Tensor mine = shard_.narrow(0, u.shard_offset, u.chunk);
      if (s.values && !u.persistent) {  // this rank's chunk only, from the values
        const int64_t lo = rank_ * u.chunk, hi = lo + u.chunk;
        u.full = unallocated(u.numel, o);
        mine.zero_();  // padding
        for (const auto& m : u.members) {
          const int64_t b = std::max(lo, m.offset), e = std::min(hi, m.offset + m.numel);
          if (b < e) s.values(m.param, b - m.offset, mine.narrow(0, b - lo, e - b));
        }
      } else {
        u.full = at::empty({u.numel}, o);
        for (const auto& m : u.members) {
          at::Tensor dst = u.full.narrow(0, m.offset, m.numel);
          if (s.values)
            s.values(m.param, 0, dst);
          else
            dst.copy_(params_[m.param].tensor.detach().reshape({-1}));
        }
        if (u.numel > u.used) u.full.narrow(0, u.used, u.numel - u.used).zero_();
        if (world_ > 1 && !s.values) comm_->broadcast(u.full, 0)->wait();
        mine.copy_(u.full.narrow(0, rank_ * u.chunk, u.chunk));
      }
      for (const auto& m : u.members) {
        at::Tensor& p = params_[m.param].tensor;
        p.set_data(u.full.narrow(0, m.offset, m.numel).view(p.sizes()));
      }
      if (!u.persistent) free_storage(u.full);
    }
  }

  // The optimizer's view of the shard.
  ciuic::OptimizerSetup os;
  os.numel = shard_numel;
  std::unordered_map<int, int64_t>
      global_start;  // each parameter's offset in the model's flat order
  {
    int64_t at = 0;
    for (size_t i = 0; i < params_.size(); ++i) {
      global_start[static_cast<int>(i)] = at;
      at += params_[i].tensor.numel();
    }
  }
  auto push_segment = [&](int64_t begin, int64_t end, bool decay) {
    if (end <= begin) return;
    if (!os.segments.empty() && os.segments.back().end == begin &&
        os.segments.back().weight_decay == decay)
      os.segments.back().end = end;
    else
      os.segments.push_back(ciuic::ShardSegment{begin, end, decay});
  };
  auto push_position = [&](int64_t offset, int64_t length, int64_t global) {
    if (length > 0) os.positions.push_back(ciuic::PositionSpan{offset, length, global});
  };
  for (size_t k = 0; k < units_.size(); ++k) {
    const Unit& u = units_[k];
    const int64_t lo = rank_ * u.chunk, hi = lo + u.chunk;
    int64_t pos = lo;  // unit coordinate covered so far
    for (const auto& m : u.members) {
      const int64_t b = std::max(lo, m.offset), e = std::min(hi, m.offset + m.numel);
      if (b >= e) continue;
      const int64_t at = u.shard_offset + (b - lo);
      push_segment(u.shard_offset + (pos - lo), at, false);
      push_position(u.shard_offset + (pos - lo), b - pos, -1);
      push_segment(at, at + (e - b), params_[m.param].weight_decay);
      push_position(at, e - b, global_start[m.param] + (b - m.offset));
      slices_.push_back(ciuic::ShardSlice{params_[m.param].name, b - m.offset, e - b, at});
      pos = e;
    }
    push_segment(u.shard_offset + (pos - lo), u.shard_offset + u.chunk, false);  // padding
    push_position(u.shard_offset + (pos - lo), hi - pos, -1);
    os.grad_regions.push_back(ciuic::ShardRegion{u.shard_offset, u.chunk});
  }
  os.initial.push_back(ciuic::ShardValues{0, shard_});
  os.param_dtype = dtype;
  os.device = device_;
  os.precision = precision_;
  os.gradient_accumulation_steps = s.gradient_accumulation_steps;
  grad_dtype_ = world_ == 1 ? dtype : precision_->reduce_dtype();
  os.grad_dtype = grad_dtype_;
  os.one_chunk_per_step = s.gradient_accumulation_steps == 1;
  optimizer_->setup(os);

  if (rank_ == 0) {
    int64_t largest = 0;
    for (const auto& u : units_)
      if (!u.persistent) largest = std::max(largest, u.numel);
    char line[300];
    std::snprintf(line, sizeof line,
                  "sharding zero3: %zu units (%s), shard of %lld elements per rank, largest unit "
                  "%lld elements, "
                  "reshard_after_forward %s, prefetch %lld, max live %lld%s",
                  units_.size(), persistent_unit_ >= 0 ? "one persistent" : "none persistent",
                  static_cast<long long>(shard_numel), static_cast<long long>(largest),
                  opts_.reshard_after_forward ? "on" : "off",
                  static_cast<long long>(opts_.prefetch), static_cast<long long>(opts_.max_live),
                  opts_.offload ? ", parameters offloaded" : "");
    ciuic::log_info(line);
  }
}

void Zero3::gather(int k) {
  Unit& u = units_[k];
  if (u.persistent || u.work || u.gathered()) return;
  c10::NoGradGuard ng;
  allocate_storage(u.full);
  at::Tensor in = chunk_of(k);
  if (in.device() != device_) {  // offload_params on an accelerator: upload the chunk
    u.upload = in.to(device_, /*non_blocking=*/true);
    in = u.upload;
  }
  u.work = comm_->all_gather(u.full, in);
  live_ += u.numel;
  peak_live_ = std::max(peak_live_, live_);
  ++gathers_;
  ++step_gathers_;
}

void Zero3::wait_gather(int k) {
  Unit& u = units_[k];
  if (!u.work) return;
  u.work->wait();
  u.work.reset();
  u.upload = at::Tensor();
}

void Zero3::release(int k) {
  Unit& u = units_[k];
  if (u.persistent || !u.gathered()) return;
  wait_gather(k);
  free_storage(u.full);
  live_ -= u.numel;
}

void Zero3::prefetch(int group, int step) {
  if (opts_.prefetch <= 0) return;
  int64_t ahead = 0;
  for (int g = group + step; g >= 0 && g < static_cast<int>(needs_.size()); g += step) {
    int64_t n = 0;
    for (int k : needs_[g])
      if (!units_[k].gathered()) n += units_[k].numel;
    if (n == 0) continue;
    // The next group always (as FSDP2 prefetches one module ahead), more while within the bucket.
    if ((ahead > 0 && ahead + n > opts_.prefetch) || live_ + n > opts_.max_live) return;
    for (int k : needs_[g]) gather(k);
    ahead += n;
  }
}

void Zero3::before_group(int group, GroupPass pass) {
  if (group < 0 || group >= static_cast<int>(needs_.size()))
    throw Error("sharding zero3: boundary of group " + std::to_string(group) + ", the model has " +
                std::to_string(needs_.size()) + " groups");
  if (pass == GroupPass::kForward) forward_grad_ = c10::GradMode::is_enabled();
  for (int k : needs_[group]) {
    gather(k);
    ++units_[k].holds;
  }
  for (int k : needs_[group]) wait_gather(k);
  if (pass == GroupPass::kForward)
    prefetch(group, +1);
  else if (pass == GroupPass::kBackward)
    prefetch(group, -1);
}

void Zero3::after_group(int group, GroupPass pass) {
  if (group < 0 || group >= static_cast<int>(needs_.size()))
    throw Error("sharding zero3: boundary of group " + std::to_string(group) + ", the model has " +
                std::to_string(needs_.size()) + " groups");
  if (pass == GroupPass::kBackward)
    for (int k : owns_[group]) reduce(k);
  // Units the next group of this pass computes with stay (they would be gathered again at once),
  // and so does the last group's after a forward that backward follows (its backward comes first).
  const int G = static_cast<int>(needs_.size());
  const int next = pass == GroupPass::kForward ? group + 1 : group - 1;
  const bool keep_for_backward = pass == GroupPass::kForward && forward_grad_ &&
                                 (!opts_.reshard_after_forward || group == G - 1);
  for (int k : needs_[group]) {
    Unit& u = units_[k];
    if (u.holds > 0) --u.holds;
    if (u.holds > 0) continue;
    const bool next_needs =
        pass != GroupPass::kRecompute && next >= 0 && next < G &&
        std::find(needs_[next].begin(), needs_[next].end(), k) != needs_[next].end();
    if (!keep_for_backward && !next_needs) release(k);
  }
}

void Zero3::begin_micro_batch(int64_t index, bool last) {
  if (!optimizer_) throw Error("sharding zero3: begin_micro_batch before setup");
  if (index == 0) {
    micro_ = 0;
    step_gathers_ = 0;
  } else {
    reduce_missing();
    retire(0);
    ++micro_;
  }
  last_micro_ = last;
}

void Zero3::reduce(int k) {
  Unit& u = units_[k];
  if (u.reduced_in == micro_) return;  // once per micro-batch
  u.reduced_in = micro_;
  c10::NoGradGuard ng;
  at::Tensor packed = at::empty({u.numel}, u.full.options().dtype(grad_dtype_));
  for (const auto& m : u.members) {
    at::Tensor& p = params_[m.param].tensor;
    at::Tensor dst = packed.narrow(0, m.offset, m.numel);
    const at::Tensor& g = p.grad();
    if (g.defined())
      dst.copy_(g.reshape({-1}));
    else
      dst.zero_();
    p.mutable_grad().reset();
  }
  if (u.numel > u.used) packed.narrow(0, u.used, u.numel - u.used).zero_();
  Pending pd;
  pd.unit = k;
  pd.packed = packed;
  if (world_ == 1) {
    pd.out = packed;
    pd.work = std::make_unique<DoneWork>();
  } else {
    pd.out = at::empty({u.chunk}, packed.options());
    pd.work = comm_->reduce_scatter(pd.out, pd.packed, ciuic::ReduceOp::kSum);
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    pending_bytes_ += packed.nbytes() + (pd.out.is_same(packed) ? 0 : pd.out.nbytes());
    peak_pending_bytes_ = std::max(peak_pending_bytes_, pending_bytes_);
    pending_.push_back(std::move(pd));
  }
  retire(kMaxReductionsInFlight);
}

void Zero3::retire(size_t keep) {
  c10::NoGradGuard ng;
  for (;;) {
    Pending p;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (pending_.empty()) return;
      if (pending_.size() <= keep && !pending_.front().work->is_completed()) return;
      p = std::move(pending_.front());
      pending_.pop_front();
      pending_bytes_ -= p.packed.nbytes() + (p.out.is_same(p.packed) ? 0 : p.out.nbytes());
    }
    p.work->wait();
    optimizer_->accumulate_grad(p.unit, p.out, /*first=*/micro_ == 0, /*last=*/last_micro_);
  }
}

void Zero3::reduce_missing() {
  // In unit order on every rank, so the collectives match.
  for (size_t k = 0; k < units_.size(); ++k)
    if (units_[k].reduced_in != micro_) reduce(static_cast<int>(k));
}

ciuic::GradSquares Zero3::finish_grads() {
  if (!optimizer_) throw Error("sharding zero3: finish_grads before setup");
  const auto t = std::chrono::steady_clock::now();
  reduce_missing();
  retire(0);
  for (auto& u : units_) u.reduced_in = -1;
  last_step_gathers_ = step_gathers_;
  ciuic::GradSquares sq;
  sq.local_sum_sq = optimizer_->finish_grads();
  sq.disjoint = world_ > 1;
  drain_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  update_s_ = publish_s_ = 0;
  return sq;
}

void Zero3::free_all_gathered() {
  for (size_t k = 0; k < units_.size(); ++k) {
    wait_gather(static_cast<int>(k));
    units_[k].holds = 0;
    release(static_cast<int>(k));
  }
}

void Zero3::refresh_persistent() {
  if (persistent_unit_ < 0) return;
  c10::NoGradGuard ng;
  Unit& u = units_[persistent_unit_];
  at::Tensor in = chunk_of(persistent_unit_);
  if (in.device() != device_) in = in.to(device_);
  comm_->all_gather(u.full, in)->wait();
}

void Zero3::update(const ciuic::OptimizerStep& args) {
  using Clock = std::chrono::steady_clock;
  auto t = Clock::now();
  free_all_gathered();  // gathered copies would be stale after the update
  if (shard_.device() == device_) {
    optimizer_->step(args, shard_);
  } else {  // offloaded shard on an accelerator: the optimizer writes on the device, once
    at::Tensor out =
        at::empty({shard_.numel()}, shard_.options().device(device_).pinned_memory(false));
    optimizer_->step(args, out);
    shard_.copy_(out);
  }
  update_s_ = std::chrono::duration<double>(Clock::now() - t).count();
  t = Clock::now();
  refresh_persistent();
  publish_s_ = std::chrono::duration<double>(Clock::now() - t).count();
}

void Zero3::load_state(const ciuic::SliceFetcher& fetch, int64_t t) {
  const int64_t S = shard_.numel();
  ciuic::StateDict sd;
  for (const std::string& name : optimizer_->state_names()) {
    at::Tensor v = at::zeros({S}, at::kFloat);
    for (const ciuic::ShardSlice& sl : slices_) {
      at::Tensor part = fetch(name, sl.param, sl.param_offset, sl.length);
      if (!part.defined() || part.numel() != sl.length)
        throw Error("sharding zero3: checkpoint slice of " + name + " for " + sl.param + " [" +
                    std::to_string(sl.param_offset) + ", +" + std::to_string(sl.length) +
                    ") has the wrong size");
      v.narrow(0, sl.shard_offset, sl.length).copy_(part.reshape({-1}));
    }
    sd.emplace_back(name, v);
  }
  optimizer_->load_state(sd);
  c10::NoGradGuard ng;
  free_all_gathered();
  if (shard_.device() == device_) {
    optimizer_->write_params(shard_, t);
  } else {
    at::Tensor out = at::empty({S}, shard_.options().device(device_).pinned_memory(false));
    optimizer_->write_params(out, t);
    shard_.copy_(out);
  }
  refresh_persistent();
}

ciuic::ShardingMemory Zero3::memory() const {
  ciuic::ShardingMemory m;
  if (!shard_.defined()) return m;
  const int64_t item = static_cast<int64_t>(shard_.element_size());
  m.param_bytes = static_cast<uint64_t>(peak_live_ * item);
  if (shard_.device() == device_) m.param_bytes += shard_.nbytes();
  if (persistent_unit_ >= 0) m.param_bytes += units_[persistent_unit_].full.nbytes();
  m.grad_bytes = peak_pending_bytes_;
  return m;
}

void Zero3::append_metrics(ciuic::Metrics& out) const {
  out.set("step_drain_s", drain_s_);
  out.set("step_update_s", update_s_);
  out.set("step_publish_s", publish_s_);
  out.set("zero3_gathers", static_cast<double>(last_step_gathers_));
  out.set(
      "zero3_peak_live_gib",
      static_cast<double>(peak_live_ * static_cast<int64_t>(shard_.element_size())) / 1073741824.0);
}

void plan(const ciuic::Config& cfg, ciuic::PlanContext& p) {
  const Options o = Options::from(cfg);
  const double P = static_cast<double>(p.num_parameters);
  const double world = static_cast<double>(p.world_size);
  p.shard_numel = static_cast<int64_t>(std::ceil(P / world));
  p.grad_chunk_elements = p.shard_numel;  // at most one unit's chunk; bounded by the shard
  p.grad_bytes = p.world_size == 1 ? p.param_bytes : p.reduce_bytes;
  p.one_chunk_per_step = p.gradient_accumulation_steps == 1;
  p.add("parameter shard", !o.offload || !p.cuda, std::ceil(P / world) * p.param_bytes,
        "1/" + std::to_string(p.world_size) + " of " + std::to_string(p.num_parameters) + " x " +
            std::to_string(p.param_bytes) + " bytes" + (o.offload ? " (offload_params)" : ""));
  // Gathered at once: the computing group, its prefetch, and with reshard_after_forward = false
  // every group between forward and backward. The planner does not know the group sizes: the
  // largest parameter is a lower bound of the largest group, max_live_parameters the upper bound.
  const double group = static_cast<double>(std::max<int64_t>(p.largest_parameter, 1));
  const double ahead = o.prefetch > 0 ? std::max(group, static_cast<double>(o.prefetch)) : 0.0;
  const double live =
      o.reshard_after_forward
          ? std::min(P, std::max(group, std::min(static_cast<double>(o.max_live), group + ahead)))
          : P;
  p.add("gathered parameters in flight", true, live * p.param_bytes,
        o.reshard_after_forward
            ? "the computing group and its prefetch (<= max_live_parameters)"
            : "reshard_after_forward = false: every group from forward to backward");
  const double reductions = std::min(P, static_cast<double>(kMaxReductionsInFlight + 1) * group);
  // A world of one hands the packed gradient over as it is (no chunk buffer).
  p.add("reductions in flight", true,
        reductions * p.grad_bytes * (p.world_size == 1 ? 1.0 : 1.0 + 1.0 / world),
        "up to " + std::to_string(kMaxReductionsInFlight + 1) +
            " groups' packed gradients and chunks");
  p.add("gradients not yet reduced", true, group * p.param_bytes,
        "about one group (autograd's param.grad)");
  // At start (builds_parameters): the shard, plus one whole parameter drawn in fp32 (and rounded to
  // the parameter dtype) by the values function; the units' full buffers have no memory yet.
  p.start_bytes = (o.offload && p.cuda ? 0.0 : std::ceil(P / world) * p.param_bytes) +
                  group * (4.0 + (p.param_bytes == 4 ? 0 : p.param_bytes));
}

}  // namespace

CIUIC_DEFINE_PLUGIN_PLANNED(
    ciuic::Slot::kSharding, "zero3", "1.0.0",
    "ZeRO-3: parameters, gradients and optimizer state sharded; each layer group "
    "gathered around its forward and backward (prefetched) and its gradient "
    "reduce-scattered as its backward ends",
    kOptions,
    [](const ciuic::PluginArgs& a) -> ciuic::PluginObject* {
      return new Zero3(a.config, a.context);
    },
    plan)
