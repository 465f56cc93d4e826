// tests/fuzz/replay_main.cpp — runs a fuzz target over files instead of libFuzzer: the regression
// mode of the main (g++) build. `fuzz_replay_<target> DIR|FILE...` feeds every file (folders: every
// file in them, sorted) to LLVMFuzzerTestOneInput once; a failed check or an escaping exception
// aborts (ctest reports the last file named). Exit 0 when every input passed.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz_common.h"

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  for (int i = 1; i < argc; ++i) {
    const fs::path p(argv[i]);
    if (fs::is_directory(p)) {
      for (const auto& e : fs::recursive_directory_iterator(p))
        if (e.is_regular_file()) files.push_back(e.path());
    } else if (fs::exists(p)) {
      files.push_back(p);
    } else {
      std::fprintf(stderr, "replay: %s does not exist\n", argv[i]);
      return 2;
    }
  }
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    std::fprintf(stderr, "replay: %s\n", f.c_str());
    std::ifstream in(f, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  }
  std::printf("replay: %zu input(s) passed\n", files.size());
  return files.empty() ? 1 : 0;
}
