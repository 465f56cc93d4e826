// sharding/ddp: every rank holds all parameters, gradients and optimizer state. Gradient buckets
// are all-reduced (SUM) as backward completes them; every rank then applies the same update to
// the whole flat buffer. At world size 1 this is plain single-process training.
#define CIUIC_PLUGIN_API 7
#include <ciuic/config.h>
#include <ciuic/context.h>
#include <ciuic/kit/bucket_sharding.h>

namespace {

constexpr ciuic::kit::BucketSharding::OptionDecls kBucket{
    {"reduce_bucket_size", "2.5e7", "elements per gradient bucket (one all-reduce each)", 1, NAN},
    {"overlap_comm", "true", "launch each bucket's all-reduce as soon as backward completes it"},
    ciuic::kit::BucketSharding::accumulation_option("\"no_sync\"")};
const ciuic::OptionSpec kOptions[] = {kBucket.reduce_bucket_size, kBucket.overlap_comm,
                                      kBucket.grad_accumulation,
                                      ciuic::kit::BucketSharding::kLocalAccumulationOption};

class Ddp final : public ciuic::kit::BucketSharding {
 public:
  explicit Ddp(const ciuic::Config& cfg) : BucketSharding(options_from(cfg, kBucket)) {}

 protected:
  std::unique_ptr<ciuic::Work> reduce(at::Tensor& packed, at::Tensor& /*out = packed*/) override {
    return comm().all_reduce(packed, ciuic::ReduceOp::kSum);
  }
  bool reduce_in_place() const override { return true; }
  void publish() override {}  // the optimizer wrote the whole flat buffer on every rank
};

void plan(const ciuic::Config& cfg, ciuic::PlanContext& p) {
  ciuic::kit::BucketSharding::plan_buckets(cfg, kBucket, p, /*shards=*/1, /*chunk_buffers=*/false);
}

}  // namespace

CIUIC_DEFINE_PLUGIN_PLANNED(
    ciuic::Slot::kSharding, "ddp", "1.0.0",
    "data parallel: bucketed all-reduce overlapped with backward", kOptions,
    [](const ciuic::PluginArgs& a) -> ciuic::PluginObject* { return new Ddp(a.config); }, plan)
