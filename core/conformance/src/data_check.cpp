// check_data (ciuic/testing/conformance.h): every rank of every world size opened in this process,
// one after the other, held to the rows the plugin yields at world size 1 (global dealing,
// ciuic/data.h) and to its own uninterrupted stream (cursors).
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <ciuic/data.h>
#include <ciuic/error.h>
#include <ciuic/store.h>
#include <ciuic/testing/conformance.h>
#include <ciuic/tokenizer.h>

#include "support.h"
#include "tokenizer/factory.h"

namespace ciuic::conformance {
namespace {

// One row of a batch: ids, labels and positions.
struct Row {
  std::vector<int64_t> ids, labels, pos;
  bool operator==(const Row&) const = default;
  bool padding() const {
    return std::all_of(labels.begin(), labels.end(), [](int64_t l) { return l == -100; });
  }
};

std::vector<int64_t> row_of(const at::Tensor& t, int64_t i) {
  const at::Tensor r = t[i].contiguous();
  return std::vector<int64_t>(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel());
}

class DataCheck {
 public:
  DataCheck(const PluginUnderTest& plugin, const CheckOptions& o)
      : plugin_(plugin),
        o_(o),
        cfg_(plugin.config(o.options_toml)),
        dir_(work_dir(o, "data")),
        store_(make_local_store(std::chrono::seconds(60))) {
    if (!o.tokenizer_json.empty()) tokenizer_ = load_tokenizer(o.tokenizer_json);
  }

  // Rank `rank` of `world`, opened with micro-batch `micro`.
  struct Source {
    RunContext ctx;
    std::shared_ptr<PluginObject> obj;
    DataSource* data = nullptr;
  };
  std::unique_ptr<Source> open(int rank, int world, int64_t micro) {
    auto s = std::make_unique<Source>();
    // One output folder for every rank and world: a source's cache is built once.
    s->ctx = make_context(rank, world, store_, o_.device, dir_, o_.seed);
    s->obj = plugin_.create(cfg_, s->ctx);
    s->data = dynamic_cast<DataSource*>(s->obj.get());
    if (!s->data) throw Error("the plugin's factory made no ciuic::DataSource");
    DataOpenArgs a;
    a.seq_len = o_.seq_len;
    a.micro_batch_size = micro;
    a.tokenizer = tokenizer_.get();
    s->data->open(a);
    return s;
  }

  // A batch as rows, after checking its shape and the label rules.
  std::vector<Row> rows(const Batch& b, int64_t micro, const std::string& what) {
    std::vector<Row> out;
    for (const auto* t : {&b.input_ids, &b.labels, &b.position_ids}) {
      if (!t->defined() || t->scalar_type() != at::kLong || !t->device().is_cpu() ||
          t->sizes() != at::IntArrayRef({micro, o_.seq_len})) {
        ADD_FAILURE() << what
                      << ": input_ids, labels and position_ids must be int64 CPU tensors of shape ["
                      << micro << ", " << o_.seq_len << "]";
        return out;
      }
    }
    const int64_t labelled = b.labels.ne(-100).sum().item<int64_t>();
    EXPECT_EQ(b.num_label_tokens, labelled)
        << what << ": num_label_tokens is not the count of labels != -100";
    const int64_t vocab = tokenizer_ ? tokenizer_->vocab_size() : INT64_MAX;
    EXPECT_TRUE((b.labels.eq(-100) | (b.labels.ge(0) & b.labels.lt(vocab))).all().item<bool>())
        << what << ": a label is neither -100 nor a token id in [0, " << vocab << ")";
    EXPECT_TRUE(b.position_ids.ge(0).all().item<bool>()) << what << ": a negative position id";
    for (int64_t i = 0; i < micro; ++i)
      out.push_back({row_of(b.input_ids, i), row_of(b.labels, i), row_of(b.position_ids, i)});
    return out;
  }

