// ciuic-run --generate and --chat through the built binary, on the tiny qwen2 chat model of
// tests/fixtures/gen_generate.py: the ids transformers' generate() gives for a raw and a chat
// prompt, --chat in a pseudo-terminal (streamed reply, /reset, /system, Ctrl-C stops a reply and
// the session goes on), --help, and bad input (exit 2, the file or flag named).
#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../support/pty_child.h"

namespace {

using ciuic::testing::PtyChild;
using nlohmann::json;

const std::string kExe = std::string(CIUIC_BIN_DIR) + "/ciuic-run";
const std::string kModel = std::string(CIUIC_FIXTURES_DIR) + "/generate/chat_model";

json cli_meta() {
  std::ifstream in(std::string(CIUIC_FIXTURES_DIR) + "/generate/cases.json");
  return json::parse(in)["cli"];
}

std::string tmp(const std::string& name) {
  const auto p = std::filesystem::path(CIUIC_TEST_TMP) / "generate_cli" / name;
  std::filesystem::create_directories(p.parent_path());
  return p.string();
}

PtyChild run(std::vector<std::string> args) {
  args.insert(args.begin(), kExe);
  PtyChild c(args);
  EXPECT_TRUE(c.run_until_exit(std::chrono::seconds(60))) << c.out();
  return c;
}

std::vector<json> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<json> out;
  for (std::string l; std::getline(in, l);) out.push_back(json::parse(l));
  return out;
}

TEST(GenerateCli, RawAndChatPromptsGiveTransformersIds) {
  const json m = cli_meta();
  const std::string prompts = tmp("prompts.jsonl"), out = tmp("out.jsonl");
  std::ofstream(prompts) << "{\"prompt\": \"Hello there\"}\n\n{\"messages\": [{\"role\": \"user\", "
                            "\"content\": \"Hi\"}]}\n";
  const PtyChild c =
      run({"--generate", kModel, "--prompts", prompts, "--out", out, "--max-new-tokens", "8"});
  ASSERT_EQ(c.code(), 0) << c.out();
  EXPECT_NE(c.out().find("generate: 2/2 prompts, 16 tokens"), std::string::npos) << c.out();
  const auto rows = lines_of(out);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0]["ids"], m["raw"]["new_ids"]);
  EXPECT_EQ(rows[0]["prompt_tokens"], m["raw"]["prompt_ids"].size());
  EXPECT_EQ(rows[1]["ids"], m["chat"]["new_ids"]);
  EXPECT_EQ(rows[1]["prompt_tokens"], m["chat"]["prompt_ids"].size());
  EXPECT_EQ(rows[1]["stopped"], "length");
  for (const char* k : {"text", "first_token_s", "seconds", "tokens_per_s"})
    EXPECT_TRUE(rows[0].contains(k)) << k;
  // --prompt, the same ids, on stdout.
  const PtyChild p =
      run({"--generate", kModel, "--prompt", "Hello there", "--max-new-tokens", "8"});
  ASSERT_EQ(p.code(), 0) << p.out();
  const std::string s = p.out();
  const json row = json::parse(s.substr(s.find('{'), s.find('\n', s.find('{')) - s.find('{')));
  EXPECT_EQ(row["ids"], m["raw"]["new_ids"]);
}

json stop_cases() {
  std::ifstream in(std::string(CIUIC_FIXTURES_DIR) + "/generate/cases.json");
  return json::parse(in)["stop_strings"];
}

