// The import tests' one file reader: a file's bytes as a string ("" when it cannot be opened; the
// assertions on the content then say what is missing).
#pragma once

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace ciuic::importer {

inline std::string read(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace ciuic::importer
