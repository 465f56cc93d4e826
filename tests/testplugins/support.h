// Helpers shared by the foundation tests (recipe, registry, cli, sdk): scratch folders and
// running commands. Header-only; include as "support.h" (the tests add tests/testplugins to
// their include path).
#pragma once

#include <ciuic/files.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "../support/read_file.h"

namespace ciuic_test {

// A fresh, empty folder for the running test: <build>/test-tmp/<area>/<suite>.<test>.
inline std::filesystem::path test_dir(const std::string& area) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::filesystem::path d = std::filesystem::path(CIUIC_TEST_TMP) / area /
                            (std::string(info->test_suite_name()) + "." + info->name());
  {
    std::error_code rm_ec;
    ciuic::remove_tree(std::filesystem::path(d).string(), rm_ec);
  }
  std::filesystem::create_directories(d);
  return d;
}

inline void write_file(const std::filesystem::path& p, const std::string& text) {
  std::ofstream(p) << text;
}

inline bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

struct Result {
  int code = -1;
  std::string out, err;
};

// Runs `command` through the shell with $CIUIC_PLUGIN_PATH unset; stdout and stderr are captured
// through files under `io`.
inline Result run_command(const std::string& command, const std::filesystem::path& io) {
  static int n = 0;
  std::filesystem::create_directories(io);
  const auto out = io / ("out" + std::to_string(n)), err = io / ("err" + std::to_string(n));
  ++n;
  const std::string cmd =
      "env -u CIUIC_PLUGIN_PATH " + command + " >" + out.string() + " 2>" + err.string();
  const int status = std::system(cmd.c_str());
  Result r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

}  // namespace ciuic_test
