// Test plugin data/blockdeal: a data source that breaks exactly one rule of ciuic/data.h, for the
// conformance kit's own test (tests/conformance: conformance_fails_block_dealing_test). Global row
// g holds tokens g, g + 1, ... (one document per row); its cursor {"row": g} and its resume are
// right, but rank k of W reads its micro-batch as a block — rows g + k * m ... g + k * m + m - 1 —
// instead of dealing rows g + k, g + k + W, ...: the same at world 1, other rows at world 2.
#define CIUIC_PLUGIN_API 7
#include <string>

#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/remainder.h>

#include <ciuic/config.h>
#include <ciuic/context.h>
#include <ciuic/data.h>
#include <ciuic/error.h>
#include <ciuic/plugin.h>

namespace {

class BlockDeal final : public ciuic::DataSource {
 public:
  explicit BlockDeal(const ciuic::RunContext& ctx) : ctx_(ctx) {}
  void open(const ciuic::DataOpenArgs& a) override { a_ = a; }
  ciuic::Batch next() override {
    const int64_t m = a_.micro_batch_size, T = a_.seq_len, W = ctx_.world_size, k = ctx_.rank;
    ciuic::Batch b;
    b.input_ids = at::empty({m, T}, at::kLong);
    for (int64_t j = 0; j < m; ++j) b.input_ids[j] = at::arange(T, at::kLong) + (row_ + k * m + j);
    b.labels = b.input_ids.remainder(1000);
    b.position_ids = at::arange(T, at::kLong).repeat({m, 1});
    b.num_label_tokens = m * T;
    b.num_documents = m;
    row_ += W * m;
    return b;
  }
  std::string cursor() const override { return "{\"row\":" + std::to_string(row_) + "}"; }
  void seek(const std::string& c) override {
    const size_t at = c.find(':');
    if (at == std::string::npos) throw ciuic::Error("data/blockdeal: bad cursor " + c);
    row_ = std::stoll(c.substr(at + 1));
  }
  int64_t epoch() const override { return 0; }

 private:
  const ciuic::RunContext& ctx_;
  ciuic::DataOpenArgs a_;
  int64_t row_ = 0;
};

}  // namespace

CIUIC_DEFINE_PLUGIN_NO_OPTIONS(ciuic::Slot::kData, "blockdeal", "0.1.0",
                               "rows dealt in blocks, not strided (a broken data source for tests)",
                               [](const ciuic::PluginArgs& a) -> ciuic::PluginObject* {
                                 return new BlockDeal(a.context);
                               })
