// tests/fuzz/modelfiles_fuzz.cpp — the files a user puts beside a model for --generate, --chat and
// a LoRA adapter: PEFT's adapter_config.json (model::read_peft_adapter_config, then
// lora_spec_from_peft) with its adapter_model.safetensors (LlamaModel::load_lora on the llama_pad
// fixture), generation_config.json and config.json's generation keys (sampling_of_folder,
// eos_ids_of_folder), and a --prompts JSONL file (app/prompt_lines.h, line by line as
// generate_cli.cpp reads it).
//
// Input: one selector byte, then
//   0 (mod 3): adapter_config.json ["\n%%\n" adapter_model.safetensors]
//   1: generation_config.json ["\n%%\n" config.json]
//   2: a prompts file
// The files go into a temporary folder (the readers take paths; the safetensors file is
// memory-mapped, so ASan sees its true end).
// Checks: only ciuic::Error escapes (with a short, valid UTF-8 message; a UsageError for the
// adapter config and the prompts, as the CLI reports them with exit 2); an accepted spec has r > 0,
// alpha > 0 and at least one target; an adapter loads only when it holds exactly the adapter's
// tensors with their shapes; accepted sampling settings are valid; an accepted prompt line holds
// the prompt or as many messages as its JSON.
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "app/prompt_lines.h"
#include "fuzz_common.h"
#include "model/generate.h"
#include "model/llama.h"
#include "model/lora.h"
#include "model/safetensors.h"

namespace {

namespace fs = std::filesystem;
using namespace ciuic;

void remove_file(const fs::path& p) {
  std::error_code ec;
  fs::remove(p, ec);
}

// The temporary folder, removed at exit (a plain array: destroyed strings are not read then).
char g_folder[] = "/tmp/ciuic-fuzz-modelfiles-XXXXXX";

const fs::path& folder() {
  static const fs::path d = [] {
    if (!::mkdtemp(g_folder)) fuzz::fail("mkdtemp", "/tmp");
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(g_folder, ec);
    });
    return fs::path(g_folder);
  }();
  return d;
}

// The base model an adapter loads into: a hidden size of 32, so ranks past this are not built
// (a rank is not bounded by the reader; see docs/reliability.md, "Fuzzing").
constexpr int64_t kMaxRankBuilt = 64;

void adapter(std::string_view data) {
  const auto [config, weights] = fuzz::split_once(data, "\n%%\n");
  const fs::path cfg = folder() / "adapter_config.json",
                 st = folder() / "adapter_model.safetensors";
  fuzz::write_file(cfg, config);
  model::LoraSpec spec;
  try {
    spec = model::lora_spec_from_peft(model::read_peft_adapter_config(cfg.string()), cfg.string());
  } catch (const UsageError& e) {
    fuzz::check_message(e.what());
    return;
  }
  fuzz::check(spec.r > 0 && spec.alpha > 0 && !spec.targets.empty(), "accepted a bad spec", config);
  if (weights.empty() || spec.r > kMaxRankBuilt) return;
  fuzz::write_file(st, weights);
  static const std::string base = fuzz::fixtures_dir() + "/model/families/llama_pad";
  auto m = model::LlamaModel::from_pretrained(base, at::kFloat, at::kCPU);
  m->enable_lora(spec);
  const bool loaded = fuzz::expect_ok_or_error([&] {
    const auto reader = model::SafetensorsReader::open(st.string());
    m->load_lora(reader);
    std::set<std::string> names;
    for (const auto& [name, t] : m->trainable_parameters()) {
      const std::string key = "base_model.model." + name;
      names.insert(key);
      fuzz::check(reader.contains(key) && reader.entry(key).shape == t.sizes().vec(),
                  "loaded an adapter without a tensor or with another shape", key);
    }
    const auto all = reader.names();
    fuzz::check(std::set<std::string>(all.begin(), all.end()) == names,
                "loaded an adapter with other tensors");
  });
  (void)loaded;
  remove_file(st);
}

void generation(std::string_view data) {
  const auto parts = fuzz::split_once(data, "\n%%\n");  // (no structured binding: clang 14's
  const std::string_view gen = parts.first, config = parts.second;  // lambdas cannot capture one)
  const fs::path g = folder() / "generation_config.json", c = folder() / "config.json";
  fuzz::write_file(g, gen);
  if (!config.empty())
    fuzz::write_file(c, config);
  else
    remove_file(c);
  fuzz::expect_ok_or_error([&] {
    const model::SamplingParams s = model::sampling_of_folder(folder().string());
    // What SamplingParams::validate() demands, restated: the reader must not accept less.
    fuzz::check(s.temperature > 0 && std::isfinite(s.temperature) && s.top_k >= 0 && s.top_p > 0 &&
                    s.top_p <= 1 && s.min_p >= 0 && s.min_p <= 1 && s.repetition_penalty > 0 &&
                    std::isfinite(s.repetition_penalty),
                "accepted sampling settings validate() refuses", gen);
  });
  fuzz::expect_ok_or_error([&] { (void)model::eos_ids_of_folder(folder().string()); });
  remove_file(g);
  remove_file(c);
}

void prompts(std::string_view text) {
  size_t start = 0;
  for (int n = 1; start < text.size(); ++n) {
    const size_t end = std::min(text.find('\n', start), text.size());
    try {
      const std::string_view line = text.substr(start, end - start);
      const auto p = app::parse_prompt_line(line, "prompts.jsonl:" + std::to_string(n));
      if (p) {  // what the line holds, read back with nlohmann directly
        const auto j = nlohmann::json::parse(line);
        if (p->prompt)
          fuzz::check(j.at("prompt") == *p->prompt, "the prompt differs", line);
        else
          fuzz::check(j.at("messages").size() == p->messages.size(), "messages lost", line);
      }
    } catch (const UsageError& e) {
      fuzz::check_message(e.what());
    }
    start = end + 1;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 3) {
    case 0: adapter(rest); break;
    case 1: generation(rest); break;
    default: prompts(rest);
  }
  return 0;
}
