// `lines`: a data plugin that trains on a plain text file, one document per non-empty line,
// written against the installed SDK and the data kit (docs/plugins.md, "A data plugin").
//
// Each line becomes the tokenizer's encoding with its special tokens (BOS, as the tokenizer's
// post-processor adds it) followed by EOS, every token a training target: the same documents
// cached_ssd makes of {"text": line} with its defaults, so both give the same batches
// (sdk_examples_test checks that). Everything after the documents is the kit's PackedStream.
#define CIUIC_PLUGIN_API 7
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ciuic/config.h>
#include <ciuic/context.h>
#include <ciuic/data.h>
#include <ciuic/error.h>
#include <ciuic/files.h>
#include <ciuic/kit/packed_stream.h>
#include <ciuic/metrics.h>
#include <ciuic/plugin.h>
#include <ciuic/tokenizer.h>

namespace {

using ciuic::kit::DocView;
using ciuic::kit::PackedStream;
using ciuic::kit::PackMode;
using ciuic::kit::StreamArgs;

constexpr ciuic::Option<std::string> kPath{
    "path", nullptr, "text file, one document per line (relative to the recipe)"};
constexpr ciuic::Option<std::string> kEvalPath{"eval_path", "\"\"",
                                               "held-out text file (\"\" = no eval split)"};
constexpr ciuic::Option<std::string> kPacking{
    "packing",
    "\"whole\"",
    "whole: documents packed whole; split: cut at row ends and continued; pad: one per row",
    NAN,
    NAN,
    "whole|split|pad"};
constexpr ciuic::Option<bool> kShuffle{"shuffle", "true", "reshuffle the documents every epoch"};
constexpr ciuic::Option<int64_t> kPrefetchBatches{
    "prefetch_batches", "4", "batches prepared ahead on a background thread", 0, 1024};
const ciuic::OptionSpec kOptions[] = {kPath, kEvalPath, kPacking, kShuffle, kPrefetchBatches};

// One split's documents: token ids and a loss mask (all ones) per line.
struct Documents {
  std::vector<std::vector<uint32_t>> ids;
  std::vector<std::vector<uint8_t>> mask;
};

class Lines final : public ciuic::DataSource {
 public:
  Lines(const ciuic::Config& config, const ciuic::RunContext& ctx)
      : ctx_(ctx),
        config_(config),
        path_(resolve(ctx, config.get(kPath))),
        eval_path_(config.get(kEvalPath).empty() ? "" : resolve(ctx, config.get(kEvalPath))) {
    const std::string p = config.get(kPacking);
    settings_.who = "data plugin lines";
    settings_.mode = p == "split" ? PackMode::kPackSplit
                     : p == "pad" ? PackMode::kPad
                                  : PackMode::kPackWhole;
    settings_.shuffle = config.get(kShuffle);
    settings_.prefetch_batches = static_cast<size_t>(config.get(kPrefetchBatches));
  }

  void open(const ciuic::DataOpenArgs& a) override {
    if (!a.tokenizer)
      throw ciuic::UsageError(
          "data plugin lines needs the model's tokenizer: set [model] tokenizer or [model] path");
    read(path_, *a.tokenizer, 0);
    if (!eval_path_.empty()) read(eval_path_, *a.tokenizer, 1);
    if (docs_[0].ids.empty()) config_.fail(kPath.key(), path_ + " has no non-empty line");
    settings_.pad_id = a.tokenizer->eos_id().value_or(0);
    std::vector<uint32_t> train, eval;
    for (uint32_t i = 0; i < docs_[0].ids.size(); ++i) train.push_back(i);
    // Eval documents are numbered after the training ones: one lookup serves both splits.
    for (uint32_t i = 0; i < docs_[1].ids.size(); ++i)
      eval.push_back(static_cast<uint32_t>(docs_[0].ids.size()) + i);
    stream_ = std::make_unique<PackedStream>(
        StreamArgs(a, ctx_), settings_, std::move(train), std::move(eval), [this](uint32_t d) {
          const size_t n = docs_[0].ids.size();
          const Documents& s = docs_[d < n ? 0 : 1];
          const size_t k = d < n ? d : d - n;
          return DocView{s.ids[k].data(), s.mask[k].data(), static_cast<uint32_t>(s.ids[k].size())};
        });
  }

  ciuic::Batch next() override { return stream().next(); }
  std::string cursor() const override { return stream().cursor(); }
  void seek(const std::string& cursor) override { stream().seek(cursor); }
  int64_t epoch() const override { return stream().epoch(); }
  bool has_eval() const override { return stream_ && stream_->has_eval(); }
  void begin_eval() override { stream().begin_eval(); }
  std::optional<ciuic::Batch> next_eval() override { return stream().next_eval(); }
  void append_metrics(ciuic::Metrics& m) const override {
    if (stream_) stream_->append_metrics(m);
  }

 private:
  static std::string resolve(const ciuic::RunContext& ctx, const std::string& p) {
    // Plugin paths are the plugin's to resolve: relative to the recipe's folder.
    return p.empty() || p[0] == '/' || ctx.recipe_dir.empty() ? p : ctx.recipe_dir + "/" + p;
  }

  void read(const std::string& file, const ciuic::Tokenizer& tok, int split) {
    const std::string text = ciuic::read_input(file, "lines file", 1ull << 30);
    const std::optional<int32_t> eos = tok.eos_id();
    size_t at = 0;
    while (at < text.size()) {
      size_t end = text.find('\n', at);
      if (end == std::string::npos) end = text.size();
      const std::string_view line(text.data() + at, end - at);
      at = end + 1;
      if (line.empty()) continue;
      std::vector<int32_t> t = tok.encode(line, /*add_special_tokens=*/true);
      if (eos && (t.empty() || t.back() != *eos)) t.push_back(*eos);
      docs_[split].ids.emplace_back(t.begin(), t.end());
      docs_[split].mask.emplace_back(t.size(), uint8_t{1});
    }
  }

  PackedStream& stream() const {
    if (!stream_) throw ciuic::Error("data plugin lines: used before open()");
    return *stream_;
  }

  const ciuic::RunContext& ctx_;  // rank, world size and seed for the stream (outlives the source)
  ciuic::Config config_;
  std::string path_, eval_path_;
  PackedStream::Settings settings_;
  Documents docs_[2];
  std::unique_ptr<PackedStream> stream_;
};

}  // namespace

CIUIC_DEFINE_PLUGIN(ciuic::Slot::kData, "lines", "1.0.0",
                    "plain text, one document per line (an SDK example)", kOptions,
                    [](const ciuic::PluginArgs& a) -> ciuic::PluginObject* {
                      return new Lines(a.config, a.context);
                    })
