// Internal to the conformance kit: failure lines and work folders.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include <ciuic/files.h>
#include <ciuic/testing/conformance.h>

#include "base/paths.h"

namespace ciuic::conformance {

// Failure descriptions collected where GoogleTest cannot report them (a forked rank); at most
// kMax kept, then a count.
class Lines {
 public:
  static constexpr size_t kMax = 40;
  void add(std::string line) {
    if (lines_.size() < kMax) lines_.push_back(std::move(line));
    ++count_;
  }
  bool empty() const { return count_ == 0; }
  std::string text() const {
    std::string s;
    for (const auto& l : lines_) s += l + "\n";
    if (count_ > lines_.size())
      s += "... and " + std::to_string(count_ - lines_.size()) + " more\n";
    return s;
  }

 private:
  std::vector<std::string> lines_;
  size_t count_ = 0;
};

// <options.work_dir or $TMPDIR/ciuic-plugin-check-<pid>>/<what>, created empty.
inline std::string work_dir(const CheckOptions& o, const std::string& what) {
  namespace fs = std::filesystem;
  const fs::path base =
      !o.work_dir.empty()
          ? fs::path(o.work_dir)
          : fs::temp_directory_path() / ("ciuic-plugin-check-" + std::to_string(::getpid()));
  const fs::path d = base / what;
  std::error_code ec;
  ciuic::remove_tree(d.string(), ec);  // not fs::remove_all(d, ec): see ciuic/files.h
  ciuic::paths::create_folders(d.string(), "the checks' work folder (--work-dir)");
  return d.string();
}

}  // namespace ciuic::conformance