// Stop strings from --stop-string, a prompt's own "stop_strings" and generation_config.json give
// transformers' generate(stop_strings=...) ids (cases.json "stop_strings": 0 " FROM st", 2 "atc").
TEST(GenerateCli, StopStringsGiveTransformersIds) {
  const json c = stop_cases();
  const std::string prompts = tmp("stop.jsonl"), out = tmp("stop_out.jsonl");
  std::ofstream(prompts) << "{\"prompt\": \"The cat\", \"stop_strings\": [\" FROM st\"]}\n"
                            "{\"prompt\": \"It is\"}\n";
  const PtyChild a =
      run({"--generate", kModel, "--prompts", prompts, "--out", out, "--stop-string", "zzz",
           "--stop-string", "atc", "--repetition-penalty", "3", "--max-new-tokens", "20"});
  ASSERT_EQ(a.code(), 0) << a.out();
  const auto rows = lines_of(out);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0]["ids"], c[0]["new_ids"][0]);
  EXPECT_EQ(rows[1]["ids"], c[2]["new_ids"][0]);
  EXPECT_EQ(rows[0]["stopped"], "stop_string");
  EXPECT_EQ(rows[1]["stopped"], "stop_string");
  EXPECT_EQ(rows[1]["text"], c[2]["text"][0]);  // ends with "batch": the stop string is kept
  const std::string folder = tmp("stop_model");
  std::filesystem::remove_all(folder);
  std::filesystem::copy(kModel, folder);
  std::ofstream(folder + "/generation_config.json")
      << R"({"eos_token_id": [706], "pad_token_id": 707, "stop_strings": ["atc"],)"
      << R"( "repetition_penalty": 3.0})";
  const PtyChild b = run({"--generate", folder, "--prompt", "It is", "--max-new-tokens", "20"});
  ASSERT_EQ(b.code(), 0) << b.out();
  const std::string s = b.out();
  const json row = json::parse(s.substr(s.find('{'), s.find('\n', s.find('{')) - s.find('{')));
  EXPECT_EQ(row["ids"], c[2]["new_ids"][0]);
  EXPECT_EQ(row["stopped"], "stop_string");
}

TEST(GenerateCli, ChatInAPseudoTerminal) {
  PtyChild c({kExe, "--chat", kModel, "--max-new-tokens", "200", "--system", "Be brief."});
  ASSERT_TRUE(c.read_until("user> ", std::chrono::seconds(60))) << c.out();
  c.write("Hi\n");
  ASSERT_TRUE(c.read_until("assistant> ", std::chrono::seconds(30))) << c.out();
  ASSERT_TRUE(c.read_until("\r\n\r\nuser> ", std::chrono::seconds(60), c.out().find("assistant> ")))
      << c.out();
  // A long reply stopped by Ctrl-C: the session goes on.
  c.write("/system \n");
  ASSERT_TRUE(c.read_until("(system message set", std::chrono::seconds(30))) << c.out();
  c.write("/reset\n");
  ASSERT_TRUE(c.read_until("(conversation reset)", std::chrono::seconds(30))) << c.out();
  const size_t before = c.out().size();
  c.write("Tell me more\n");
  ASSERT_TRUE(c.read_until("assistant> ", std::chrono::seconds(30), before)) << c.out();
  c.signal(SIGINT);
  ASSERT_TRUE(c.read_until("[stopped]", std::chrono::seconds(60), before)) << c.out();
  ASSERT_TRUE(c.read_until("user> ", std::chrono::seconds(60), c.out().find("[stopped]", before)))
      << c.out();
  c.write("/exit\n");
  ASSERT_TRUE(c.run_until_exit(std::chrono::seconds(30))) << c.out();
  EXPECT_EQ(c.code(), 0) << c.out();
}

TEST(GenerateCli, HelpDocumentsTheFlags) {
  const PtyChild c = run({"--help"});
  for (const char* f : {"--generate DIR", "--chat DIR", "--prompts FILE.jsonl", "--temperature",
                        "--top-k", "--top-p", "--min-p", "--repetition-penalty", "--seed",
                        "--max-new-tokens", "--do-sample", "--stop-string"})
    EXPECT_NE(c.out().find(f), std::string::npos) << f;
}

