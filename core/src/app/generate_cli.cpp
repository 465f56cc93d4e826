// --generate and --chat: an HF folder, its tokenizer and chat template, model/generate.h.
#include "app/generate_cli.h"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>

#include <ciuic/error.h>
#include <ciuic/files.h>
#include <ciuic/tokenizer.h>

#include "app/prompt_lines.h"
#include "model/generate.h"
#include "model/llama.h"
#include "tokenizer/factory.h"

namespace ciuic::app {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct Loaded {
  std::string folder;
  std::unique_ptr<model::LlamaModel> model;
  std::shared_ptr<const Tokenizer> tok;
  model::GenerateOptions gen;
  std::shared_ptr<const model::StopStrings::TokenTexts> texts;  // when there are stop strings
};

// Stop strings over the tokenizer's token texts; bad ones (empty, none) are bad input.
std::shared_ptr<const model::StopStrings> stop_strings_of(Loaded& l,
                                                          const std::vector<std::string>& stops,
                                                          const std::string& where) {
  try {
    if (!l.texts) l.texts = model::stop_token_texts(*l.tok);
    return std::make_shared<model::StopStrings>(stops, l.texts);
  } catch (const Error& e) {
    throw UsageError(where + ": " + e.what());
  }
}

// DIR itself when it holds config.json, else a run output's hf/ export.
std::string model_folder(const std::string& dir, const char* flag) {
  std::error_code ec;
  if (dir.empty()) throw UsageError(std::string(flag) + " needs a model folder");
  if (!fs::is_directory(dir, ec))
    throw UsageError(std::string(flag) + " " + dir + ": no such folder");
  if (fs::exists(fs::path(dir) / "config.json", ec)) return dir;
  if (fs::exists(fs::path(dir) / "hf" / "config.json", ec)) return (fs::path(dir) / "hf").string();
  throw UsageError(
      std::string(flag) + " " + dir +
      ": no config.json here or in hf/ (give a Hugging Face model folder, or a run's output "
      "folder after its export; a checkpoint is exported with --export-hf CKPT OUT)");
}

Loaded load(const GenerateCliOptions& o, const char* flag) {
  Loaded l;
  l.folder = model_folder(o.folder, flag);
  const std::string tok_path = (fs::path(l.folder) / "tokenizer.json").string();
  std::error_code ec;
  if (!fs::exists(tok_path, ec))
    throw UsageError(tok_path + ": no tokenizer.json in the model folder");
  if (o.dtype != "float32" && o.dtype != "bfloat16")
    throw UsageError("--dtype must be float32 or bfloat16, got " + o.dtype);
  if (o.max_new_tokens < 1)
    throw UsageError("--max-new-tokens must be >= 1, got " + std::to_string(o.max_new_tokens));
  if (o.batch < 1) throw UsageError("--batch must be >= 1, got " + std::to_string(o.batch));
  // The folder's generation_config.json is the user's input as much as the flags are: a value
  // out of range or of the wrong type there is a usage error too (exit 2, naming file and key).
  model::SamplingParams s;
  try {
    s = model::sampling_of_folder(l.folder);
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  if (o.do_sample) s.do_sample = *o.do_sample;
  if (o.temperature) s.temperature = *o.temperature;
  if (o.top_k) s.top_k = *o.top_k;
  if (o.top_p) s.top_p = *o.top_p;
  if (o.min_p) s.min_p = *o.min_p;
  if (o.repetition_penalty) s.repetition_penalty = *o.repetition_penalty;
  s.seed = o.seed;
  try {
    s.validate("sampling flags");
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  if (o.device != "cpu" && o.device.rfind("cuda", 0) != 0)
    throw UsageError("--device must be cpu or cuda[:N], got " + o.device);
  l.tok = load_tokenizer(tok_path);
  l.model = model::LlamaModel::from_pretrained(
      l.folder, o.dtype == "bfloat16" ? at::kBFloat16 : at::kFloat, c10::Device(o.device));
  l.gen.max_new_tokens = o.max_new_tokens;
  l.gen.sampling = s;
  std::vector<std::string> stops;
  try {
    l.gen.eos_ids = model::eos_ids_of_folder(l.folder);
    stops = model::stop_strings_of_folder(l.folder);
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  if (!o.stop_strings.empty()) stops = o.stop_strings;
  if (!stops.empty())
    l.gen.stop_strings = {stop_strings_of(
        l, stops, o.stop_strings.empty() ? l.folder + "/generation_config.json" : "--stop-string")};
  if (l.gen.eos_ids.empty() && l.tok->eos_id()) l.gen.eos_ids.push_back(*l.tok->eos_id());
  return l;
}

std::unique_ptr<ChatTemplate> chat_template_of(const Loaded& l) {
  std::unique_ptr<ChatTemplate> t = make_chat_template("auto", *l.tok);
  if (!t || t->name().rfind("hf:", 0) != 0)
    throw UsageError(l.folder +
                     ": the tokenizer has no chat template (tokenizer_config.json has no "
                     "chat_template and there "
                     "is no chat_template.jinja); add one of them to the folder, or use --generate "
                     "with raw prompts");
  return t;
}

// One prompt of a prompts file: raw text, or messages for the chat template.
struct Prompt {
  std::vector<int32_t> ids;
  std::shared_ptr<const model::StopStrings> stop;  // its own "stop_strings"; null: the flags'
};

std::vector<Prompt> read_prompts(const GenerateCliOptions& o, Loaded& l) {
  std::vector<Prompt> out;
  for (const auto& p : o.prompts) out.push_back({l.tok->encode(p, true), nullptr});
  if (o.prompts_file.empty()) return out;
  // A regular file of at most kMaxJsonInputBytes (as every JSON input): /dev/zero or a FIFO is
  // refused before anything is read.
  std::string text;
  try {
    text = read_input(o.prompts_file, "prompts file", kMaxJsonInputBytes);
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  std::unique_ptr<ChatTemplate> tmpl;
  size_t start = 0;
  for (int n = 1; start < text.size(); ++n) {
    const size_t end = std::min(text.find('\n', start), text.size());
    const std::string where = o.prompts_file + ":" + std::to_string(n);
    const std::optional<PromptLine> p =
        parse_prompt_line(std::string_view(text).substr(start, end - start), where);
    start = end + 1;
    if (!p) continue;
    if (p->prompt) {
      out.push_back({l.tok->encode(*p->prompt, true), nullptr});
    } else {
      if (!tmpl) tmpl = chat_template_of(l);
      out.push_back({tmpl->encode_prompt(p->messages), nullptr});
    }
    if (p->stop_strings)
      out.back().stop = stop_strings_of(l, *p->stop_strings, where + ": \"stop_strings\"");
  }
  if (out.empty()) throw UsageError(o.prompts_file + ": the prompts file has no prompts");
  return out;
}

// Text decoded so far, printed as it grows: a token that ends inside a UTF-8 character waits.
class Streamer {
 public:
  Streamer(const Tokenizer& tok, std::ostream& out) : tok_(tok), out_(out) {}
  void add(int32_t id) {
    ids_.push_back(id);
    const std::string text = tok_.decode(ids_, true);
    if (text.size() >= 3 && text.compare(text.size() - 3, 3, "\xEF\xBF\xBD") == 0) return;
    if (text.compare(0, printed_.size(), printed_) == 0) out_ << text.substr(printed_.size());
    out_.flush();
    printed_ = text;
  }
  const std::string& text() const { return printed_; }

 private:
  const Tokenizer& tok_;
  std::ostream& out_;
  std::vector<int32_t> ids_;
  std::string printed_;
};

std::atomic<bool> g_interrupted{false};
extern "C" void on_sigint(int) { g_interrupted.store(true); }

}  // namespace

int generate_cli(const GenerateCliOptions& o, std::ostream& out, std::ostream& err) {
  if (o.prompts.empty() && o.prompts_file.empty())
    throw UsageError("--generate needs --prompt TEXT or --prompts FILE.jsonl");
  Loaded l = load(o, "--generate");
  const std::vector<Prompt> prompts = read_prompts(o, l);
  const int64_t context = l.model->config().max_position_embeddings;
  for (size_t i = 0; i < prompts.size(); ++i)
    if (static_cast<int64_t>(prompts[i].ids.size()) >= context)
      throw UsageError("prompt " + std::to_string(i) + " has " +
                       std::to_string(prompts[i].ids.size()) +
                       " tokens: no room left in the model's context of " +
                       std::to_string(context) + " (max_position_embeddings)");
  std::ofstream file;
  std::ostream* sink = &out;
  if (!o.out.empty()) {
    file.open(o.out);
    if (!file) throw UsageError(o.out + ": cannot write the output file");
    sink = &file;
  }
  int64_t done = 0, tokens = 0;
  double seconds = 0;
  for (size_t start = 0; start < prompts.size(); start += static_cast<size_t>(o.batch)) {
    const size_t end = std::min(prompts.size(), start + static_cast<size_t>(o.batch));
    std::vector<std::vector<int32_t>> batch;
    model::GenerateOptions g = l.gen;
    bool own_stops = false;
    for (size_t i = start; i < end; ++i) {
      batch.push_back(prompts[i].ids);
      own_stops = own_stops || prompts[i].stop;
    }
    if (own_stops) {
      const auto shared = l.gen.stop_strings.empty() ? nullptr : l.gen.stop_strings[0];
      g.stop_strings.clear();
      for (size_t i = start; i < end; ++i)
        g.stop_strings.push_back(prompts[i].stop ? prompts[i].stop : shared);
    }
    const model::GenerateResult r = model::generate(*l.model, batch, g);
    for (size_t i = 0; i < batch.size(); ++i) {
      const auto& ids = r.tokens[i];
      const double per = ids.empty() ? 0 : static_cast<double>(ids.size()) / r.total_s;
      *sink << json{{"index", start + i},
                    {"text", l.tok->decode(ids, true)},
                    {"ids", ids},
                    {"prompt_tokens", batch[i].size()},
                    {"new_tokens", ids.size()},
                    {"stopped", r.hit_eos[i]    ? "eos"
                                : r.hit_stop[i] ? "stop_string"
                                                : "length"},
                    {"first_token_s", r.first_token_s},
                    {"seconds", r.total_s},
                    {"tokens_per_s", per}}
                   .dump()
            << "\n";
      tokens += static_cast<int64_t>(ids.size());
    }
    sink->flush();
    done += static_cast<int64_t>(batch.size());
    seconds += r.total_s;
    char line[160];
    std::snprintf(line, sizeof line, "generate: %lld/%zu prompts, %lld tokens, %.1f tokens/s\n",
                  static_cast<long long>(done), prompts.size(), static_cast<long long>(tokens),
                  seconds > 0 ? static_cast<double>(tokens) / seconds : 0.0);
    err << line << std::flush;
  }
  return 0;
}

int chat_cli(const GenerateCliOptions& o, std::istream& in, std::ostream& out, std::ostream& err) {
  Loaded l = load(o, "--chat");
  const std::unique_ptr<ChatTemplate> tmpl = chat_template_of(l);
  std::vector<ChatMessage> msgs;
  std::string system = o.system;
  auto reset = [&] {
    msgs.clear();
    if (!system.empty()) msgs.push_back({"system", system});
  };
  reset();
  err << "ciuic chat: " << l.folder << " (/reset, /system TEXT, /exit; Ctrl-C stops a reply)\n"
      << std::flush;
  std::string line;
  while (true) {
    out << "\nuser> " << std::flush;
    if (!std::getline(in, line)) break;
    if (line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      reset();
      out << "(conversation reset)\n";
      continue;
    }
    if (line.rfind("/system", 0) == 0) {
      system = line.size() > 8 ? line.substr(8) : "";
      reset();
      out << "(system message set; conversation reset)\n";
      continue;
    }
    if (line.empty()) continue;
    msgs.push_back({"user", line});
    // Ctrl-C stops the reply from here on: the handler is in place before "assistant> " shows (a
    // Ctrl-C right after it would otherwise end the session).
    g_interrupted.store(false);
    struct sigaction sa {
    }, old{};
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old);
    out << "assistant> " << std::flush;
    Streamer stream(*l.tok, out);
    model::GenerateOptions g = l.gen;
    g.on_token = [&](size_t, int32_t id) {
      if (std::find(g.eos_ids.begin(), g.eos_ids.end(), id) == g.eos_ids.end()) stream.add(id);
    };
    g.cancelled = [] { return g_interrupted.load(); };
    try {
      (void)model::generate(*l.model, {tmpl->encode_prompt(msgs)}, g);
    } catch (...) {
      sigaction(SIGINT, &old, nullptr);
      throw;
    }
    sigaction(SIGINT, &old, nullptr);
    if (g_interrupted.load()) out << " [stopped]";
    out << "\n" << std::flush;
    msgs.push_back({"assistant", stream.text()});
  }
  out << "\n";
  return 0;
}

}  // namespace ciuic::app
