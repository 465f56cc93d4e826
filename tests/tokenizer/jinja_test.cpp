// The Jinja engine and the "hf" chat template vs transformers (fixtures written by
// tests/fixtures/gen_chat_templates.py): language cases one by one; 77 real chat templates
// (chat_template_corpus.py) rendered on a dozen conversations, tools and tool calls included; then
// the real chat templates of Llama-3, DeepSeek-LLM, Qwen2 and Mistral (v0.1, v0.3) through the
// "hf" ChatTemplate — rendered text, ids, generation prompts and HF's {% generation %} masks.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <memory>
#include <thread>

#include <ciuic/error.h>
#include <ciuic/files.h>
#include <ciuic/tokenizer.h>

#include "jinja/jinja.h"
#include "test_util.h"
#include "tokenizer/factory.h"

namespace ciuic {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

std::string fixture_dir() { return std::string(CIUIC_FIXTURES_DIR) + "/chat_templates"; }

std::vector<ChatMessage> messages_of(const json& j) {
  std::vector<ChatMessage> out;
  for (const json& m : j)
    out.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  return out;
}

TEST(Jinja, LanguageCasesMatchTransformers) {
  ordered_json cases =
      ordered_json::parse(test::read_text_file(fixture_dir() + "/jinja_cases.json"));
  ASSERT_GE(cases.size(), 50u);
  for (const auto& c : cases) {
    const std::string name = c["name"].get<std::string>();
    SCOPED_TRACE(name);
    try {
      jinja::Template t(c["template"].get<std::string>(), name);
      jinja::Rendered r = t.render(c["vars"]);
      if (c.contains("error")) {
        ADD_FAILURE() << "expected the error \"" << c["error"].get<std::string>() << "\", rendered "
                      << r.text;
        continue;
      }
      EXPECT_EQ(r.text, c["text"].get<std::string>());
    } catch (const jinja::TemplateError& e) {
      if (!c.contains("error")) {
        ADD_FAILURE() << "unexpected error: " << e.what();
        continue;
      }
      // Same message as jinja2's (ours may add where it happened).
      EXPECT_NE(e.message().find(c["error"].get<std::string>()), std::string::npos)
          << "ours: " << e.message() << "\nHF: " << c["error"].get<std::string>();
    }
  }
}

// Real chat templates of public model families (tests/fixtures/chat_template_corpus.py and the
// model templates of gen_chat_templates.py) on a dozen conversations, against transformers'
// apply_chat_template: the text, or the error the template (or jinja2) raised.
TEST(Jinja, RealTemplatesMatchApplyChatTemplate) {
  // strftime_now() at the instant the fixtures pin (gen_chat_templates.py, FIXTURE_NOW): the
  // Llama 3.x templates print today's date, which must not make the test depend on the day.
  struct PinnedNow {
    PinnedNow() { setenv("SOURCE_DATE_EPOCH", "1796212800", 1); }  // 2026-12-02 12:00 UTC
    ~PinnedNow() { unsetenv("SOURCE_DATE_EPOCH"); }
  } pinned;
  ordered_json fx =
      ordered_json::parse(test::read_text_file(fixture_dir() + "/real_templates.json"));
  ASSERT_GE(fx["templates"].size(), 50u);
  size_t renders = 0, right = 0, templates_right = 0;
  for (const auto& t : fx["templates"]) {
    const std::string name = t["name"].get<std::string>();
    SCOPED_TRACE(name + " (" + t["source"].get<std::string>() + ")");
    std::unique_ptr<jinja::Template> tmpl;
    try {
      tmpl = std::make_unique<jinja::Template>(t["template"].get<std::string>(), name);
    } catch (const jinja::TemplateError& e) {
      ADD_FAILURE() << "does not parse: " << e.what();
      renders += t["renders"].size();
      continue;
    }
    size_t wrong = 0;
    for (const auto& [conv, want] : t["renders"].items()) {
      SCOPED_TRACE(conv);
      const ordered_json& c = fx["conversations"][conv];
      ordered_json vars = t["tokens"];  // what apply_chat_template passes, in its order
      vars["messages"] = c["messages"];
      vars["tools"] = c["tools"];
      vars["documents"] = nullptr;
      vars["add_generation_prompt"] = c["add_generation_prompt"];
      ++renders;
      std::string text, error;
      try {
        text = tmpl->render(vars).text;
      } catch (const jinja::TemplateError& e) {
        error = e.message();
      }
      bool ok;
      if (want.contains("error")) {
        ok = !error.empty() && error.find(want["error"].get<std::string>()) != std::string::npos;
        EXPECT_TRUE(ok) << "HF raised: " << want["error"].get<std::string>()
                        << "\nours: " << (error.empty() ? text : error);
      } else {
        ok = error.empty() && text == want["text"].get<std::string>();
        EXPECT_TRUE(ok) << "ours: " << (error.empty() ? text : "error: " + error)
                        << "\nHF:   " << want["text"].get<std::string>();
      }
      right += ok ? 1 : 0;
      wrong += ok ? 0 : 1;
    }
    templates_right += wrong == 0 ? 1 : 0;
  }
  std::printf(
      "[real templates] %zu/%zu renders as transformers, %zu/%zu templates right in every case\n",
      right, renders, templates_right, static_cast<size_t>(fx["templates"].size()));
  EXPECT_GE(renders, 500u);
}

// strftime_now(): "now" in local time, as transformers; SOURCE_DATE_EPOCH (seconds, UTC) pins it;
// a value that is not a count of seconds is ignored.
TEST(Jinja, StrftimeNowHonoursSourceDateEpoch) {
  jinja::Template t("{{ strftime_now('%Y-%m-%d %H:%M') }}");
  setenv("SOURCE_DATE_EPOCH", "86399", 1);
  EXPECT_EQ(t.render(ordered_json::object()).text, "1970-01-01 23:59");
  setenv("SOURCE_DATE_EPOCH", "1796212800", 1);
  EXPECT_EQ(t.render(ordered_json::object()).text, "2026-12-02 12:00");
  setenv("SOURCE_DATE_EPOCH", "yesterday", 1);
  EXPECT_NE(t.render(ordered_json::object()).text.rfind("20", 0), std::string::npos);
  unsetenv("SOURCE_DATE_EPOCH");
  char today[16];
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  std::strftime(today, sizeof today, "%Y-%m-%d", &tm);
  EXPECT_EQ(t.render(ordered_json::object()).text.substr(0, 10), today);
}

TEST(Jinja, GenerationBlocksGiveByteRanges) {
  jinja::Template t(
      "{% for m in messages %}{{ m.role }}: {% if m.role == 'assistant' %}{% generation %}"
      "{{ m.content }}!{% endgeneration %}{% else %}{{ m.content }}{% endif %}\n{% endfor %}");
  EXPECT_TRUE(t.has_generation_blocks());
  ordered_json v = {
      {"messages",
       {{{"role", "user"}, {"content", "hé"}}, {{"role", "assistant"}, {"content", "yo"}}}}};
  jinja::Rendered r = t.render(v);
  // trim_blocks (as transformers sets it): the newline right after {% endif %} is dropped.
  EXPECT_EQ(r.text, "user: héassistant: yo!");
  ASSERT_EQ(r.generation.size(), 1u);
  EXPECT_EQ(r.text.substr(r.generation[0].first, r.generation[0].second - r.generation[0].first),
            "yo!");
}

TEST(Jinja, ParseErrorsNamePlaceAndConstruct) {
  auto message = [](const std::string& src) {
    try {
      jinja::Template t(src, "tpl");
      return std::string("no error");
    } catch (const jinja::TemplateError& e) {
      EXPECT_EQ(e.exit_code(), kExitUsage);
      return std::string(e.what());
    }
  };
  EXPECT_EQ(message("{% for x in y %}"), "tpl:1:17: missing {% endfor %}");
  EXPECT_EQ(message("a\n{{ x + }}"), "tpl:2:8: unexpected '}}' in an expression");
  EXPECT_EQ(message("{% include 'x' %}"),
            "tpl:1:4: unsupported statement '{% include %}' (chat templates support if, for, set, "
            "macro, call, "
            "filter, break, continue, generation, raw)");
  EXPECT_EQ(message("{{ f(**d, x=1) }}"), "tpl:1:5: invalid syntax for function call expression");
  EXPECT_EQ(message("{{ f(*a, *b) }}"), "tpl:1:5: invalid syntax for function call expression");
  EXPECT_EQ(message("{% filter upper %}x"), "tpl:1:20: missing {% endfilter %}");
  EXPECT_EQ(message("{% endif %}"),
            "tpl:1:4: unexpected '{% endif %}' (no open block it could close)");
  EXPECT_EQ(message("{{ 'abc }}"), "tpl:1:4: unterminated string literal");
  EXPECT_EQ(message("{% break %}"), "tpl:1:4: 'break' outside of a for loop");
  EXPECT_EQ(message("{{ x "), "tpl:1:1: unclosed tag '{{'");
}

TEST(Jinja, StarStarNeedsAMapping) {
  // jinja2 names its own call() in this message; ciuic says what Python says about the argument.
  jinja::Template t("{{ dict(**[1]) }}", "tpl");
  try {
    t.render(ordered_json::object());
    FAIL();
  } catch (const jinja::TemplateError& e) {
    EXPECT_EQ(std::string(e.what()), "tpl:1:11: argument after ** must be a mapping, not list");
  }
}

TEST(Jinja, RaiseExceptionIsMarked) {
  jinja::Template t("{{ raise_exception('roles must alternate') }}", "tpl");
  try {
    t.render(ordered_json::object());
    FAIL();
  } catch (const jinja::TemplateError& e) {
    EXPECT_TRUE(e.raised());
    EXPECT_EQ(e.message(), "roles must alternate");
  }
}

// ---- the models' real templates through ChatTemplate "hf" ----------------------------------
class HfTemplateTest : public ::testing::TestWithParam<std::string> {};

TEST_P(HfTemplateTest, MatchesApplyChatTemplate) {
  const std::string dir = fixture_dir() + "/" + GetParam();
  auto tok = load_tokenizer(dir + "/tokenizer.json");
  auto tmpl = make_chat_template("hf", *tok);
  EXPECT_EQ(tmpl->name().rfind("hf:", 0), 0u) << tmpl->name();
  json expected = test::read_json_file(dir + "/expected.json");
  size_t checked = 0;
  for (const json& c : expected["conversations"]) {
    std::vector<ChatMessage> msgs = messages_of(c["messages"]);
    SCOPED_TRACE(GetParam() + ": " + c["messages"].dump());
    if (c.contains("error")) {
      try {
        tmpl->render(msgs);
        ADD_FAILURE() << "expected the template to refuse: " << c["error"].get<std::string>();
      } catch (const UsageError& e) {
        EXPECT_NE(std::string(e.what()).find(c["error"].get<std::string>()), std::string::npos)
            << e.what();
      }
      continue;
    }
    ++checked;
    EXPECT_EQ(tmpl->render(msgs), c["text"].get<std::string>());
    std::vector<int32_t> ids = c["ids"].get<std::vector<int32_t>>();
    EncodedChat all = tmpl->encode(msgs, false);
    EXPECT_EQ(all.ids, ids) << "ours: " << test::ids_to_string(all.ids)
                            << "\nHF:   " << test::ids_to_string(ids);
    EncodedChat asst = tmpl->encode(msgs, true);
    EXPECT_EQ(asst.ids, ids);
    EXPECT_EQ(asst.loss_mask, c["assistant_mask"].get<std::vector<uint8_t>>())
        << "ours: "
        << test::ids_to_string(std::vector<int32_t>(asst.loss_mask.begin(), asst.loss_mask.end()));
    EXPECT_EQ(tmpl->encode_prompt(msgs), c["prompt_ids"].get<std::vector<int32_t>>());
  }
  EXPECT_GE(checked, 7u);
}

INSTANTIATE_TEST_SUITE_P(Models, HfTemplateTest,
                         ::testing::Values("llama3", "deepseek_llm", "qwen2", "mistral_v1",
                                           "mistral_v3"),
                         [](const auto& info) { return info.param; });

TEST(HfTemplate, DeepseekFixtureEqualsTheBuiltIn) {
  // tests/fixtures/tokenizer/deepseek_llm carries DeepSeek's template: "hf" must do what
  // "deepseek" does, mask included, on the tokenizer fixture's chats.
  auto tok = load_tokenizer(test::tokenizer_fixture_dir("deepseek_llm") + "/tokenizer.json");
  auto hf = make_chat_template("hf", *tok);
  json expected =
      test::read_json_file(test::tokenizer_fixture_dir("deepseek_llm") + "/expected.json");
  for (const json& c : expected["chats"]) {
    if (c["template"] != "deepseek") continue;
    std::vector<ChatMessage> msgs = messages_of(c["messages"]);
    EncodedChat e = hf->encode(msgs, true);
    EXPECT_EQ(e.ids, c["ids"].get<std::vector<int32_t>>()) << c["messages"].dump();
    EXPECT_EQ(e.loss_mask, c["assistant_mask"].get<std::vector<uint8_t>>()) << c["messages"].dump();
  }
}

TEST(HfTemplate, AutoFallsBackToPlainAndHfNeedsATemplate) {
  auto tok =
      load_tokenizer(test::tokenizer_fixture_dir("gpt2") + "/tokenizer.json");  // no template
  EXPECT_EQ(make_chat_template("auto", *tok)->name(), "plain");
  try {
    make_chat_template("hf", *tok);
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("chat template 'hf' needs the model's template"),
              std::string::npos);
  }
  auto with = load_tokenizer(fixture_dir() + "/qwen2/tokenizer.json");
  EXPECT_EQ(make_chat_template("auto", *with)->name(), make_chat_template("hf", *with)->name());
}

