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
  for (const char* f :
       {"--generate DIR", "--chat DIR", "--prompts FILE.jsonl", "--temperature", "--top-k",
        "--top-p", "--min-p", "--repetition-penalty", "--seed", "--max-new-tokens", "--do-sample"})
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
      {{"--temperature", "0.5"}, "goes with --generate or --chat"},
  };
  for (const auto& [args, want] : cases) {
    const PtyChild c = run(args);
    EXPECT_EQ(c.code(), 2) << args[0] << " " << (args.size() > 1 ? args[1] : "") << "\n" << c.out();
    EXPECT_NE(c.out().find(want), std::string::npos) << want << "\n" << c.out();
  }
}

}  // namespace
