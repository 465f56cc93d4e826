#include "test_util.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace ciuic::test {

std::string tokenizer_fixture_dir(const std::string& name) {
  return std::string(CIUIC_FIXTURES_DIR) + "/tokenizer/" + name;
}

std::vector<std::string> tokenizer_fixture_names() {
  return {"deepseek_llm", "deepseek_coder", "llama3",        "gpt2",
          "gpt2_prefix",  "llama2_spm",     "mistral_spm",   "gemma_spm",
          "qwen2",        "spm_variants_a", "spm_variants_b"};
}

bool tokenizer_fixture_is_lossless(const std::string& name) {
  // No normalizer that changes text, and a decoder that gives back every space (Metaspace
  // "first" drops the leading space of " x"; NFC, NFKC, Lowercase, Strip change text).
  for (const char* n : {"mistral_spm", "qwen2", "spm_variants_a", "spm_variants_b"})
    if (name == n) return false;
  return true;
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

nlohmann::json read_json_file(const std::string& path) {
  return nlohmann::json::parse(read_text_file(path));
}

std::string write_temp_file(const std::string& name, const std::string& text) {
  std::filesystem::path p = std::filesystem::path(CIUIC_TEST_TMP) / "tokenizer" / name;
  std::filesystem::create_directories(p.parent_path());
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
  return p.string();
}

std::string ids_to_string(const std::vector<int32_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? ", " : "") + std::to_string(ids[i]);
  return s + "]";
}

}  // namespace ciuic::test
