// remove_tree, read_input (ciuic/files.h).
#include <ciuic/files.h>

#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include <ciuic/error.h>

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

namespace {

const char* file_kind(mode_t m) {
  if (S_ISDIR(m)) return "a folder";
  if (S_ISFIFO(m)) return "a FIFO (named pipe)";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a plain file";
}

struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

std::string read_input(const std::string& path, const std::string& what, uint64_t max_bytes) {
  auto fail = [&](const std::string& reason) -> Error {
    return Error("cannot read " + what + " " + path + ": " + reason);
  };
  // O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below before any read.
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)};
  if (f.fd < 0) throw fail(std::strerror(errno));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) throw fail(std::strerror(errno));
  if (!S_ISREG(st.st_mode))
    throw fail(std::string("not a regular file (") + file_kind(st.st_mode) + ")");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size > max_bytes)
    throw fail("it has " + std::to_string(size) + " bytes, over the limit of " +
               std::to_string(max_bytes) + " bytes for this file");
  std::string out(size, '\0');
  size_t got = 0;
  for (;;) {
    if (got == out.size()) {
      // The file may have grown since fstat: read on, still within the bound.
      if (out.size() >= max_bytes + 1) break;
      out.resize(std::min<uint64_t>(max_bytes + 1, out.size() + 65536));
    }
    const ssize_t n = ::read(f.fd, out.data() + got, out.size() - got);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw fail(std::strerror(errno));
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  if (got > max_bytes)
    throw fail("it grew past the limit of " + std::to_string(max_bytes) +
               " bytes for this file while being read");
  out.resize(got);
  return out;
}

}  // namespace ciuic
