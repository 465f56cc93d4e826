// Shared by the tests that compare batches with the Python model of the data slot
// (tests/fixtures/gen_data_kit.py -> fixtures/data/kit_reference.json): the fixture, batches as
// JSON rows, and a batch comparison.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include <ciuic/data.h>

#include "data_test_support.h"

namespace ciuic::testdata {

inline const nlohmann::json& kit_reference() {
  static const nlohmann::json j =
      nlohmann::json::parse(std::ifstream(CIUIC_FIXTURES_DIR + "/data/kit_reference.json"));
  return j;
}

// A [rows, cols] int64 tensor as a JSON array of rows.
inline nlohmann::json rows_json(const at::Tensor& t) {
  nlohmann::json rows = nlohmann::json::array();
  for (int64_t r = 0; r < t.size(0); ++r) {
    const at::Tensor row = t[r].contiguous();
    rows.push_back(
        std::vector<int64_t>(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + row.numel()));
  }
  return rows;
}

// `b` equals the reference batch `want` (tensors, dtype and counts).
inline void expect_batch(const Batch& b, const nlohmann::json& want, const std::string& where) {
  ASSERT_EQ(b.input_ids.scalar_type(), at::kLong) << where;
  EXPECT_EQ(rows_json(b.input_ids), want["input_ids"]) << where;
  EXPECT_EQ(rows_json(b.labels), want["labels"]) << where;
  EXPECT_EQ(rows_json(b.position_ids), want["position_ids"]) << where;
  EXPECT_EQ(b.num_label_tokens, want["num_label_tokens"].get<int64_t>()) << where;
  EXPECT_EQ(b.num_documents, want["num_documents"].get<int64_t>()) << where;
}

}  // namespace ciuic::testdata
