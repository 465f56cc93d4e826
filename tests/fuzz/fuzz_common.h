// tests/fuzz/fuzz_common.h — what every fuzz target checks, whichever parser it drives.
//
// A target feeds its input to production parsing code (compiled into it unchanged) and lets only
// ciuic::Error escape the parser: anything else — a JSON or TOML library exception, std::bad_alloc,
// std::out_of_range — reaches std::terminate, which libFuzzer reports as a crash (and the replay
// test as a failure). The message of every Error is checked too: each line at most kMaxLine
// bytes and valid UTF-8 (user data is quoted as a short excerpt, never whole: docs/reliability.md).
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <ciuic/error.h>

namespace ciuic::fuzz {

inline constexpr size_t kMaxLine = 1024;

// Length of the well-formed UTF-8 sequence at s[i], 0 when ill-formed.
inline size_t utf8_len(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = b(0);
  if (c < 0x80) return 1;
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF)
    n = 2;
  else if (c >= 0xE0 && c <= 0xEF)
    n = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
  else if (c >= 0xF0 && c <= 0xF4)
    n = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
  else
    return 0;
  if (i + n > s.size() || b(1) < lo || b(1) > hi) return 0;
  for (size_t k = 2; k < n; ++k)
    if (b(k) < 0x80 || b(k) > 0xBF) return 0;
  return n;
}

inline bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_len(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

[[noreturn]] inline void fail(const char* what, std::string_view detail) {
  std::fprintf(stderr, "fuzz check failed: %s: %.*s\n", what,
               static_cast<int>(std::min<size_t>(detail.size(), 2000)), detail.data());
  std::abort();
}

inline void check(bool ok, const char* what, std::string_view detail = {}) {
  if (!ok) fail(what, detail);
}

// An error message a user can read: short lines, valid UTF-8, no control byte but '\n' and '\t'
// (a quoted input's ESC, BEL or NUL is written \x1b, \x07, \x00: issue 27).
inline void check_message(std::string_view m) {
  check(!m.empty(), "empty error message");
  check(valid_utf8(m), "error message is not valid UTF-8", m);
  for (unsigned char c : m)
    check((c >= 0x20 && c != 0x7f) || c == '\n' || c == '\t',
          "error message holds a raw control byte", m);
  size_t start = 0;
  while (start <= m.size()) {
    size_t nl = m.find('\n', start);
    if (nl == std::string_view::npos) nl = m.size();
    check(nl - start <= kMaxLine, "error message line longer than kMaxLine", m.substr(start, 300));
    start = nl + 1;
  }
}

// Runs `f`; a ciuic::Error is an accepted outcome (its message is checked), any other exception
// escapes and crashes the target.
template <class F>
bool expect_ok_or_error(F&& f) {
  try {
    f();
    return true;
  } catch (const Error& e) {
    check_message(e.what());
    return false;
  }
}

// tests/fixtures. The libFuzzer build (tests/fuzz/libfuzzer, CIUIC_FUZZ_BUILD) compiles no path
// in (so that clones share a ccache): the source folder is read from ciuic-source-dir.txt next to
// the running executable, which CMake writes. The replay build: the test tree's fixtures
// (tests/support/test_paths.h).
inline std::string fixtures_dir() {
#ifdef CIUIC_FUZZ_BUILD
  static const std::string dir = [] {
    char buf[4096];
    const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n <= 0) fail("cannot read /proc/self/exe", "");
    std::string file(buf, static_cast<size_t>(n));
    file = file.substr(0, file.rfind('/') + 1) + "ciuic-source-dir.txt";
    std::ifstream in(file);
    std::string root;
    std::getline(in, root);
    if (root.empty())
      fail("cannot read the source folder (re-run cmake on tests/fuzz/libfuzzer)", file);
    return root + "/tests/fixtures";
  }();
  return dir;
#else
  return CIUIC_FIXTURES_DIR;
#endif
}

// Writes `bytes` to the file `path` (made or emptied first); a failure stops the target.
inline void write_file(const std::string& path, std::string_view bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) fail("cannot write", path);
}

// Splits `data` at the first occurrence of `sep`: (before, after); after is empty when absent.
inline std::pair<std::string_view, std::string_view> split_once(std::string_view data,
                                                                std::string_view sep) {
  const size_t p = data.find(sep);
  if (p == std::string_view::npos) return {data, {}};
  return {data.substr(0, p), data.substr(p + sep.size())};
}

}  // namespace ciuic::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
