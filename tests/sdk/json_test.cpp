// The JSON nesting bound (ciuic/json.h): the scan's depth is the depth nlohmann's parser builds,
// brackets in strings do not count, the position names the first bracket past the limit, and a
// 100,000-deep text is refused at once (issue 27).
#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <ciuic/json.h>

#include "../support/deep_json.h"

namespace {

using ciuic::json_depth_problem;

// The nesting depth of a parsed value, by nlohmann's DOM (the reference): iterative.
size_t depth_of(const nlohmann::json& root) {
  size_t best = 0;
  std::vector<std::pair<const nlohmann::json*, size_t>> todo{{&root, 0}};
  while (!todo.empty()) {
    auto [v, d] = todo.back();
    todo.pop_back();
    if (!v->is_structured()) continue;
    best = std::max(best, d + 1);
    for (const auto& c : *v) todo.emplace_back(&c, d + 1);
  }
  return best;
}

TEST(JsonDepth, AgreesWithTheParsedValue) {
  std::mt19937 rng(27);
  // Random JSON with strings holding brackets, quotes and backslashes.
  std::function<nlohmann::json(int)> gen = [&](int budget) -> nlohmann::json {
    const int kind = budget <= 0 ? 2 + static_cast<int>(rng() % 2) : static_cast<int>(rng() % 4);
    if (kind == 0) {
      nlohmann::json a = nlohmann::json::array();
      for (int i = 0, n = static_cast<int>(rng() % 3); i < n; ++i) a.push_back(gen(budget - 1));
      return a;
    }
    if (kind == 1) {
      nlohmann::json o = nlohmann::json::object();
      for (int i = 0, n = static_cast<int>(rng() % 3); i < n; ++i)
        o["k[{\"\\" + std::to_string(i)] = gen(budget - 1);
      return o;
    }
    if (kind == 2) return std::string("]]}}\\\"[[{ \"") + std::to_string(rng() % 100);
    return static_cast<int>(rng() % 1000);
  };
  for (int i = 0; i < 300; ++i) {
    const nlohmann::json v = gen(static_cast<int>(rng() % 12));
    const std::string text = v.dump(static_cast<int>(rng() % 2) ? 1 : -1);
    const size_t d = depth_of(nlohmann::json::parse(text));
    EXPECT_EQ(json_depth_problem(text, d), "") << text;
    if (d > 0) EXPECT_NE(json_depth_problem(text, d - 1), "") << text;
  }
}

TEST(JsonDepth, TheLimitAndThePosition) {
  EXPECT_EQ(json_depth_problem(ciuic_test::nested_arrays(128)), "");
  EXPECT_EQ(json_depth_problem(ciuic_test::nested_arrays(129)),
            "nested deeper than 128 levels (arrays and objects) at line 1, column 129");
  EXPECT_EQ(json_depth_problem("{\n  \"a\": [\n    [[1]]]}", 2),
            "nested deeper than 2 levels (arrays and objects) at line 3, column 5");
  EXPECT_EQ(json_depth_problem("[\"[[[\\\"[[[\", 1]", 1),
            "");  // brackets and an escaped quote in a string
  EXPECT_EQ(json_depth_problem("{} {} [] [[]]", 2), "");  // siblings do not add up
  try {
    ciuic::check_json_depth(ciuic_test::nested_objects(ciuic_test::kDeep), "t.json",
                            ciuic::kExitUsage);
    ADD_FAILURE() << "accepted";
  } catch (const ciuic::UsageError& e) {
    EXPECT_EQ(std::string(e.what()).rfind(
                  "t.json: JSON nested deeper than 128 levels (arrays and objects) at line 1, "
                  "column 769; ciuic reads at most 128",
                  0),
              0u)
        << e.what();
  }
  EXPECT_THROW(ciuic::check_json_depth(ciuic_test::nested_arrays(200), "t.json"), ciuic::Error);
  EXPECT_NO_THROW(ciuic::check_json_depth(ciuic_test::nested_arrays(128), "t.json"));
}

}  // namespace
