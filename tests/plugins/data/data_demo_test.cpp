// The demo's data path with the real pieces: examples/demo/tokenizer.json read by ciuic's
// Tokenizer, the "plain" chat template, the cached_ssd plugin — compared with the ids the Python
// `tokenizers` package gives for the same conversations (fixtures/data/demo/hf_ids.json) — and the
// exact-match helper of core/src/train/exact_match.h.
#include <gtest/gtest.h>

#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include <ciuic/error.h>

#include "data_test_support.h"
#include "tokenizer/factory.h"
#include "train/exact_match.h"

namespace ciuic::testdata {
namespace {

using Json = nlohmann::json;
const std::string kDemoFixtures = std::string(CIUIC_FIXTURES_DIR) + "/data/demo";
const std::string kTokenizer = std::string(CIUIC_SOURCE_DIR) + "/examples/demo/tokenizer.json";

TEST(DemoData, CachedSsdGivesTheHfIdsAndLossOnTheReplyOnly) {
  auto tok = load_tokenizer(kTokenizer);
  auto tmpl = make_chat_template("plain", *tok);
  const std::string dir = temp_dir("demo");
  RunContext ctx = make_context(dir);
  auto src = registry().create<DataSource>(
      Slot::kData, "cached_ssd",
      Config::from_toml("data", "sources = [\"" + kDemoFixtures +
                                    "/train.jsonl\"]\nformat = \"chat\"\n"
                                    "packing = false\nshuffle = false\n"),
      ctx);
  DataOpenArgs a;
  a.seq_len = 48;
  a.micro_batch_size = 8;
  a.tokenizer = tok.get();
  a.chat_template = tmpl.get();
  src->open(a);
  Batch b = src->next();
  Json ref = Json::parse(std::ifstream(kDemoFixtures + "/hf_ids.json"));
  ASSERT_EQ(ref["documents"].size(), 8u);
  for (int64_t r = 0; r < 8; ++r) {
    const auto ids = ref["documents"][r]["ids"].get<std::vector<int64_t>>();
    const auto reply = ref["documents"][r]["reply_ids"].get<std::vector<int64_t>>();
    const int64_t n = static_cast<int64_t>(ids.size());
    for (int64_t t = 0; t < 48; ++t) {
      if (t < n) {
        EXPECT_EQ(b.input_ids[r][t].item<int64_t>(), ids[t]) << "row " << r << " position " << t;
        EXPECT_EQ(b.position_ids[r][t].item<int64_t>(), t);
      }
      // Targets: exactly the reply's tokens (" 116<|end_of_text|>"), predicted from the position
      // before.
      const int64_t first_target = n - static_cast<int64_t>(reply.size());
      const int64_t want = (t + 1 >= first_target && t + 1 < n) ? ids[t + 1] : -100;
      EXPECT_EQ(b.labels[r][t].item<int64_t>(), want) << "row " << r << " position " << t;
    }
  }
}

TEST(DemoEval, ExactMatchWithAnOracleAndAConstantGenerator) {
  auto tok = load_tokenizer(kTokenizer);
  auto tmpl = make_chat_template("plain", *tok);
  auto questions = train::load_held_out(kDemoFixtures + "/eval.jsonl");
  ASSERT_EQ(questions.size(), 200u);
  // Oracle: the expected answer, as the model would write it (" <answer>" then EOS, then junk).
  std::map<std::vector<int32_t>, std::string> answers;
  for (const auto& q : questions) answers[tmpl->encode_prompt(q.prompt)] = q.answer;
  auto oracle = [&](const std::vector<int32_t>& prompt, int64_t) {
    std::vector<int32_t> out = prompt;  // returning prompt + reply is accepted too
    for (int32_t id : tok->encode(" " + answers.at(prompt), false)) out.push_back(id);
    out.push_back(*tok->eos_id());
    out.push_back(tok->encode("9", false)[0]);
    return out;
  };
  train::ExactMatchResult all = train::exact_match(questions, *tok, *tmpl, oracle);
  EXPECT_EQ(all.total, 200);
  EXPECT_EQ(all.correct, 200);
  EXPECT_EQ(all.by_category.size(), 4u);
  // A model that always says "0" is right exactly where the answer is "0".
  int64_t zeros = 0;
  for (const auto& q : questions) zeros += q.answer == "0";
  auto zero = [&](const std::vector<int32_t>&, int64_t) { return tok->encode(" 0", false); };
  train::ExactMatchResult z = train::exact_match(questions, *tok, *tmpl, zero);
  EXPECT_EQ(z.correct, zeros);
  EXPECT_FALSE(z.mistakes.empty());
  EXPECT_EQ(train::exact_match(questions, *tok, *tmpl, zero, 8, 10).total, 10);
  const std::string table = train::format_table(z, all);
  EXPECT_NE(table.find("200/200"), std::string::npos) << table;
  EXPECT_NE(table.find("convert"), std::string::npos) << table;
}

TEST(DemoEval, MalformedHeldOutFileNamesTheLine) {
  const std::string dir = temp_dir("demo_bad");
  write_file(dir + "/e.jsonl",
             "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}], \"answer\": \"1\"}\n"
             "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}]}\n");
  try {
    train::load_held_out(dir + "/e.jsonl");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("e.jsonl:2: no assistant message"), std::string::npos)
        << e.what();
  }
}

// Issue 33: an expected answer that is not a string, or empty, and a category that is not a
// string, are refused naming the line (before: a non-string "answer" without an assistant
// message indexed past the messages array; an empty one was kept and scored as nothing).
TEST(DemoEval, HeldOutAnswersMustBeNonEmptyStrings) {
  const std::string dir = temp_dir("demo_bad_answers");
  const std::string ok =
      "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}], \"answer\": \"1\"}\n";
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}], \"answer\": 5}",
       "\"answer\" must be a string"},
      {"{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}], \"answer\": \" \\t\"}",
       "the expected answer is empty"},
      {"{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", "
       "\"content\": \"\"}]}",
       "the expected answer is empty"},
      {"{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}], \"answer\": \"1\", "
       "\"category\": 3}",
       "\"category\" must be a string"},
  };
  for (const auto& [line, want] : bad) {
    write_file(dir + "/e.jsonl", ok + line + "\n");
    const std::string m = message_of([&] { train::load_held_out(dir + "/e.jsonl"); });
    EXPECT_NE(m.find("e.jsonl:2: " + want), std::string::npos) << line << " -> " << m;
  }
}

