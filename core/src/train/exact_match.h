// train/exact_match.h — exact-match accuracy of greedy answers on held-out chat questions.
//
// The trainer's [train] exact_match_file evaluation (what `make demo` shows): the held-out file is
// loaded once; before and after training each rank scores its share of the questions with the
// model's greedy generation, the counts are summed across ranks, and format_table() shows the two
// results side by side.
//
//   auto questions = ciuic::train::load_held_out(dir + "/eval.jsonl");
//   auto before = ciuic::train::exact_match(questions, *tokenizer, *chat_template,
//       [&](const std::vector<int32_t>& prompt, int64_t max_new) {
//         return model.generate_greedy(prompt, max_new, tokenizer->eos_id());
//       });
//   ... train ...
//   std::cout << ciuic::train::format_table(before, after);
//
// Input: JSONL lines {"messages": [...], "answer"?: str, "category"?: str} (gen_demo_data.py's
// eval.jsonl). The prompt is every message before the last assistant message; the expected answer
// is "answer" when present, else that last assistant message's content. The prompt is encoded with
// ChatTemplate::encode_prompt (so it ends where the assistant's reply starts).
// Matching: the generated ids are cut at the tokenizer's EOS, decoded without special tokens and
// trimmed of white space at both ends; the answer must then be equal, byte for byte.
//
// The replies as compared (ExactMatchResult::answers) are what the trainer's other figures score
// (BLEU, ROUGE-L: core/src/score; response time), which it adds as EvalFigures; format_table
// shows them below the accuracy, before vs after.
//
// Threading: load_held_out and exact_match are reentrant; the callback is called from the caller's
// thread, one question (exact_match_batched: one batch of questions, by prompt length) at a time.
// Failure: load_held_out throws ciuic::Error naming file:line for a malformed line, one without an
// assistant message, an "answer" or "category" that is not a string, or an empty (white-space only)
// expected answer; exact_match propagates the callback's exceptions.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <ciuic/error.h>
#include <ciuic/files.h>
#include <ciuic/json.h>
#include <ciuic/tokenizer.h>

