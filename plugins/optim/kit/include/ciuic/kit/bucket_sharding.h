// ciuic/kit/bucket_sharding.h — part of the optim kit (libciuic_optim_kit.a; a static library
// that sharding plugins link, not part of the SDK's ABI): a Sharding skeleton for bucketed
// data-parallel strategies.
//
// BucketSharding implements the Sharding protocol (ciuic/sharding.h) on top of FlatBuckets and
// leaves a strategy exactly three decisions:
//
//   reduce(packed, out)  how one bucket's packed gradient (reduce dtype, bucket size) is combined
//                        across ranks into `out`, this rank's chunk of it (chunk_size elements):
//                        DDP all-reduces in place (out aliases packed); ZeRO reduce-scatters;
//                        ZeRO-1 all-reduces and takes its chunk.
//   reduce_in_place()    whether `out` is `packed` itself or a chunk-size buffer of its own.
//   publish()            how updated parameters reach every rank after this rank's shard was
//                        updated (ZeRO: all-gather the shards into the flat buffer; DDP: nothing,
//                        every rank updated everything).
//
// Everything else is shared: parameters moved into the bucketed flat buffer and broadcast from
// rank 0 at setup; bucket reductions launched from autograd hooks as buckets complete
// (overlap_comm) or all after backward, at most kMaxInFlight at once; each completed reduction
// handed to the Optimizer (Optimizer::accumulate_grad, region = bucket index); gradient
// accumulation either without communication until the last micro-batch ("no_sync": autograd
// accumulates param.grad) or reduced every micro-batch ("reduce_each": no full-size gradient
// survives a micro-batch); finish_grads() (the optimizer's squares; disjoint when shards > 1);
// update() (the optimizer's step into param_shard(), then publish()); memory accounting;
// checkpoint layout. The step's policy (norm, skip, clip, the early-update offer) is the core's.
// Layer boundaries (Sharding::before_group/after_group) are ignored: parameters stay whole.
//
// The shard of rank r is chunk `shard_index` of every bucket, in bucket order (FlatBuckets::
// shard_*). With shards == 1 the shard is the whole flat buffer, and the optimizer writes updated
// parameters straight into it. A world of one rank reduces nothing: reduce() is never called, and
// buckets are packed in the parameter dtype — the gradients exactly as autograd produced them —
// and handed to the optimizer as they are (OptimizerSetup::grad_dtype = the parameter dtype).
//
// Threading and failure: as ciuic/sharding.h says.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include <ciuic/comm.h>
#include <ciuic/config.h>
#include <ciuic/kit/flat_buckets.h>
#include <ciuic/optimizer.h>
#include <ciuic/plan.h>
#include <ciuic/plugin.h>
#include <ciuic/precision.h>
#include <ciuic/sharding.h>

namespace ciuic::kit {

class BucketSharding : public Sharding {
 public:
  // Reductions in flight before the oldest is completed (see retire()): enough to keep the comm
  // stream busy while backward produces the next buckets. (plan_buckets() counts on it.)
  static constexpr size_t kMaxInFlight = 3;

  struct Options {
    int64_t bucket_elements = 0;  // required (>= 1)
    bool overlap_comm = true;
    bool reduce_each_micro_batch = true;  // false: "no_sync"
    // With reduce_each: the share of the gradient (whole buckets in backward order, up to this
    // percent of the elements) accumulated on the device across micro-batches and reduced once,
    // after the last, as no_sync does; the other buckets are reduced every micro-batch.
    int64_t local_percent = 0;
    int64_t shards = 1;       // chunks per bucket (world size for ZeRO)
    int64_t shard_index = 0;  // this rank's chunk
  };

