// Test plugin data/slow: a data source that takes its time — next() sleeps `sleep_s` on rank
// `sleep_rank` (-1: on every rank), so that tests can make one rank a straggler on data
// (tests/report/monitor_e2e_test.cpp) or slow a whole run down enough to watch it. Its rows are
// a pure function of the global row number (ids (row * 31 + k * 7) mod vocab_size, labels the
// next id, the last one -100), dealt to ranks like the shipped sources (rank r of W reads global
// rows r, r+W, ...). Built into build/test-plugins/slow/, never installed.
#define CIUIC_PLUGIN_API 7
#include <chrono>
#include <string>
#include <thread>

#include <ATen/ops/empty.h>

#include <ciuic/config.h>
#include <ciuic/context.h>
#include <ciuic/data.h>
#include <ciuic/error.h>

namespace {

constexpr ciuic::Option<int64_t> kVocab{"vocab_size", "64", "ids are drawn from [0, vocab_size)", 2,
                                        NAN};
constexpr ciuic::Option<int64_t> kSleepRank{"sleep_rank", "-1",
                                            "the rank that sleeps; -1 = every rank", -1, NAN};
constexpr ciuic::Option<double> kSleep{"sleep_s", "0.0", "seconds next() sleeps on sleep_rank", 0.0,
                                       60.0};
const ciuic::OptionSpec kOptions[] = {kVocab, kSleepRank, kSleep};

class SlowData final : public ciuic::DataSource {
 public:
  SlowData(const ciuic::Config& c, const ciuic::RunContext& ctx)
      : vocab_(c.get(kVocab)), rank_(ctx.rank), world_(ctx.world_size) {
    const int64_t who = c.get(kSleepRank);
    sleep_s_ = who < 0 || who == rank_ ? c.get(kSleep) : 0.0;
  }
  void open(const ciuic::DataOpenArgs& a) override {
    seq_ = a.seq_len;
    micro_ = a.micro_batch_size;
  }
  ciuic::Batch next() override {
    if (sleep_s_ > 0) std::this_thread::sleep_for(std::chrono::duration<double>(sleep_s_));
    at::Tensor all = at::empty({3, micro_, seq_}, at::TensorOptions().dtype(at::kLong));
    ciuic::Batch b;
    b.input_ids = all[0];
    b.labels = all[1];
    b.position_ids = all[2];
    for (int64_t i = 0; i < micro_; ++i) {
      const int64_t row = row_ * world_ + rank_;
      ++row_;
      int64_t* ids = b.input_ids.data_ptr<int64_t>() + i * seq_;
      int64_t* labels = b.labels.data_ptr<int64_t>() + i * seq_;
      int64_t* pos = b.position_ids.data_ptr<int64_t>() + i * seq_;
      for (int64_t k = 0; k < seq_; ++k) {
        ids[k] = (row * 31 + k * 7) % vocab_;
        pos[k] = k;
      }
      for (int64_t k = 0; k + 1 < seq_; ++k) labels[k] = ids[k + 1];
      labels[seq_ - 1] = -100;
      b.num_label_tokens += seq_ - 1;
      b.num_documents += 1;
    }
    return b;
  }
  std::string cursor() const override { return std::to_string(row_); }
  void seek(const std::string& cursor) override { row_ = std::stoll(cursor); }

 private:
  int64_t vocab_;
  int rank_, world_;
  double sleep_s_ = 0;
  int64_t seq_ = 0, micro_ = 0, row_ = 0;
};

}  // namespace

CIUIC_DEFINE_PLUGIN(ciuic::Slot::kData, "slow", "0.1.0",
                    "data source that sleeps on one rank (tests)", kOptions,
                    [](const ciuic::PluginArgs& a) -> ciuic::PluginObject* {
                      return new SlowData(a.config, a.context);
                    })
