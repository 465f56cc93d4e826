// Helpers shared by the tokenizer tests: fixture paths and JSON loading.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ciuic::test {

// tests/fixtures/tokenizer/<name>
std::string tokenizer_fixture_dir(const std::string& name);
// The fixture folders with expected.json: byte-level (deepseek_llm, deepseek_coder, llama3, gpt2,
// gpt2_prefix: gen_tokenizer.py) and SentencePiece-style / Qwen2 (llama2_spm, mistral_spm,
// gemma_spm, qwen2, spm_variants_a, spm_variants_b: gen_tokenizer_spm.py).
std::vector<std::string> tokenizer_fixture_names();
// decode(encode(s)) == s holds for every valid text (HF's own behaviour for that layout).
bool tokenizer_fixture_is_lossless(const std::string& name);
nlohmann::json read_json_file(const std::string& path);
std::string read_text_file(const std::string& path);
// Writes `text` to a fresh file under CIUIC_TEST_TMP/tokenizer/<name> and returns its path.
std::string write_temp_file(const std::string& name, const std::string& text);
// "[1, 2, 3]"
std::string ids_to_string(const std::vector<int32_t>& ids);

}  // namespace ciuic::test