namespace ciuic::train {

struct HeldOutQuestion {
  std::vector<ChatMessage> prompt;  // the conversation up to the expected reply
  std::string answer;               // exact expected reply
  std::string category;             // "" when the line has none
  std::string where;                // "<file>:<line>"
};

// Greedy continuation of `prompt_ids`: the new ids (a returned vector that starts with the prompt
// is accepted too: the prompt is cut off). It may stop early (e.g. at EOS).
using GenerateFn = std::function<std::vector<int32_t>(const std::vector<int32_t>& prompt_ids,
                                                      int64_t max_new_tokens)>;

// Greedy continuations of a batch of prompts (the same contract as GenerateFn for each);
// `which` holds each prompt's index in the question list (for per-question figures).
using GenerateBatchFn = std::function<std::vector<std::vector<int32_t>>(
    const std::vector<std::vector<int32_t>>& prompt_ids, int64_t max_new_tokens,
    const std::vector<size_t>& which)>;

// One more figure of an evaluation (BLEU, ROUGE-L, response time: train/evaluate.cpp computes
// them over all ranks): its metrics.jsonl key, its row label in format_table and printf format.
struct EvalFigure {
  std::string key, label;
  double value = 0;
  const char* format = "%.3f";
};

struct ExactMatchResult {
  int64_t total = 0, correct = 0;
  std::vector<std::string>
      answers;  // per question, in order: the reply as compared (decoded, trimmed)
  std::vector<int64_t>
      generated;  // per question: the ids generate returned (new ones, EOS included)
  std::vector<EvalFigure> figures;  // the evaluation's other figures, set by its caller
  double accuracy() const { return total ? static_cast<double>(correct) / total : 0.0; }
  std::map<std::string, std::pair<int64_t, int64_t>> by_category;  // category -> (correct, total)
  std::vector<std::string> mistakes;  // the first few: "<question> -> got '<x>', expected '<y>'"
};

inline std::vector<HeldOutQuestion> load_held_out(const std::string& path) {
  // A regular file of bounded size: /dev/zero or a FIFO is refused at once (issue 16 item 3).
  std::istringstream in(
      read_input(path, "held-out questions ([train] exact_match_file)", kMaxJsonInputBytes));
  std::vector<HeldOutQuestion> out;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(n);
    check_json_depth(line, where);
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("messages") || !j["messages"].is_array())
      throw Error(where + ": expected a JSON object with a \"messages\" array");
    HeldOutQuestion q;
    q.where = where;
    const auto& msgs = j["messages"];
    int64_t last_assistant = -1;
    for (size_t i = 0; i < msgs.size(); ++i) {
      if (!msgs[i].is_object() || !msgs[i].contains("role") || !msgs[i].contains("content") ||
          !msgs[i]["role"].is_string() || !msgs[i]["content"].is_string())
        throw Error(where + ": messages[" + std::to_string(i) +
                    "] must be {\"role\": str, \"content\": str}");
      if (msgs[i]["role"] == "assistant") last_assistant = static_cast<int64_t>(i);
    }
    if (last_assistant < 0 && !j.contains("answer"))
      throw Error(where + ": no assistant message and no \"answer\": nothing to compare with");
    const size_t prompt_end =
        last_assistant < 0 ? msgs.size() : static_cast<size_t>(last_assistant);
    for (size_t i = 0; i < prompt_end; ++i) {
      std::string role = msgs[i]["role"].get<std::string>();
      if (role == "prompter") role = "user";
      q.prompt.push_back({role, msgs[i]["content"].get<std::string>()});
    }
    if (j.contains("answer") && !j["answer"].is_string())
      throw Error(where + ": \"answer\" must be a string (the expected reply)");
    if (j.contains("category") && !j["category"].is_string())
      throw Error(where + ": \"category\" must be a string");
    q.answer = j.contains("answer") ? j["answer"].get<std::string>()
                                    : msgs[prompt_end]["content"].get<std::string>();
    // An empty reference scores nothing (BLEU counts no n-gram of it, ROUGE-L is 0 against it)
    // and a trimmed answer never equals it but for an empty reply: refused, not silently kept.
    if (q.answer.find_first_not_of(" \t\r\n") == std::string::npos)
      throw Error(where +
                  ": the expected answer is empty (\"answer\" or the last assistant message): "
                  "nothing to score against");
    if (j.contains("category")) q.category = j["category"].get<std::string>();
    out.push_back(std::move(q));
  }
  return out;
}

inline std::string trim_spaces(const std::string& s) {
  const char* ws = " \t\r\n";
  size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

// Scores the first `limit` questions (0 = all), `batch` prompts per call of `generate`. With
// batch > 1 the questions are batched in the order of their encoded prompt lengths (stable,
// shortest first), so a batch holds prompts of about one length: little left padding, none where
// they are equal (generate() then needs no attention mask). The result is in question order either
// way.
inline ExactMatchResult exact_match_batched(const std::vector<HeldOutQuestion>& questions,
                                            const Tokenizer& tok, const ChatTemplate& tmpl,
                                            const GenerateBatchFn& generate, int64_t max_new_tokens,
                                            int64_t limit, int64_t batch) {
  ExactMatchResult r;
  const auto eos = tok.eos_id();
  const size_t n =
      limit > 0 ? std::min(questions.size(), static_cast<size_t>(limit)) : questions.size();
  const size_t step = static_cast<size_t>(std::max<int64_t>(batch, 1));
  std::vector<std::vector<int32_t>> prompts(n), gens(n);
  for (size_t i = 0; i < n; ++i) prompts[i] = tmpl.encode_prompt(questions[i].prompt);
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  if (step > 1)
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return prompts[a].size() < prompts[b].size(); });
  for (size_t start = 0; start < n; start += step) {
    const std::vector<size_t> which(
        order.begin() + static_cast<std::ptrdiff_t>(start),
        order.begin() + static_cast<std::ptrdiff_t>(std::min(n, start + step)));
    std::vector<std::vector<int32_t>> some;
    for (size_t i : which) some.push_back(prompts[i]);
    std::vector<std::vector<int32_t>> got = generate(some, max_new_tokens, which);
    if (got.size() != some.size())
      throw Error("exact match: the generator answered " + std::to_string(got.size()) + " of " +
                  std::to_string(some.size()) + " prompts");
    for (size_t k = 0; k < which.size(); ++k) gens[which[k]] = std::move(got[k]);
  }
  for (size_t i = 0; i < n; ++i) {
    const HeldOutQuestion& q = questions[i];
    const std::vector<int32_t>& prompt = prompts[i];
    std::vector<int32_t>& gen = gens[i];
    if (gen.size() >= prompt.size() && std::equal(prompt.begin(), prompt.end(), gen.begin()))
      gen.erase(gen.begin(), gen.begin() + static_cast<std::ptrdiff_t>(prompt.size()));
    r.generated.push_back(static_cast<int64_t>(gen.size()));
    if (eos)
      for (size_t j = 0; j < gen.size(); ++j)
        if (gen[j] == *eos) {
          gen.resize(j);
          break;
        }
    const std::string got = trim_spaces(tok.decode(gen, true));
    const bool ok = got == q.answer;
    r.answers.push_back(got);
    ++r.total;
    r.correct += ok;
    auto& c = r.by_category[q.category];
    c.first += ok;
    ++c.second;
    if (!ok && r.mistakes.size() < 5)
      r.mistakes.push_back((q.prompt.empty() ? std::string() : q.prompt.back().content) +
                           " -> got '" + got + "', expected '" + q.answer + "'");
  }
  return r;
}