// The replies as compared are kept for the other figures, and format_table shows those figures.
TEST(DemoEval, RepliesAndFiguresReachTheTable) {
  auto tok = load_tokenizer(kTokenizer);
  auto tmpl = make_chat_template("plain", *tok);
  auto questions = train::load_held_out(kDemoFixtures + "/eval.jsonl");
  auto zero = [&](const std::vector<int32_t>&, int64_t) { return tok->encode(" 0", false); };
  train::ExactMatchResult z = train::exact_match(questions, *tok, *tmpl, zero, 8, 10);
  ASSERT_EQ(z.answers.size(), 10u);
  ASSERT_EQ(z.generated.size(), 10u);
  EXPECT_EQ(z.answers[0], "0");
  EXPECT_EQ(z.generated[0], static_cast<int64_t>(tok->encode(" 0", false).size()));
  train::ExactMatchResult after = z;
  z.figures = {{"bleu", "BLEU (13a)", 3.5, "%.2f"}};
  after.figures = {{"bleu", "BLEU (13a)", 61.25, "%.2f"},
                   {"ttft_median_s", "TTFT p50 s", 0.01, "%.4f"}};
  const std::string table = train::format_table(z, after);
  EXPECT_NE(table.find("BLEU (13a)   3.50               61.25"), std::string::npos) << table;
  EXPECT_NE(table.find("TTFT p50 s   -                  0.0100"), std::string::npos) << table;
}

// exact_match_file is read like every text input: a regular file, bounded (issue 16 item 3).
TEST(DemoEval, HeldOutFileMustBeARegularFile) {
  for (const std::string p : {"/dev/zero", "/dev/null"}) {
    const std::string m = message_of([&] { train::load_held_out(p); });
    EXPECT_NE(m.find("cannot read held-out questions ([train] exact_match_file) " + p +
                     ": not a regular file"),
              std::string::npos)
        << m;
  }
  EXPECT_NE(message_of([&] {
              train::load_held_out("/nonexistent/e.jsonl");
            }).find("/nonexistent/e.jsonl"),
            std::string::npos);
}

}  // namespace
}  // namespace ciuic::testdata
