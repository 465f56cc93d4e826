// Helpers of the end-to-end tests: a tiny model's recipe, running build/bin/ciuic-run on CPU
// workers (gloo), reading the fp32 Hugging Face export and metrics.jsonl, and comparing runs.
// Header-only; include as "e2e_support.h" (tests add tests/train to their include path).
#pragma once

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <ciuic/checksum.h>

#include "../launch/subprocess.h"
#include "model/safetensors.h"

namespace ciuic::e2e {

using ciuic::testing::Child;

struct Shape {
  int world = 1;
  int micro = 12;
  int accum = 1;
  int steps = 5;
  std::string sharding = "zero2";
  std::string precision = "fp32";
  std::string extra;  // more TOML, appended
  std::string data;   // the [data] section's keys instead of synthetic's (e.g. another plugin)
  std::string model;  // [model] keys (e.g. tokenizer = "...")
  int64_t vocab = 64;
  std::vector<std::string> plugin_paths;  // extra plugin folders (--plugin-path)
};

inline std::string recipe_text(const Shape& s, const std::string& out) {
  std::ostringstream r;
  r << "[run]\nname = \"e2e\"\noutput_dir = \"" << out << "\"\nseed = 7\n"
    << "[cluster]\nnproc_per_node = " << s.world << "\ntimeout_s = 60.0\n"
    << (s.model.empty() ? "" : "[model]\n" + s.model)
    << "[model.config]\nhidden_size = 32\nintermediate_size = 64\nnum_hidden_layers = 2\n"
    << "num_attention_heads = 4\nnum_key_value_heads = 2\nvocab_size = " << s.vocab << "\n"
    << "max_position_embeddings = 64\n"
    << "[train]\nmicro_batch_size = " << s.micro << "\ngradient_accumulation_steps = " << s.accum
    << "\nseq_len = 32\nmax_steps = " << s.steps << "\ngradient_clipping = 1.0\n"
    << "[optimizer]\nlr = 1e-3\nweight_decay = 0.1\n"
    << "[precision]\nplugin = \"" << s.precision << "\"\n"
    << "[sharding]\nplugin = \"" << s.sharding << "\"\n"
    << (s.sharding == "zero3" ? "" : "reduce_bucket_size = 3000\n")  // zero3 has no buckets
    << "[data]\n"
    << (s.data.empty() ? "plugin = \"synthetic\"\nvocab_size = 64\ndocuments_per_row = 3\n"
                       : s.data)
    << "[checkpoint]\nexport_hf = true\nexport_dtype = \"fp32\"\n"
    << "[log]\nprogress = \"off\"\n"
    << s.extra;
  return r.str();
}

struct Result {
  int code = -1;
  std::string out, err, dir;
  std::string log() const { return "--- stdout\n" + out + "\n--- stderr\n" + err; }
};

// Writes the recipe into a fresh folder and runs ciuic-run on it.
inline Result run(const std::string& name, const Shape& s,
                  const std::vector<std::string>& args = {}, int timeout_s = 240,
                  const std::vector<std::string>& env = {"OMP_NUM_THREADS=1"}) {
  Result r;
  r.dir = ciuic::testing::fresh_dir("e2e-" + name);
  const std::string recipe = r.dir + "/recipe.toml";
  std::ofstream(recipe) << recipe_text(s, r.dir + "/out");
  std::vector<std::string> argv = {std::string(CIUIC_BIN_DIR) + "/ciuic-run", recipe};
  for (const auto& p : s.plugin_paths) argv.insert(argv.end(), {"--plugin-path", p});
  argv.insert(argv.end(), args.begin(), args.end());
  Child c(argv, r.dir + "/log", env);
  if (!c.wait(std::chrono::seconds(timeout_s))) {
    r.err = "timed out\n" + c.err();
    return r;
  }
  r.code = c.exit_code();
  r.out = c.out();
  r.err = c.err();
  return r;
}

using Weights = std::map<std::string, at::Tensor>;

inline Weights exported(const Result& r) {
  Weights w;
  auto f = ciuic::model::SafetensorsFile::open(r.dir + "/out/hf/model.safetensors");
  for (const auto& e : f->entries()) w[e.name] = f->tensor(e.name).to(at::kDouble);
  return w;
}

// Relative difference of two models, ||a - b|| / ||b|| over all parameters: fp32 runs that
// differ only in the order of floating-point sums (world size, micro-batch split) land near 1e-7
// after 5 AdamW steps at lr 1e-3; a real error (a lost bucket, a wrong scale) lands near 1e-2.
inline double max_rel(const Weights& a, const Weights& b) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (const auto& [k, t] : b) {
    auto it = a.find(k);
    if (it == a.end()) {
      ADD_FAILURE() << "missing tensor " << k;
      return INFINITY;
    }
    num += (it->second - t).pow(2).sum().item<double>();
    den += t.pow(2).sum().item<double>();
  }
  return std::sqrt(num / den);
}