TEST(HfTemplate, ChatTemplateJinjaFileWinsAndListFormIsRead) {
  namespace fs = std::filesystem;
  const fs::path d = fs::path(CIUIC_TEST_TMP) / "tokenizer" / "hf_template_forms";
  {
    std::error_code rm_ec;
    ciuic::remove_tree(d.string(), rm_ec);
  }
  fs::create_directories(d);
  fs::copy_file(fixture_dir() + "/qwen2/tokenizer.json", d / "tokenizer.json");
  json cfg = test::read_json_file(fixture_dir() + "/qwen2/tokenizer_config.json");
  cfg["chat_template"] =
      json::array({{{"name", "tool_use"}, {"template", "TOOLS"}},
                   {{"name", "default"},
                    {"template", "{% for m in messages %}[{{ m.content }}]{% endfor %}"}}});
  test::write_temp_file("hf_template_forms/tokenizer_config.json", cfg.dump());
  auto tok = load_tokenizer((d / "tokenizer.json").string());
  EXPECT_EQ(make_chat_template("hf", *tok)->render({{"user", "a"}, {"assistant", "b"}}), "[a][b]");
  test::write_temp_file("hf_template_forms/chat_template.jinja",
                        "{% for m in messages %}<{{ m.role }}>{% endfor %}");
  auto tok2 = load_tokenizer((d / "tokenizer.json").string());
  EXPECT_EQ(make_chat_template("hf", *tok2)->render({{"user", "a"}}), "<user>");
}