  // The options every bucketed strategy declares in its recipe section, each with the strategy's
  // own default and help: reduce_bucket_size (elements, float or int, >= 1), overlap_comm (bool),
  // grad_accumulation ("reduce_each" | "no_sync"; a strategy may declare
  // "auto|no_sync|reduce_each" with kOptionPlanned — accumulation_option() — and the core then
  // chooses before the Config gets here; "auto" itself is refused). A strategy lists the three
  // in its option array (and kLocalAccumulationOption when it offers it) and passes the same
  // declarations here, so the kit reads exactly the keys, types and defaults the strategy declared.
  struct OptionDecls {
    Option<double> reduce_bucket_size;
    Option<bool> overlap_comm;
    Option<std::string> grad_accumulation;
  };
  // Reads them (typed, Config::get), and local_accumulation_percent when the section has it
  // (integer 0-100, Options::local_percent; may be kOptionPlanned the same way). Failure: a
  // UsageError through Config::fail naming the key.
  static Options options_from(const Config& config, const OptionDecls& decls);
  // The declaration of grad_accumulation (kOptionPlanned, "auto|no_sync|reduce_each") with the
  // strategy's default, for its OptionDecls.
  static constexpr Option<std::string> accumulation_option(const char* default_value) {
    return Option<std::string>{
        "grad_accumulation",
        default_value,
        "reduce_each: reduce every micro-batch's gradient as backward produces it, into the "
        "optimizer's fp32 accumulator (no full-size gradient kept; DeepSpeed's ZeRO-2); no_sync: "
        "accumulate on the device in the parameter dtype and reduce once, after the last "
        "micro-batch (a full-size gradient on the device); auto: no_sync when the memory plan "
        "fits, else reduce_each",
        NAN,
        NAN,
        "auto|no_sync|reduce_each",
        kOptionPlanned};
  }
  // The declaration of local_accumulation_percent (kOptionPlanned, 0-100, default 0), for a
  // strategy's option array.
  static constexpr Option<int64_t> kLocalAccumulationOption{
      "local_accumulation_percent",
      "0",
      "with reduce_each and gradient accumulation: this share of the gradient (whole buckets, up "
      "to this "
      "percent of the elements) accumulates on the device in the parameter dtype and is reduced "
      "once, after "
      "the last micro-batch (as no_sync); the rest every micro-batch. 0: plain reduce_each; auto: "
      "the "
      "largest share whose memory plan fits",
      0,
      100,
      nullptr,
      kOptionPlanned};
  // The planner's answer (ciuic/plan.h) for a strategy with these options: the whole parameters on
  // every rank, reductions in flight, gradients not yet reduced; sets shard_numel and
  // grad_chunk_elements. `shards` chunks per bucket; `chunk_buffers`: whether a reduction needs a
  // chunk-size output besides the packed bucket (reduce_in_place() false).
  static void plan_buckets(const Config& config, const OptionDecls& decls, PlanContext& plan,
                           int64_t shards, bool chunk_buffers);
  ~BucketSharding() override;

  void setup(const ShardingSetup& setup) override;
  void begin_micro_batch(int64_t index, bool last) override;
  GradSquares finish_grads() override;
  void update(const OptimizerStep& args) override;
  ShardingMemory memory() const override;
  std::vector<ShardSlice> layout() const override;
  void save_state(StateDict& out) const override;
  void load_state(const SliceFetcher& fetch, int64_t t) override;
  void append_metrics(Metrics& out) const override;

 protected:
  explicit BucketSharding(const Options& options);

  // See the header comment. Called on autograd's thread (overlap_comm) or the training thread.
  virtual std::unique_ptr<Work> reduce(at::Tensor& packed, at::Tensor& out) = 0;
  virtual bool reduce_in_place() const = 0;
  // Makes every rank's parameters current from the updated shards (param_shard() of each rank).
  virtual void publish() = 0;

  Comm& comm() { return *comm_; }
  FlatBuckets& buckets() { return *buckets_; }
  // This rank's shard of the parameters in the parameter dtype (the optimizer's params_out): the
  // flat buffer itself when shards == 1, else a buffer that exists only during update() and
  // load_state() (publish() reads it), so it costs no memory while activations are alive.
  at::Tensor& param_shard() { return param_shard_; }
  const Options& opts() const { return options_; }

 private:
  struct Pending {
    int bucket;
    std::unique_ptr<Work> work;
    at::Tensor packed;
    at::Tensor out;
  };
  void on_bucket_ready(int bucket);
  void launch(int bucket);
  // Completes the oldest reductions (wait, hand the chunk to the optimizer, free the bucket's
  // buffers) until at most `keep` are in flight, and any finished ones beyond that: the
  // gradients' memory stays bounded by a few buckets instead of the whole model.
  void retire(size_t keep);
  void drain();
  void acquire_param_shard();
  void release_param_shard();

  Options options_;
  Comm* comm_ = nullptr;
  Precision* precision_ = nullptr;
  Optimizer* optimizer_ = nullptr;
  std::unique_ptr<FlatBuckets> buckets_;
  at::Tensor param_shard_;  // param dtype; aliases the flat buffer when shards == 1
  std::mutex pending_mu_;
  std::vector<Pending> pending_;
  std::vector<int> deferred_;  // buckets completed while !overlap_comm, launched after backward
  bool last_micro_batch_ = true;
  std::vector<char> local_;      // per bucket: accumulated on the device until the last micro-batch
  std::vector<char> not_local_;  // its complement: what a micro-batch before the last reduces
  at::ScalarType grad_dtype_ =
      at::kFloat;       // what buckets are packed in (OptimizerSetup::grad_dtype)
  bool alone_ = false;  // one rank, one shard: nothing to reduce
  int64_t micro_batches_ = 0;
  uint64_t peak_pending_bytes_ = 0;
  uint64_t pending_bytes_ = 0;
  // Host wall time of the last step's phases, in metrics as step_<phase>_s: drain
  // (finish_grads(): the remaining reductions and the optimizer's finish_grads(), exposed gradient
  // time), update (the optimizer's step), publish (making parameters current: ZeRO-2's
  // all-gather). On a GPU, phases that only enqueue work measure the enqueueing.
  struct PhaseTimes {
    double drain_s = 0, update_s = 0, publish_s = 0;
  } phase_;
};

}  // namespace ciuic::kit