inline bool identical(const Weights& a, const Weights& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [k, t] : b)
    if (!a.count(k) || !at::equal(a.at(k), t)) return false;
  return true;
}

// `a` followed by `b` (command-line arguments).
inline std::vector<std::string> with(std::vector<std::string> a,
                                     const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// `ciuic-run RECIPE ARGS --plan` of the shape: its "total cpu: X MiB" (NAN, with a test failure,
// when missing) and its whole output.
inline std::pair<double, std::string> plan_total_mib(const std::string& name, const Shape& s,
                                                     std::vector<std::string> args) {
  args.push_back("--plan");
  const Result r = run(name, s, args);
  const std::string text = r.out + r.err;
  std::smatch m;
  EXPECT_TRUE(std::regex_search(text, m, std::regex("total cpu: ([0-9.]+) MiB"))) << r.log();
  return {m.empty() ? NAN : std::stod(m[1]), text};
}

// The bytes of the file at `path` ("" when it cannot be read).
inline std::string bytes_of(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Edits checkpoint folder `ckpt`'s trainer.json with `edit` and records its new size and CRC-32C in
// manifest.json, as a writer of that content would have: what a damaged or foreign checkpoint that
// passes the checksums looks like.
inline void rewrite_trainer_json(const std::string& ckpt,
                                 const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json trainer = nlohmann::json::parse(std::ifstream(ckpt + "/trainer.json"));
  edit(trainer);
  const std::string text = trainer.dump(2);
  std::ofstream(ckpt + "/trainer.json", std::ios::binary | std::ios::trunc) << text;
  nlohmann::json manifest = nlohmann::json::parse(std::ifstream(ckpt + "/manifest.json"));
  manifest["files"]["trainer.json"] = {{"bytes", text.size()},
                                       {"crc32c", ciuic::crc32c(text.data(), text.size())}};
  std::ofstream(ckpt + "/manifest.json", std::ios::binary | std::ios::trunc) << manifest.dump(2);
}

// The newest step_* folder under `checkpoints` ("" when none).
inline std::string newest_checkpoint(const std::string& checkpoints) {
  std::string newest;
  for (const auto& e : std::filesystem::directory_iterator(checkpoints))
    if (e.path().filename().string().rfind("step_", 0) == 0 && e.path().string() > newest)
      newest = e.path().string();
  return newest;
}

inline std::vector<nlohmann::json> metrics(const Result& r) {
  std::vector<nlohmann::json> out;
  std::ifstream f(r.dir + "/out/metrics.jsonl");
  std::string line;
  while (std::getline(f, line))
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

// Largest relative difference between two runs' logged gradient norms, step by step.
inline double max_norm_rel(const Result& a, const Result& b) {
  std::vector<double> na, nb;
  for (const auto& rec : metrics(a))
    if (rec.contains("grad_norm")) na.push_back(rec["grad_norm"].get<double>());
  for (const auto& rec : metrics(b))
    if (rec.contains("grad_norm")) nb.push_back(rec["grad_norm"].get<double>());
  if (na.empty() || na.size() != nb.size()) return INFINITY;
  double worst = 0;
  for (size_t i = 0; i < na.size(); ++i) worst = std::max(worst, std::abs(na[i] - nb[i]) / nb[i]);
  return worst;
}

#define EXPECT_RUN_OK(r) ASSERT_EQ((r).code, 0) << (r).log()

}  // namespace ciuic::e2e
