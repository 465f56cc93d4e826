#include "files.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <ciuic/error.h>
#include <ciuic/files.h>

namespace ciuic::data {
namespace fs = std::filesystem;

namespace {
[[noreturn]] void fail_errno(const std::string& what, const std::string& path) {
  throw Error(what + " " + path + ": " + std::strerror(errno));
}
}  // namespace

MappedFile::MappedFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail_errno("cannot open", path);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    fail_errno("cannot stat", path);
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      fail_errno("cannot mmap", path);
    }
    data_ = static_cast<uint8_t*>(p);
  }
  ::close(fd);
}

MappedFile::MappedFile(MappedFile&& o) noexcept
    : path_(std::move(o.path_)), data_(o.data_), size_(o.size_) {
  o.data_ = nullptr;
  o.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    reset();
    path_ = std::move(o.path_);
    data_ = o.data_;
    size_ = o.size_;
    o.data_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

MappedFile::~MappedFile() { reset(); }

void MappedFile::reset() {
  if (data_) ::munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

void MappedFile::advise_sequential() const {
  if (data_) ::madvise(data_, size_, MADV_SEQUENTIAL);
}

FileLock::FileLock(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) fail_errno("cannot open lock file", path);
}

FileLock::~FileLock() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the lock
}

namespace {
bool try_flock(int fd, int op, const std::string& path);

// The file's modification time (a holder's sign of life), in nanoseconds.
int64_t mtime_ns(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return 0;
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}
}  // namespace

bool FileLock::wait(int op, std::chrono::milliseconds patience) {
  using Clock = std::chrono::steady_clock;
  auto deadline = Clock::now() + patience;
  int64_t seen = mtime_ns(fd_);
  auto pause = std::chrono::milliseconds(5);
  while (!try_flock(fd_, op, path_)) {
    const int64_t m = mtime_ns(fd_);
    const auto now = Clock::now();
    if (m != seen) {  // the holder is alive: wait for it another `patience`
      seen = m;
      deadline = now + patience;
    }
    if (now >= deadline) return false;
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, std::chrono::milliseconds(200));
  }
  return true;
}

bool FileLock::lock_shared(std::chrono::milliseconds patience) { return wait(LOCK_SH, patience); }
bool FileLock::lock_exclusive(std::chrono::milliseconds patience) {
  return wait(LOCK_EX, patience);
}

void FileLock::record_holder(const std::string& who) {
  const std::string line = who + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, line.data(), line.size(), 0) < 0)
    fail_errno("cannot write the lock file", path_);
  last_alive_ = std::chrono::steady_clock::now();
}

void FileLock::alive() {
  const auto now = std::chrono::steady_clock::now();
  if (now - last_alive_ < std::chrono::seconds(1)) return;
  last_alive_ = now;
  ::futimens(fd_, nullptr);
}

std::string FileLock::holder() const {
  char buf[200];
  const ssize_t n = ::pread(fd_, buf, sizeof buf, 0);
  std::string s;
  for (ssize_t i = 0; i < n && buf[i] != '\n'; ++i)
    s += static_cast<unsigned char>(buf[i]) < 0x20 || buf[i] == 0x7f ? '?' : buf[i];
  return s;
}

namespace {
bool try_flock(int fd, int op, const std::string& path) {
  while (::flock(fd, op | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) return false;
    if (errno != EINTR) fail_errno("cannot lock", path);
  }
  return true;
}
}  // namespace

bool FileLock::try_shared() { return try_flock(fd_, LOCK_SH, path_); }
bool FileLock::try_exclusive() { return try_flock(fd_, LOCK_EX, path_); }

void FileLock::unlock() { ::flock(fd_, LOCK_UN); }

void write_file_synced(const std::string& path, const std::vector<ByteSpan>& parts) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail_errno("cannot create", path);
  for (const ByteSpan& part : parts) {
    const auto* p = static_cast<const char*>(part.data);
    size_t n = part.size;
    while (n > 0) {
      ssize_t w = ::write(fd, p, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        int e = errno;
        ::close(fd);
        errno = e;
        fail_errno("cannot write", path);
      }
      p += w;
      n -= static_cast<size_t>(w);
    }
  }
  if (::fsync(fd) != 0) {
    int e = errno;
    ::close(fd);
    errno = e;
    fail_errno("cannot fsync", path);
  }
  if (::close(fd) != 0) fail_errno("cannot close", path);
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // best effort: some file systems refuse to open folders
  ::fsync(fd);
  ::close(fd);
}

void make_dirs(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error("cannot create folder " + dir + ": " + ec.message());
}

void remove_tree(const std::string& path) {
  std::error_code ec;
  ciuic::remove_tree(path, ec);
}

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

std::string read_text_file(const std::string& path) {
  // A regular file of at most kMaxJsonInputBytes (a cache manifest): never a FIFO or a device.
  return ciuic::read_input(path, "data cache file", ciuic::kMaxJsonInputBytes);
}

bool has_glob_chars(std::string_view s) { return s.find_first_of("*?[") != std::string_view::npos; }

std::vector<std::string> glob_sorted(const std::string& pattern) {
  glob_t g{};
  std::vector<std::string> out;
  int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  if (rc == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  ::globfree(&g);
  if (rc != 0 && rc != GLOB_NOMATCH) throw Error("cannot expand the glob " + pattern);
  std::sort(out.begin(), out.end());
  return out;
}

std::string join_path(const std::string& base, const std::string& p) {
  fs::path path(p);
  if (path.is_relative() && !base.empty()) path = fs::path(base) / path;
  return path.lexically_normal().string();
}

}  // namespace ciuic::data
