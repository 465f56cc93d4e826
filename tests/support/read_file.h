// The tests' one file reader: a file's bytes as a string ("" when it cannot be opened; the
// assertions on the content then say what is missing). Used by the foundation tests (through
// tests/testplugins/support.h), the import tests and the launch tests' subprocess helpers.
#pragma once

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace ciuic_test {

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace ciuic_test