// The same, one question at a time.
inline ExactMatchResult exact_match(const std::vector<HeldOutQuestion>& questions,
                                    const Tokenizer& tok, const ChatTemplate& tmpl,
                                    const GenerateFn& generate, int64_t max_new_tokens = 8,
                                    int64_t limit = 0) {
  return exact_match_batched(
      questions, tok, tmpl,
      [&](const std::vector<std::vector<int32_t>>& prompts, int64_t max_new,
          const std::vector<size_t>&) {
        return std::vector<std::vector<int32_t>>{generate(prompts.at(0), max_new)};
      },
      max_new_tokens, limit, 1);
}

// A small text table: one row per category and a total, columns "before" and "after".
inline std::string format_table(const ExactMatchResult& before, const ExactMatchResult& after) {
  auto cell = [](const std::pair<int64_t, int64_t>& c) {
    char b[48];
    std::snprintf(b, sizeof b, "%4lld/%-4lld %5.1f%%", static_cast<long long>(c.first),
                  static_cast<long long>(c.second), c.second ? 100.0 * c.first / c.second : 0.0);
    return std::string(b);
  };
  std::string out = "exact-match accuracy on held-out questions (greedy)\n";
  char line[160];
  std::snprintf(line, sizeof line, "  %-12s %-18s %-18s\n", "category", "before", "after");
  out += line;
  std::map<std::string, int> cats;
  for (auto& [k, v] : before.by_category) cats[k] = 1;
  for (auto& [k, v] : after.by_category) cats[k] = 1;
  for (auto& [k, unused] : cats) {
    auto find = [&](const ExactMatchResult& r) {
      auto it = r.by_category.find(k);
      return it == r.by_category.end() ? std::pair<int64_t, int64_t>{0, 0} : it->second;
    };
    std::snprintf(line, sizeof line, "  %-12s %-18s %-18s\n", k.empty() ? "-" : k.c_str(),
                  cell(find(before)).c_str(), cell(find(after)).c_str());
    out += line;
  }
  std::snprintf(line, sizeof line, "  %-12s %-18s %-18s\n", "all",
                cell({before.correct, before.total}).c_str(),
                cell({after.correct, after.total}).c_str());
  out += line;
  // The other figures, in the order "after" has them; "-" where one side lacks a figure.
  for (const EvalFigure& f : after.figures.empty() ? before.figures : after.figures) {
    auto value = [&](const ExactMatchResult& r) {
      for (const EvalFigure& g : r.figures)
        if (g.key == f.key) {
          char b[48];
          std::snprintf(b, sizeof b, g.format, g.value);
          return std::string(b);
        }
      return std::string("-");
    };
    std::snprintf(line, sizeof line, "  %-12s %-18s %-18s\n", f.label.c_str(),
                  value(before).c_str(), value(after).c_str());
    out += line;
  }
  return out;
}

}  // namespace ciuic::train