TEST(GenerateCli, BadInputExitsTwoNamingTheProblem) {
  const std::string empty = tmp("empty.jsonl"), bad = tmp("bad.jsonl"), plain = tmp("plain");
  std::ofstream(empty) << "\n";
  std::string long_prompt;
  for (int i = 0; i < 300; ++i) long_prompt += " 7";
  std::ofstream(bad) << "{\"prompt\": \"a\"}\n{oops\n";
  const std::string huge = tmp("huge.jsonl");
  std::ofstream(huge).close();
  std::filesystem::resize_file(huge, (256ull << 20) + 1);  // sparse: nothing is written
  std::filesystem::remove_all(plain);
  std::filesystem::copy(kModel, plain);
  std::ofstream(plain + "/tokenizer_config.json") << "{\"eos_token\": \"<|im_end|>\"}";
  const std::string stops = tmp("stops.jsonl"), empty_stop = tmp("empty_stop.jsonl"),
                    bad_config = tmp("bad_stop_config");
  std::ofstream(stops) << "{\"prompt\": \"a\"}\n{\"prompt\": \"a\", \"stop_strings\": 5}\n";
  std::ofstream(empty_stop) << "{\"prompt\": \"a\", \"stop_strings\": [\"x\", \"\"]}\n";
  std::filesystem::remove_all(bad_config);
  std::filesystem::copy(kModel, bad_config);
  std::ofstream(bad_config + "/generation_config.json") << R"({"stop_strings": [""]})";
  // Sampling values and EOS ids of generation_config.json are checked as the flags are (exit 2).
  const std::string hot = tmp("hot_config"), eos_text = tmp("eos_text_config");
  for (const auto& [dir, text] : {std::pair{hot, R"({"do_sample": true, "temperature": -1})"},
                                  std::pair{eos_text, R"({"eos_token_id": "two"})"}}) {
    std::filesystem::remove_all(dir);
    std::filesystem::copy(kModel, dir);
    std::ofstream(dir + "/generation_config.json") << text;
  }
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--generate", tmp("missing"), "--prompt", "x"}, "no such folder"},
      {{"--generate", CIUIC_FIXTURES_DIR, "--prompt", "x"}, "no config.json"},
      {{"--generate", kModel}, "--prompt TEXT or --prompts"},
      {{"--generate", kModel, "--prompts", empty}, "has no prompts"},
      {{"--generate", kModel, "--prompts", bad}, "bad.jsonl:2"},
      {{"--generate", kModel, "--prompts", huge}, "over the limit of 268435456 bytes"},
      {{"--generate", kModel, "--prompts", "/dev/zero"}, "not a regular file"},
      {{"--generate", kModel, "--prompts", tmp("none.jsonl")}, "none.jsonl"},
      {{"--generate", kModel, "--prompt", "x", "--temperature", "0"}, "temperature must be"},
      {{"--generate", kModel, "--prompt", "x", "--top-p", "1.5"}, "top_p must be in (0, 1]"},
      {{"--generate", kModel, "--prompt", "x", "--top-k", "-2"}, "top_k must be >= 0"},
      {{"--generate", kModel, "--prompt", "x", "--min-p", "2"}, "min_p must be in [0, 1]"},
      {{"--generate", kModel, "--prompt", "x", "--repetition-penalty", "-1"}, "repetition_penalty"},
      {{"--generate", kModel, "--prompt", long_prompt}, "context of 256"},
      {{"--chat", plain}, "no chat template"},
      {{"--generate", kModel, "--prompt", "x", "--stop-string", ""}, "--stop-string: stop strings"},
      {{"--chat", kModel, "--stop-string", ""}, "empty stop string"},
      {{"--generate", kModel, "--prompts", stops}, "stops.jsonl:2: \"stop_strings\" must be"},
      {{"--generate", kModel, "--prompts", empty_stop}, "empty_stop.jsonl:1"},
      {{"--generate", bad_config, "--prompt", "x"}, "generation_config.json: stop_strings"},
      {{"--generate", hot, "--prompt", "x"}, "generation_config.json: temperature must be"},
      {{"--generate", eos_text, "--prompt", "x"}, "generation_config.json: eos_token_id must be"},
      {{"--stop-string", "x"}, "goes with --generate or --chat"},
      {{"--temperature", "0.5"}, "goes with --generate or --chat"},
  };
  for (const auto& [args, want] : cases) {
    const PtyChild c = run(args);
    EXPECT_EQ(c.code(), 2) << args[0] << " " << (args.size() > 1 ? args[1] : "") << "\n" << c.out();
    EXPECT_NE(c.out().find(want), std::string::npos) << want << "\n" << c.out();
  }
}

}  // namespace
