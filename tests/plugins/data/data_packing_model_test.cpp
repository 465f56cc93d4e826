// Packing is invisible to the model: the loss of a packed cached_ssd row (several documents,
// position_ids restarting at each) equals the sum of the losses of its documents run one by one —
// with ciuic's Llama (core/src/model), block-diagonal attention. The same row run as one unpacked
// sequence gives another loss, so the comparison would catch a leak across documents.
#include <gtest/gtest.h>

#include <ATen/ops/arange.h>

#include <nlohmann/json.hpp>

#include "data_test_support.h"
#include "model/config.h"
#include "model/llama.h"

namespace ciuic::testdata {
namespace {

TEST(PackingWithModel, PackedLossEqualsDocumentsOneByOne) {
  const std::string dir = temp_dir("packing_model");
  std::string docs;
  for (const char* t : {"ab", "cdefg", "hij", "klmnopq", "rs"})
    docs += nlohmann::json{{"text", t}}.dump() + "\n";
  write_file(dir + "/d.jsonl", docs);
  RunContext ctx = make_context(dir);
  ByteTokenizer tok;
  auto src = registry().create<DataSource>(
      Slot::kData, "cached_ssd",
      Config::from_toml("data", "sources = [\"d.jsonl\"]\nshuffle = false\n"), ctx);
  DataOpenArgs a;
  a.seq_len = 32;
  a.micro_batch_size = 1;
  a.tokenizer = &tok;
  src->open(a);
  Batch b = src->next();
  ASSERT_EQ(b.num_documents, 5);  // 4 + 7 + 5 + 9 + 4 = 29 tokens, padding after

  nlohmann::json cfg_json = {{"vocab_size", 262},
                             {"hidden_size", 32},
                             {"intermediate_size", 64},
                             {"num_hidden_layers", 2},
                             {"num_attention_heads", 4},
                             {"num_key_value_heads", 2},
                             {"max_position_embeddings", 64},
                             {"rope_theta", 10000.0},
                             {"rms_norm_eps", 1e-6},
                             {"tie_word_embeddings", false}};
  model::LlamaModel m(model::LlamaConfig::from_json(cfg_json, "test"), at::kFloat, c10::kCPU);
  m.init_random(3, 0.3);

  const double packed = m.loss_sum(b.input_ids, b.labels, b.position_ids, true).item<double>();
  double one_by_one = 0;
  auto pos = b.position_ids[0];
  int64_t start = 0;
  for (int64_t t = 1; t <= a.seq_len; ++t) {
    if (t == a.seq_len || pos[t].item<int64_t>() == 0) {
      auto sl = [&](const at::Tensor& x) { return x.slice(1, start, t); };
      one_by_one +=
          m.loss_sum(sl(b.input_ids), sl(b.labels), sl(b.position_ids), false).item<double>();
      start = t;
    }
  }
  EXPECT_NEAR(packed, one_by_one, 1e-5 * std::abs(one_by_one));
  const double unpacked =
      m.loss_sum(b.input_ids, b.labels, at::arange(a.seq_len, at::kLong).unsqueeze(0), false)
          .item<double>();
  EXPECT_GT(std::abs(unpacked - one_by_one), 1e-3 * std::abs(one_by_one))
      << "the check has no power";
}

}  // namespace
}  // namespace ciuic::testdata
