#include "base/paths.h"

#include <filesystem>
#include <system_error>

#include <ciuic/error.h>

namespace ciuic::paths {

namespace fs = std::filesystem;

namespace {

std::string kind_of(fs::file_type t) {
  switch (t) {
    case fs::file_type::regular: return "a file";
    case fs::file_type::directory: return "a folder";
    case fs::file_type::fifo: return "a FIFO";
    case fs::file_type::socket: return "a socket";
    case fs::file_type::character:
    case fs::file_type::block: return "a device";
    case fs::file_type::symlink: return "a dangling link";
    default: return "not a file or folder";
  }
}

// For a path that does not exist: the first part of it that does, if it is not a folder (ENOTDIR
// reads as "not found" in std::filesystem), or the reason its parent cannot be looked at.
std::string missing_because(const fs::path& path) {
  for (fs::path q = path.parent_path(); !q.empty(); q = q.parent_path()) {
    std::error_code ec;
    const fs::file_status st = fs::status(q, ec);
    if (st.type() == fs::file_type::not_found) {
      if (q == q.parent_path()) break;
      continue;
    }
    if (st.type() == fs::file_type::none || st.type() == fs::file_type::unknown)
      return ec ? ec.message() : "";
    if (st.type() == fs::file_type::directory) break;
    return q.string() + " is " + kind_of(st.type()) + ", not a folder";
  }
  return "";
}

}  // namespace

std::string problem(const std::string& path, Want want) {
  if (path.empty()) return "an empty path";
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  switch (st.type()) {
    case fs::file_type::none:
    case fs::file_type::unknown: return ec ? ec.message() : "cannot be looked at";
    case fs::file_type::not_found: {
      const std::string why = missing_because(path);
      if (!why.empty()) return why;
      return want == Want::kFile     ? "no such file"
             : want == Want::kFolder ? "no such folder"
                                     : "no such file or folder";
    }
    case fs::file_type::regular: return want == Want::kFolder ? "not a folder (a file)" : "";
    case fs::file_type::directory: return want == Want::kFile ? "a folder, not a file" : "";
    default:
      return want == Want::kAny    ? ""
             : want == Want::kFile ? "not a regular file (" + kind_of(st.type()) + ")"
                                   : "not a folder (" + kind_of(st.type()) + ")";
  }
}

bool is(const std::string& path, Want want) { return problem(path, want).empty(); }

std::string folder_problem(const std::string& path) {
  const std::string why = problem(path, Want::kFolder);
  if (why == "no such folder") return "";     // every missing part can be created
  if (why.rfind("not a folder (", 0) == 0) {  // "<path> is a file, not a folder"
    std::error_code ec;
    return path + " is " + kind_of(fs::status(path, ec).type()) + ", not a folder";
  }
  return why;
}

void create_folders(const std::string& path, const std::string& what) {
  const std::string why = folder_problem(path);
  if (!why.empty()) throw UsageError(what + " " + path + " cannot be created: " + why);
  std::error_code ec;
  fs::create_directories(path, ec);
  if (ec) throw UsageError(what + " " + path + " cannot be created: " + ec.message());
}

}  // namespace ciuic::paths