  void run() {
    const int64_t m = o_.micro_batch, N = o_.rows;
    // The reference: the first N global rows, read at world size 1.
    std::vector<Row> ref;
    {
      auto s = open(0, 1, m);
      while (static_cast<int64_t>(ref.size()) < N) {
        auto r = rows(s->data->next(), m, "world 1, batch " + std::to_string(ref.size() / m));
        if (r.empty()) return;
        ref.insert(ref.end(), r.begin(), r.end());
      }
      ref.resize(N);
      // The same on a second open.
      auto again = open(0, 1, m);
      for (int64_t i = 0; i < 3 && (i + 1) * m <= N; ++i)
        EXPECT_TRUE(rows(again->data->next(), m, "second open") ==
                    std::vector<Row>(ref.begin() + i * m, ref.begin() + (i + 1) * m))
            << "world 1: batch " << i << " differs between two opens with the same arguments";
    }
    // Global dealing, cursors, resume on the same world size.
    std::vector<std::string> cursors_after_first(8);
    for (int W : o_.world_sizes) {
      const int64_t batches = N / (W * m);
      if (batches < 2) {
        ADD_FAILURE() << "CheckOptions::rows = " << N << " is too few for world size " << W
                      << " and micro-batch " << m;
        continue;
      }
      std::vector<std::unique_ptr<Source>> src;
      for (int k = 0; k < W; ++k) src.push_back(open(k, W, m));
      std::vector<std::vector<std::vector<Row>>> got(W);  // [rank][batch] rows
      std::vector<std::vector<std::string>> cursor(W);    // [rank][batches read]
      for (int64_t i = 0; i < batches; ++i) {
        for (int k = 0; k < W; ++k) {
          cursor[k].push_back(src[k]->data->cursor());
          got[k].push_back(rows(src[k]->data->next(), m, where(W, k, i)));
          for (int64_t j = 0; j < m && static_cast<int64_t>(got[k][i].size()) == m; ++j) {
            const int64_t g = i * W * m + j * W + k;
            EXPECT_TRUE(got[k][i][j] == ref[g])
                << where(W, k, i) << ", row " << j << ": not global row " << g
                << " (rank k of W reads rows g + k, g + k + W, ...: ciuic/data.h)";
          }
        }
        for (int k = 1; k < W; ++k)
          EXPECT_EQ(cursor[k][i], cursor[0][i])
              << "world " << W << ": rank " << k << "'s cursor after " << i
              << " batches differs from rank 0's";
      }
      cursors_after_first[W] = cursor[0][1];
      // Resume each rank from its own cursor half-way.
      const int64_t half = batches / 2;
      for (int k = 0; k < W; ++k) {
        auto r = open(k, W, m);
        r->data->seek(cursor[k][half]);
        for (int64_t i = half; i < batches; ++i)
          EXPECT_TRUE(rows(r->data->next(), m, where(W, k, i) + " after seek") == got[k][i])
              << where(W, k, i) << ": resumed from the cursor after " << half
              << " batches, it differs from the "
              << "uninterrupted run";
      }
    }
    // Resume at world B (micro-batch m or m + 1) from rank 0's cursor after one batch at world A.
    for (int A : o_.world_sizes) {
      if (cursors_after_first[A].empty()) continue;
      for (int B : o_.world_sizes) {
        if (A == B) continue;
        const int64_t mb = (A + B) % 2 ? m + 1 : m, g0 = A * m;
        for (int k = 0; k < B; ++k) {
          auto r = open(k, B, mb);
          r->data->seek(cursors_after_first[A]);
          for (int64_t i = 0; g0 + (i + 1) * B * mb <= N; ++i) {
            const auto rs = rows(r->data->next(), mb, where(B, k, i));
            for (int64_t j = 0; j < static_cast<int64_t>(rs.size()); ++j) {
              const int64_t g = g0 + i * B * mb + j * B + k;
              EXPECT_TRUE(rs[j] == ref[g])
                  << "resumed at world " << B << " (micro-batch " << mb << ") from world " << A
                  << "'s cursor after one batch: rank " << k << ", batch " << i << ", row " << j
                  << " is not global row " << g;
            }
          }
        }
      }
    }
    check_eval();
  }

  // Eval: the same number of batches on every rank; begin_eval() restarts; rank k's row i of batch
  // b is global row (b * m + i) * W + k of the world-1 split, or padding past its end.
  void check_eval() {
    const int64_t m = o_.micro_batch;
    auto one = open(0, 1, m);
    if (!one->data->has_eval()) return;
    std::vector<Row> ref = eval_rows(*one->data, m, "eval at world 1");
    while (!ref.empty() && ref.back().padding()) ref.pop_back();
    for (int W : o_.world_sizes) {
      size_t count = 0;
      for (int k = 0; k < W; ++k) {
        auto s = open(k, W, m);
        ASSERT_TRUE(s->data->has_eval())
            << "world " << W << ", rank " << k << ": has_eval() differs from world 1";
        const std::vector<Row> a = eval_rows(*s->data, m, "eval, " + where(W, k, 0));
        EXPECT_TRUE(eval_rows(*s->data, m, "eval again") == a)
            << "world " << W << ", rank " << k << ": a second begin_eval() yields other batches";
        if (k == 0) count = a.size();
        EXPECT_EQ(a.size(), count)
            << "world " << W << ": rank " << k << " yields " << a.size() / m
            << " eval batches, rank 0 " << count / m << " (ciuic/data.h: the same on every rank)";
        for (size_t r = 0; r < a.size(); ++r) {
          const size_t g = r * W + k;  // row i of batch b: r = b * m + i
          if (g < ref.size()) {
            EXPECT_TRUE(a[r] == ref[g]) << "eval, world " << W << ", rank " << k << ", row " << r
                                        << ": not global eval row " << g;
          } else {
            EXPECT_TRUE(a[r].padding())
                << "eval, world " << W << ", rank " << k << ", row " << r << ": past the "
                << ref.size() << " eval rows, it must be padding (labels -100)";
          }
        }
        EXPECT_GE(a.size() * W, ref.size())
            << "world " << W << ": rank " << k << " yields too few eval rows";
      }
    }
  }

  std::vector<Row> eval_rows(DataSource& d, int64_t m, const std::string& what) {
    std::vector<Row> out;
    d.begin_eval();
    for (int b = 0; b < 100000; ++b) {
      std::optional<Batch> batch = d.next_eval();
      if (!batch) return out;
      auto r = rows(*batch, m, what + ", batch " + std::to_string(b));
      out.insert(out.end(), r.begin(), r.end());
    }
    ADD_FAILURE() << what << ": next_eval() did not end after 100000 batches";
    return out;
  }

  static std::string where(int W, int k, int64_t i) {
    return "world " + std::to_string(W) + ", rank " + std::to_string(k) + ", batch " +
           std::to_string(i);
  }

 private:
  const PluginUnderTest& plugin_;
  const CheckOptions& o_;
  const Config cfg_;
  const std::string dir_;
  std::shared_ptr<Store> store_;
  std::shared_ptr<const Tokenizer> tokenizer_;
};

}  // namespace

void check_data(const PluginUnderTest& plugin, const CheckOptions& o) {
  ASSERT_EQ(plugin.slot(), Slot::kData) << plugin.path();
  for (int w : o.world_sizes) ASSERT_TRUE(w >= 1 && w <= 8) << "world size " << w;
  DataCheck(plugin, o).run();
}

}  // namespace ciuic::conformance
