// sharding/zero2: ZeRO stage 2. Parameters live in a bucketed flat buffer (the model's tensors are
// views into it). Each bucket splits into world-size equal chunks; rank r owns chunk r of every
// bucket: its reduced gradient (reduce-scattered as backward completes the bucket, on the comm
// backend's stream, while backward goes on) and its fp32 master weights and Adam moments (in the
// After the update each rank all-gathers the updated
// chunks straight into the flat buffer. Any world size works: buckets are padded to a multiple of
// world_size * 64 elements.
#define CIUIC_PLUGIN_API 7
#include <ciuic/config.h>
#include <ciuic/context.h>
#include <ciuic/kit/bucket_sharding.h>

namespace {

constexpr ciuic::kit::BucketSharding::OptionDecls kBucket{
    {"reduce_bucket_size", "5e8",
     "elements per gradient bucket (one reduce-scatter and one all-gather each)", 1, NAN},
    {"overlap_comm", "true",
     "launch each bucket's reduce-scatter as soon as backward completes it"},
    ciuic::kit::BucketSharding::accumulation_option("\"reduce_each\"")};
const ciuic::OptionSpec kOptions[] = {kBucket.reduce_bucket_size, kBucket.overlap_comm,
                                      kBucket.grad_accumulation,
                                      ciuic::kit::BucketSharding::kLocalAccumulationOption};

class Zero2 final : public ciuic::kit::BucketSharding {
 public:
  Zero2(const ciuic::Config& cfg, const ciuic::RunContext& ctx)
      : BucketSharding(with_world(options_from(cfg, kBucket), ctx)) {}

 protected:
  std::unique_ptr<ciuic::Work> reduce(at::Tensor& packed, at::Tensor& out) override {
    return comm().reduce_scatter(out, packed, ciuic::ReduceOp::kSum);
  }
  bool reduce_in_place() const override { return false; }

  void publish() override {
    // One shard: the optimizer wrote its updated parameters straight into the flat buffer
    // (param_shard() is the flat buffer itself): nothing to gather.
    if (opts().shards == 1) return;
    auto& fb = buckets();
    std::vector<std::unique_ptr<ciuic::Work>> works;
    works.reserve(fb.buckets().size());
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

void plan(const ciuic::Config& cfg, ciuic::PlanContext& p) {
  ciuic::kit::BucketSharding::plan_buckets(cfg, kBucket, p, /*shards=*/p.world_size,
                                           /*chunk_buffers=*/true);
}

}  // namespace

CIUIC_DEFINE_PLUGIN_PLANNED(
    ciuic::Slot::kSharding, "zero2", "1.0.0",
    "ZeRO-2: gradients and optimizer state sharded, reduce-scatter "
    "overlapped with backward, all-gather into the flat parameter buffer",
    kOptions,
    [](const ciuic::PluginArgs& a) -> ciuic::PluginObject* {
      return new Zero2(a.config, a.context);
    },
    plan)
