// Helpers shared by the tokenizer tests: fixture paths and JSON loading.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ciuic::test {

// tests/fixtures/tokenizer/<name>
std::string tokenizer_fixture_dir(const std::string& name);
// The fixture folders with expected.json (deepseek_llm, deepseek_coder, llama3, gpt2, gpt2_prefix).
std::vector<std::string> tokenizer_fixture_names();
nlohmann::json read_json_file(const std::string& path);
std::string read_text_file(const std::string& path);
// Writes `text` to a fresh file under CIUIC_TEST_TMP/tokenizer/<name> and returns its path.
std::string write_temp_file(const std::string& name, const std::string& text);
// "[1, 2, 3]"
std::string ids_to_string(const std::vector<int32_t>& ids);

}  // namespace ciuic::test
