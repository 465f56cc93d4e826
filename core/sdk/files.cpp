// remove_tree (ciuic/files.h).
#include <ciuic/files.h>

#include <ftw.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>

namespace ciuic {

namespace {
thread_local int g_first_error = 0;

int remove_entry(const char* path, const struct stat*, int, struct FTW*) {
  if (::remove(path) != 0 && errno != ENOENT && g_first_error == 0) g_first_error = errno;
  return 0;  // go on: remove what can be removed
}
}  // namespace

bool remove_tree(const std::string& path, std::error_code& ec) {
  ec.clear();
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return true;
    ec.assign(errno, std::generic_category());
    return false;
  }
  g_first_error = 0;
  if (::nftw(path.c_str(), remove_entry, 64, FTW_DEPTH | FTW_PHYS) != 0 && g_first_error == 0)
    g_first_error = errno;
  if (g_first_error != 0) {
    ec.assign(g_first_error, std::generic_category());
    return false;
  }
  return true;
}

}  // namespace ciuic
