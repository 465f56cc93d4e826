// Chat templates vs transformers' apply_chat_template (renderings, ids, {% generation %} assistant
// masks, generation prompts) on the deepseek_llm, llama3, llama2_spm, mistral_spm, gemma_spm and
// qwen2 fixtures.
#include <gtest/gtest.h>

#include <thread>

#include <ciuic/error.h>
#include <ciuic/tokenizer.h>

#include "test_util.h"
#include "tokenizer/factory.h"

namespace ciuic {
namespace {

using nlohmann::json;
using test::ids_to_string;

std::vector<ChatMessage> messages_of(const json& j) {
  std::vector<ChatMessage> out;
  for (const json& m : j)
    out.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  return out;
}

class ChatFixtureTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ChatFixtureTest, MatchesTransformersApplyChatTemplate) {
  const std::string dir = test::tokenizer_fixture_dir(GetParam());
  auto tok = load_tokenizer(dir + "/tokenizer.json");
  json expected = test::read_json_file(dir + "/expected.json");
  ASSERT_GE(expected["chats"].size(), 8u);
  for (const json& c : expected["chats"]) {
    const std::string name = c["template"].get<std::string>();
    auto tmpl = make_chat_template(name, *tok);
    EXPECT_EQ(tmpl->name(), name);
    std::vector<ChatMessage> msgs = messages_of(c["messages"]);
    const std::string where = GetParam() + "/" + name + ": " + c["messages"].dump();
    EXPECT_EQ(tmpl->render(msgs), c["rendered"].get<std::string>()) << where;

    std::vector<int32_t> want = c["ids"].get<std::vector<int32_t>>();
    std::vector<uint8_t> want_mask = c["assistant_mask"].get<std::vector<uint8_t>>();
    EncodedChat all = tmpl->encode(msgs, false);
    EXPECT_EQ(all.ids, want) << where << "\n ours: " << ids_to_string(all.ids)
                             << "\n HF:   " << ids_to_string(want);
    EXPECT_EQ(all.loss_mask, std::vector<uint8_t>(want.size(), 1)) << where;

    EncodedChat asst = tmpl->encode(msgs, true);
    EXPECT_EQ(asst.ids, want) << where << " (assistant_only: the ids must equal HF's)";
    EXPECT_EQ(asst.loss_mask, want_mask) << where;

    std::vector<int32_t> prompt = tmpl->encode_prompt(msgs);
    EXPECT_EQ(prompt, c["prompt_ids"].get<std::vector<int32_t>>()) << where;
  }
}

INSTANTIATE_TEST_SUITE_P(Hf, ChatFixtureTest,
                         ::testing::Values("deepseek_llm", "llama3", "llama2_spm", "mistral_spm",
                                           "gemma_spm", "qwen2"),
                         [](const auto& info) { return info.param; });

TEST(ChatTemplate, MaskCoversRepliesAndTheirEos) {
  auto tok = load_tokenizer(test::tokenizer_fixture_dir("deepseek_llm") + "/tokenizer.json");
  auto tmpl = make_chat_template("deepseek", *tok);
  EncodedChat e = tmpl->encode(
      {{"user", "Hi"}, {"assistant", "Hello"}, {"user", "Bye"}, {"assistant", "Ciao"}}, true);
  ASSERT_EQ(e.ids.size(), e.loss_mask.size());
  EXPECT_EQ(e.ids.front(), *tok->bos_id());
  EXPECT_EQ(e.loss_mask.front(), 0);
  // Both replies end with EOS and the EOS carries loss; the tokens after the first EOS do not.
  size_t eos_seen = 0;
  for (size_t i = 0; i < e.ids.size(); ++i) {
    if (e.ids[i] == *tok->eos_id()) {
      EXPECT_EQ(e.loss_mask[i], 1) << i;
      ++eos_seen;
      if (i + 1 < e.ids.size()) EXPECT_EQ(e.loss_mask[i + 1], 0) << i + 1;
    }
  }
  EXPECT_EQ(eos_seen, 2u);
  // The masked tokens decode to exactly the replies (with their leading space) and the EOS.
  std::vector<int32_t> target;
  for (size_t i = 0; i < e.ids.size(); ++i)
    if (e.loss_mask[i]) target.push_back(e.ids[i]);
  EXPECT_EQ(tok->decode(target, false), " Hello<｜end▁of▁sentence｜> Ciao<｜end▁of▁sentence｜>");
}

TEST(ChatTemplate, ConcurrentEncode) {
  auto tok = load_tokenizer(test::tokenizer_fixture_dir("deepseek_llm") + "/tokenizer.json");
  auto tmpl = make_chat_template("deepseek", *tok);
  std::vector<ChatMessage> msgs = {
      {"system", "Be brief."}, {"user", "数 12345?"}, {"assistant", "  ok 😀\n"}};
  EncodedChat ref = tmpl->encode(msgs, true);
  std::vector<std::thread> threads;
  std::vector<int> bad(4, 0);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        EncodedChat e = tmpl->encode(msgs, true);
        if (e.ids != ref.ids || e.loss_mask != ref.loss_mask) ++bad[t];
      }
    });
  for (auto& th : threads) th.join();
  for (int b : bad) EXPECT_EQ(b, 0);
}

TEST(ChatTemplate, NamesAndUnknownName) {
  EXPECT_EQ(chat_template_names(), (std::vector<std::string>{"auto", "hf", "deepseek", "plain"}));
  auto tok = load_tokenizer(test::tokenizer_fixture_dir("gpt2") + "/tokenizer.json");
  try {
    make_chat_template("chatml", *tok);
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "unknown chat template 'chatml' (known: auto, hf, deepseek, plain)");
    EXPECT_EQ(e.exit_code(), kExitUsage);
  }
}

TEST(ChatTemplate, UnknownRoleIsAnError) {
  auto tok = load_tokenizer(test::tokenizer_fixture_dir("deepseek_llm") + "/tokenizer.json");
  auto tmpl = make_chat_template("deepseek", *tok);
  try {
    tmpl->encode({{"user", "x"}, {"tool", "y"}}, true);
    FAIL() << "expected Error";
  } catch (const Error& e) {
    EXPECT_STREQ(
        e.what(),
        "chat template 'deepseek': message 1 has role 'tool' (expected system, user or assistant)");
  }
}

TEST(ChatTemplate, DeepseekNeedsBosAndEos) {
  // A tokenizer without BOS/EOS (no tokenizer_config.json, no template, no known names).
  json tj = test::read_json_file(test::tokenizer_fixture_dir("gpt2") + "/tokenizer.json");
  tj["added_tokens"] = json::array();
  auto tok = tokenizer_from_json(tj.dump(), "bare.json");
  EXPECT_FALSE(tok->bos_id());
  EXPECT_FALSE(tok->eos_id());
  try {
    make_chat_template("deepseek", *tok);
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("chat template 'deepseek' needs a BOS token"),
              std::string::npos)
        << e.what();
  }
  // "plain" works without them: no BOS, replies end with "\n\n".
  auto plain = make_chat_template("plain", *tok);
  EXPECT_EQ(plain->render({{"system", "S"}, {"user", "U"}, {"assistant", "A"}}),
            "System: S\n\nUser: U\n\nAssistant: A\n\n");
  EXPECT_EQ(plain->encode_prompt({{"user", "U"}}), tok->encode("User: U\n\nAssistant:", false));
}

}  // namespace
}  // namespace ciuic