TEST(HfTemplate, RewrittenRepliesAreAClearError) {
  // A template that prints something other than the reply and has no generation blocks: the
  // assistant's tokens cannot be known.
  namespace fs = std::filesystem;
  const fs::path d = fs::path(CIUIC_TEST_TMP) / "tokenizer" / "hf_template_rewrite";
  {
    std::error_code rm_ec;
    ciuic::remove_tree(d.string(), rm_ec);
  }
  fs::create_directories(d);
  fs::copy_file(fixture_dir() + "/qwen2/tokenizer.json", d / "tokenizer.json");
  json cfg = test::read_json_file(fixture_dir() + "/qwen2/tokenizer_config.json");
  // Earlier turns are re-rendered differently (count of messages in every turn), and replies are
  // upper-cased: neither prefixes nor the reply text can be found.
  cfg["chat_template"] =
      "{% for m in messages %}{{ messages|length }}{{ m.content|upper }}|{% endfor %}";
  test::write_temp_file("hf_template_rewrite/tokenizer_config.json", cfg.dump());
  auto tok = load_tokenizer((d / "tokenizer.json").string());
  auto t = make_chat_template("hf", *tok);
  EXPECT_EQ(t->encode({{"user", "q"}, {"assistant", "a"}}, false).ids.size(),
            tok->encode("2Q|2A|", false).size());
  try {
    t->encode({{"user", "q"}, {"assistant", "a"}}, true);
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot find assistant message 1"), std::string::npos)
        << e.what();
  }
}

TEST(HfTemplate, ThreadSafe) {
  auto tok = load_tokenizer(fixture_dir() + "/mistral_v3/tokenizer.json");
  auto t = make_chat_template("hf", *tok);
  std::vector<ChatMessage> msgs{
      {"system", "S"}, {"user", "a"}, {"assistant", "b"}, {"user", "c"}, {"assistant", "d"}};
  EncodedChat ref = t->encode(msgs, true);
  std::vector<int> bad(4, 0);
  std::vector<std::thread> th;
  for (int k = 0; k < 4; ++k)
    th.emplace_back([&, k] {
      for (int i = 0; i < 50; ++i) {
        EncodedChat e = t->encode(msgs, true);
        if (e.ids != ref.ids || e.loss_mask != ref.loss_mask) ++bad[k];
      }
    });
  for (auto& x : th) x.join();
  for (int b : bad) EXPECT_EQ(b, 0);
}

}  // namespace
}  // namespace ciuic
