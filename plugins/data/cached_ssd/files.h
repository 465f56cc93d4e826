// files.h — small POSIX file helpers for the cached_ssd plugin: read-only memory maps, atomic
// writes, advisory locks, glob expansion.
//
// Every failure throws ciuic::Error naming the path and the errno text.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ciuic::data {

// A read-only, private memory map of a whole file. Move-only; unmapped on destruction. An empty
// file maps to data() == nullptr, size() == 0.
class MappedFile {
 public:
  MappedFile() = default;
  explicit MappedFile(const std::string& path);
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  std::string_view view() const { return {reinterpret_cast<const char*>(data_), size_}; }
  // Tells the kernel the file will be read sequentially (readahead) or randomly.
  void advise_sequential() const;

 private:
  void reset();
  std::string path_;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// An exclusive or shared flock(2) on `path` (created when missing), released on destruction or
// unlock(). flock locks are per open file: two FileLocks in one process exclude each other too,
// and on Linux NFS (v4) they are forwarded to the server, so ranks on several nodes sharing the
// file system exclude each other as well.
//
// Bounded waits: lock_shared/lock_exclusive wait until granted or until the lock file showed no
// sign of life for `patience` — a holder that builds calls alive() as it progresses (which
// advances the file's modification time, at most once a second), so a slow build is waited for
// and a stuck one is not. The holder of the exclusive lock records who it is (record_holder) in
// the file; holder() reads that line back for messages.
class FileLock {
 public:
  explicit FileLock(const std::string& path);
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  ~FileLock();
  // True when granted; false after `patience` without the file's modification time advancing.
  // try_*() return false instead of waiting.
  bool lock_shared(std::chrono::milliseconds patience);
  bool lock_exclusive(std::chrono::milliseconds patience);
  bool try_shared();
  bool try_exclusive();
  void unlock();
  // While holding the lock exclusively: replaces the file's content with `who` and a newline.
  void record_holder(const std::string& who);
  // While holding the lock: shows waiters that the holder makes progress (a no-op when the last
  // call was less than a second ago).
  void alive();
  // The first line of the file (at most 200 bytes, control characters as '?'); "" when empty.
  std::string holder() const;
  const std::string& path() const { return path_; }

 private:
  bool wait(int op, std::chrono::milliseconds patience);
  std::string path_;
  int fd_ = -1;
  std::chrono::steady_clock::time_point last_alive_{};
};

// Writes the concatenation of `parts` to `path` and fsyncs it (the caller renames the containing
// folder into place).
struct ByteSpan {
  const void* data;
  size_t size;
};
void write_file_synced(const std::string& path, const std::vector<ByteSpan>& parts);
void fsync_dir(const std::string& dir);
void make_dirs(const std::string& dir);
void remove_tree(const std::string& path);  // best effort; missing is fine
bool file_exists(const std::string& path);
std::string read_text_file(const std::string& path);

bool has_glob_chars(std::string_view s);
// Sorted paths matching `pattern` (glob(3), no tilde or brace expansion).
std::vector<std::string> glob_sorted(const std::string& pattern);
// `p` when absolute, else `base`/`p` (lexically normalised).
std::string join_path(const std::string& base, const std::string& p);

}  // namespace ciuic::data
