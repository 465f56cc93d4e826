// Where a test finds the build and source trees: decided when the test runs, not when it is
// compiled. Every test TU gets this header by `-include` (tests/CMakeLists.txt), and the compile
// commands hold only paths relative to the build folder, so two clones of the same commit compile
// the same objects and a warm ccache serves a fresh clone (CI's). ccache rewrites the `-include`
// path itself, which lies under the source tree (CCACHE_BASEDIR).
//
// The build folder is the running program's folder less CIUIC_TEST_BIN_SUBDIR (every test program
// and test helper is built into <build>/bin); CIUIC_TEST_BUILD_DIR in the environment overrides it.
// The source folder is read from <build>/ciuic-source-dir.txt, which CMake writes at configure.
//
// Each macro names a `const std::string&`: concatenate with `+`, not by juxtaposing literals.
// Failure: a missing source-dir file throws std::runtime_error naming it (re-run cmake).
#pragma once

#include <limits.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>

#if !defined(CIUIC_TEST_BIN_SUBDIR) || !defined(CIUIC_TEST_PLUGIN_SUBDIR)
#error \
    "tests/support/test_paths.h needs CIUIC_TEST_BIN_SUBDIR and CIUIC_TEST_PLUGIN_SUBDIR (set by tests/CMakeLists.txt)"
#endif

namespace ciuic_test_paths {

inline const std::string& build_dir() {
  static const std::string dir = [] {
    if (const char* e = std::getenv("CIUIC_TEST_BUILD_DIR"); e != nullptr && *e != '\0')
      return std::string(e);
    char buf[PATH_MAX];
    const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n <= 0)
      throw std::runtime_error(
          "test_paths.h: cannot read /proc/self/exe; set CIUIC_TEST_BUILD_DIR");
    std::string d(buf, static_cast<size_t>(n));
    // Up from the program file: one level for the file, one per component of the bin folder.
    const std::string sub = CIUIC_TEST_BIN_SUBDIR;
    size_t levels = 2;
    for (char c : sub) levels += c == '/';
    for (size_t i = 0; i < levels && d.rfind('/') != std::string::npos; ++i) d.erase(d.rfind('/'));
    return d;
  }();
  return dir;
}

inline const std::string& source_dir() {
  static const std::string dir = [] {
    const std::string file = build_dir() + "/ciuic-source-dir.txt";
    std::ifstream in(file);
    std::string s;
    std::getline(in, s);
    if (s.empty())
      throw std::runtime_error("test_paths.h: cannot read the source folder from " + file +
                               " (re-run cmake)");
    return s;
  }();
  return dir;
}

inline const std::string& fixtures_dir() {
  static const std::string d = source_dir() + "/tests/fixtures";
  return d;
}
inline const std::string& bin_dir() {
  static const std::string d = build_dir() + "/" CIUIC_TEST_BIN_SUBDIR;
  return d;
}
inline const std::string& plugin_dir() {
  static const std::string d = build_dir() + "/" CIUIC_TEST_PLUGIN_SUBDIR;
  return d;
}
inline const std::string& test_tmp() {
  static const std::string d = build_dir() + "/test-tmp";
  return d;
}
inline const std::string& test_plugins() {
  static const std::string d = build_dir() + "/test-plugins";
  return d;
}

}  // namespace ciuic_test_paths

#define CIUIC_BUILD_DIR (::ciuic_test_paths::build_dir())
#define CIUIC_SOURCE_DIR (::ciuic_test_paths::source_dir())
#define CIUIC_FIXTURES_DIR (::ciuic_test_paths::fixtures_dir())
#define CIUIC_BIN_DIR (::ciuic_test_paths::bin_dir())
#define CIUIC_PLUGIN_DIR (::ciuic_test_paths::plugin_dir())
#define CIUIC_TEST_TMP (::ciuic_test_paths::test_tmp())
#define CIUIC_TEST_PLUGINS (::ciuic_test_paths::test_plugins())
