// ciuic/bucket_sharding.h — a Sharding skeleton for bucketed data-parallel strategies.
//
// BucketSharding implements the Sharding protocol (ciuic/sharding.h) on top of FlatBuckets and
// leaves a strategy exactly two decisions:
//
//   reduce(packed, out)  how one bucket's packed gradient (reduce dtype, bucket size) is combined
//                        across ranks into `out`, this rank's part of it (chunk_size elements):
//                        DDP all-reduces in place (out aliases packed); ZeRO reduce-scatters.
//   publish()            how updated parameters reach every rank after this rank's shard was
//                        updated (ZeRO: all-gather the shards into the flat buffer; DDP: nothing,
//                        every rank updated everything).
//
// Everything else is shared: parameters moved into the bucketed flat buffer and broadcast from
// rank 0 at setup; bucket reductions launched from autograd hooks as buckets complete
// (overlap_comm) or all after backward; gradient accumulation either without communication until
// the last micro-batch ("no_sync": autograd accumulates param.grad) or reduced every micro-batch
// into the fp32 shard accumulator ("reduce_each": no full-size gradient survives a micro-batch);
// the global norm / overflow check; precision.update(); clipping; the update through the Offload;
// memory accounting; checkpoint layout.
//
// The shard of rank r is chunk `shard_index` of every bucket, in bucket order (FlatBuckets::
// shard_*). With shards == 1 the shard is the whole flat buffer, and the Offload writes updated
// parameters straight into it.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include <ciuic/comm.h>
#include <ciuic/flat_buckets.h>
#include <ciuic/offload.h>
#include <ciuic/precision.h>
#include <ciuic/sharding.h>

namespace ciuic {

class Config;
class HostAccumulator;

class CIUIC_API BucketSharding : public Sharding {
 public:
  // Reductions in flight before the oldest is completed (see retire()): enough to keep the comm
  // stream busy while backward produces the next buckets. (The memory planner counts on it.)
  static constexpr size_t kMaxInFlight = 3;

  struct Options {
    int64_t bucket_elements = 50'000'000;
    bool overlap_comm = true;
    bool reduce_each_micro_batch = true;  // false: "no_sync"
    int64_t shards = 1;                   // chunks per bucket (world size for ZeRO)
    int64_t shard_index = 0;              // this rank's chunk
  };

  // Reads the options every bucketed strategy shares from its recipe section:
  // reduce_bucket_size (elements, float or int), overlap_comm (bool), grad_accumulation
  // ("reduce_each" | "no_sync").
  static Options options_from(const Config& config);
  ~BucketSharding() override;

  void setup(const ShardingSetup& setup) override;
  void begin_micro_batch(int64_t index, bool last) override;
  StepResult step(const StepInput& input) override;
  ShardingMemory memory() const override;
  std::vector<ShardSlice> layout() const override;
  void save_state(StateDict& out) const override;
  void load_state(const SliceFetcher& fetch) override;
  void append_metrics(Metrics& out) const override;

 protected:
  explicit BucketSharding(const Options& options);

  // See the header comment. Called on autograd's thread (overlap_comm) or the training thread.
  virtual std::unique_ptr<Work> reduce(at::Tensor& packed, at::Tensor& out) = 0;
  // Whether `out` is `packed` itself (in-place reduction) or needs its own chunk-size buffer.
  virtual bool reduce_in_place() const = 0;
  // Makes every rank's parameters current from the updated shards (param_shard() of each rank).
  virtual void publish() = 0;

  Comm& comm() { return *comm_; }
  FlatBuckets& buckets() { return *buckets_; }
  // This rank's shard of the parameters in the parameter dtype (the Offload's params_out): the
  // flat buffer itself when shards == 1, else a buffer that exists only during step() and
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
  // Completes the oldest reductions (wait, accumulate into the gradient shard, free the bucket's
  // buffers) until at most `keep` are in flight, and any finished ones beyond that: the
  // gradients' memory stays bounded by a few buckets instead of the whole model.
  void retire(size_t keep);
  void drain();

  Options options_;
  Comm* comm_ = nullptr;
  Precision* precision_ = nullptr;
  Offload* offload_ = nullptr;
  std::unique_ptr<FlatBuckets> buckets_;
  at::Tensor grad_shard_;   // fp32 accumulator of this rank's reduced gradient
  // Offload::wants_host_grad(): grad_shard_ lives in host memory (pinned on CUDA), and reduced
  // chunks are folded into it by host_acc_'s thread (sharding/host_accumulator.h) from
  // host_stage_, a pinned copy in the reduce dtype (CUDA; on CPU the chunks are read in place).
  bool host_grad_ = false;
  std::unique_ptr<HostAccumulator> host_acc_;
  at::Tensor host_stage_;
  double host_sum_sq_ = 0;  // this step's, from host_acc_ (the last micro-batch's chunks)
  double host_busy_s_ = 0, host_blocked_s_ = 0;  // last step: host_acc_->take_times()
  at::Tensor param_shard_;  // param dtype; aliases the flat buffer when shards == 1
  void acquire_param_shard();
  void release_param_shard();
  std::mutex pending_mu_;
  std::vector<Pending> pending_;
  std::vector<int> deferred_;  // buckets completed while !overlap_comm, launched after backward
  bool last_micro_batch_ = true;
  int64_t micro_batches_ = 0;
  uint64_t peak_pending_bytes_ = 0;
  uint64_t pending_bytes_ = 0;
  double last_grad_norm_ = 0.0;
  // Device path: this step's sum of squared reduced gradients, accumulated (fp64, on the device)
  // as retire() completes each bucket's reduction, while backward still runs, so that step()
  // needs no pass over the shard. Valid while every element has one contribution this step (one
  // micro-batch, or "no_sync"); with several reduced micro-batches step() takes the norm of the
  // shard (on the device). The host path gets its squares from the fold (host_sum_sq_).
  at::Tensor sum_sq_;
  bool sum_sq_valid_ = false;
  void add_squares(const at::Tensor& reduced);
  // Host wall time of the last step()'s phases, in metrics as step_<phase>_s: drain (the
  // remaining reductions, and with a host optimizer the wait for the copies and folds still
  // queued: exposed transfer time), norm (global gradient norm, one all-reduce and a read-back), update (the
  // offload's step: AdamW and its own copies), publish (making parameters current: ZeRO-2's
  // all-gather). On a GPU, phases that only enqueue work measure the enqueueing.
  struct PhaseTimes {
    double drain_s = 0, norm_s = 0, update_s = 0, publish_s = 0;
  } phase_;
};

}  // namespace ciuic
