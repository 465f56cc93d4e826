// ciuic/kit/flat_buckets.h — part of the optim kit (libciuic_optim_kit.a, a static library that
// sharding plugins link; not part of the SDK's ABI): a flat parameter buffer laid out in gradient
// buckets, and autograd hooks that report when a bucket's gradients are final.
//
// Layout. Parameters are taken in REVERSE forward order (the order backward produces their
// gradients) and grouped into buckets of about `bucket_elements` elements (a parameter is never
// split; a parameter larger than the bucket size gets a bucket of its own). Each bucket's size is
// padded up to a multiple of `pad_multiple * align_elements`, so that it splits into
// `pad_multiple` equal, aligned chunks (ZeRO: pad_multiple = world size, chunk r belongs to rank
// r). The buckets lie one after another in one flat buffer of the parameters' dtype; every
// parameter tensor is re-pointed (set_data) to a view into it, so the model keeps using the same
// tensor objects.
//
// Hooks. install_hooks() registers a post-accumulate-grad hook on every parameter. During a
// backward pass that the owner has armed (arm(true)), when all parameters of a bucket have
// accumulated their gradient (param.grad, allocated by autograd), `on_ready(bucket)` is called —
// strictly in bucket order 0, 1, 2, ... (a bucket that completes early is held back until its
// predecessors are delivered), so every rank issues its collectives in the same order. flush()
// delivers the buckets still pending (parameters that got no gradient count as zero). A
// parameter whose gradient arrives after its bucket was delivered is an error (it would be lost).
//
// Threading: hooks run on autograd's thread for the device (the caller's thread on CPU); the
// callback must only enqueue work. arm()/flush()/pack_grads() are called from the training thread
// between backward passes, or from the callback for the bucket it is given.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include <ciuic/optimizer.h>
#include <ciuic/sharding.h>

namespace ciuic::kit {

class FlatBuckets {
 public:
  struct Options {
    int64_t bucket_elements = 0;  // required (>= 1): each plugin declares its own default
    int64_t pad_multiple = 1;     // number of equal chunks each bucket splits into
    int64_t align_elements = 64;  // each chunk's size is a multiple of this
  };
  struct Member {
    int param_index = 0;  // index into params()
    int64_t offset = 0;   // within the bucket
    int64_t numel = 0;
  };
  struct Bucket {
    int64_t offset = 0;           // within the flat buffer
    int64_t numel = 0;            // padded size (multiple of pad_multiple * align_elements)
    int64_t used = 0;             // elements holding parameters; [used, numel) is padding
    std::vector<Member> members;  // in bucket order
  };

  // Lays out `params` (all of one dtype and device, requires_grad leaves) and moves their values
  // into the flat buffer.
  FlatBuckets(std::vector<ShardingParam> params, const Options& options);
  ~FlatBuckets();
  FlatBuckets(const FlatBuckets&) = delete;
  FlatBuckets& operator=(const FlatBuckets&) = delete;

  const std::vector<ShardingParam>& params() const { return params_; }
  const std::vector<Bucket>& buckets() const { return buckets_; }
  const Options& options() const { return options_; }
  at::Tensor& flat() { return flat_; }
  // Whether the constructor parked the parameters in host memory to build the flat buffer (the
  // device, or its memory cap, had no room for the model twice).
  bool parked() const { return parked_; }
  int64_t total_numel() const { return flat_.numel(); }  // padded
  int64_t used_numel() const;                            // sum of parameter sizes

  // Registers the hooks; `on_ready(b)` is called as described above.
  void install_hooks(std::function<void(int)> on_ready);
  // Starts a backward pass. armed = false: hooks only let autograd accumulate into param.grad
  // (gradient accumulation without communication); armed = true: buckets are delivered.
  void arm(bool armed);
  // Same, bucket by bucket: bucket b is delivered in this pass when armed[b] (one entry per
  // bucket); the others only accumulate, and the buckets that are delivered keep their order.
  void arm(const std::vector<char>& armed);
  // Delivers, in order, every armed bucket not yet delivered in this pass. Returns how many.
  int flush();
  // The bucket's gradients concatenated into a new tensor of `dtype` (padding zero). With
  // `release`, each parameter's .grad is reset afterwards to free its memory.
  at::Tensor pack_grads(int bucket, at::ScalarType dtype, bool release);

  // Per-element weight-decay segments of chunk `chunk_index` of every bucket, concatenated in
  // bucket order (the shard layout ZeRO uses); with pad_multiple 1 and chunk 0, the whole buffer.
  std::vector<ShardSegment> shard_segments(int64_t chunk_index) const;
  // Which parameter elements chunk `chunk_index` of every bucket holds, in the same shard order.
  std::vector<ShardSlice> shard_slices(int64_t chunk_index) const;
  // Elements per shard (sum over buckets of the chunk size).
  int64_t shard_numel() const;
  // Offset of bucket b's chunk within a shard.
  int64_t shard_offset(int bucket) const { return shard_offsets_.at(bucket); }

 private:
  // Moves the parameters into flat_ through one page-locked host buffer (the device has no room
  // for the model twice); flat_ then holds them, padding zero.
  void park_in_host_memory(int64_t numel, at::ScalarType dtype);

  struct HookState;
  std::vector<ShardingParam> params_;
  Options options_;
  std::vector<Bucket> buckets_;
  std::vector<int64_t> shard_offsets_;
  std::vector<int> param_bucket_;  // param index -> bucket index
  at::Tensor flat_;
  bool parked_ = false;
  std::shared_ptr<HookState> hooks_;
};

}  // namespace ciuic::kit
