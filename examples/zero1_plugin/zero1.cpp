// sharding/zero1 — ZeRO stage 1, written against the installed SDK and the optim kit: gradients
// are all-reduced (every rank gets the whole reduced bucket, as in DDP) and each rank keeps only
// the optimizer state of its chunk of every bucket (as in ZeRO-2); after the update the ranks
// all-gather their chunks into the flat parameter buffer.
//
// BucketSharding (ciuic/kit/bucket_sharding.h) leaves three decisions: how a bucket is reduced
// (here an all-reduce in place), whether the reduction writes into the packed bucket itself (yes:
// the kit then hands the optimizer this rank's chunk of it), and how updated parameters reach
// every rank (an all-gather of the chunks).
#define CIUIC_PLUGIN_API 7
#include <ciuic/config.h>
#include <ciuic/context.h>
#include <ciuic/kit/bucket_sharding.h>
#include <ciuic/plugin.h>

namespace {

// The bucket options the kit reads (ciuic::kit::BucketSharding::OptionDecls), declared with this
// strategy's defaults and help, and listed as its options.
constexpr ciuic::kit::BucketSharding::OptionDecls kBucket{
    {"reduce_bucket_size", "5e8",
     "elements per gradient bucket (one all-reduce and one all-gather each)", 1, NAN},
    {"overlap_comm", "true", "launch each bucket's all-reduce as soon as backward completes it"},
    {"grad_accumulation", "\"reduce_each\"",
     "reduce_each: reduce every micro-batch into the optimizer's gradient shard; no_sync: "
     "accumulate locally and reduce after the last",
     NAN, NAN, "reduce_each|no_sync"}};
const ciuic::OptionSpec kOptions[] = {kBucket.reduce_bucket_size, kBucket.overlap_comm,
                                      kBucket.grad_accumulation};

class Zero1 final : public ciuic::kit::BucketSharding {
 public:
  Zero1(const ciuic::Config& cfg, const ciuic::RunContext& ctx)
      : BucketSharding(with_world(options_from(cfg, kBucket), ctx)) {}

 protected:
  std::unique_ptr<ciuic::Work> reduce(at::Tensor& packed, at::Tensor& /*out = packed*/) override {
    return comm().all_reduce(packed, ciuic::ReduceOp::kSum);
  }
  bool reduce_in_place() const override { return true; }
  void publish() override {
    auto& fb = buckets();
    std::vector<std::unique_ptr<ciuic::Work>> works;
    for (size_t b = 0; b < fb.buckets().size(); ++b) {
      const auto& bk = fb.buckets()[b];
      at::Tensor out = fb.flat().narrow(0, bk.offset, bk.numel);
      at::Tensor in =
          param_shard().narrow(0, fb.shard_offset(static_cast<int>(b)), bk.numel / opts().shards);
      works.push_back(comm().all_gather(out, in));
    }
    for (auto& w : works) w->wait();
  }

 private:
  static Options with_world(Options o, const ciuic::RunContext& ctx) {
    o.shards = ctx.world_size;
    o.shard_index = ctx.rank;
    return o;
  }
};

// The planner's answer: the kit's accounting, with reductions in place (no chunk buffers).
void plan(const ciuic::Config& cfg, ciuic::PlanContext& p) {
  ciuic::kit::BucketSharding::plan_buckets(cfg, kBucket, p, /*shards=*/p.world_size,
                                           /*chunk_buffers=*/false);
}

}  // namespace

CIUIC_DEFINE_PLUGIN_PLANNED(
    ciuic::Slot::kSharding, "zero1", "1.0.0",
    "ZeRO-1: optimizer state sharded, gradients all-reduced (an "
    "out-of-tree example on the optim kit)",
    kOptions,
    [](const ciuic::PluginArgs& a) -> ciuic::PluginObject* {
      return new Zero1(a.config, a.context);
    },
    plan)
