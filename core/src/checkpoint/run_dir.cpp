// The run directory: start-of-run checks, the run lock, --overwrite. See run_dir.h.
#include "checkpoint/run_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <thread>

#include <ciuic/error.h>
#include <ciuic/log.h>

namespace fs = std::filesystem;

namespace ciuic::checkpoint {

bool resumes_in_place(const std::string& resume, const std::string& checkpoint_dir) {
  if (resume.empty()) return false;
  if (resume == "latest" || resume == "auto") return true;
  std::error_code ec;
  if (fs::equivalent(resume, checkpoint_dir, ec)) return true;
  const fs::path rel = fs::absolute(resume).lexically_normal().lexically_relative(
      fs::absolute(checkpoint_dir).lexically_normal());
  return !rel.empty() && *rel.begin() != "..";
}

std::string replaced_name() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", &tm);
  return kReplacedPrefix + std::string(buf);
}

// ---- RunDirClaim ------------------------------------------------------------------------------
RunDirClaim::RunDirClaim(RunDirClaim&& o) noexcept
    : fds_(std::move(o.fds_)),
      lock_files_(std::move(o.lock_files_)),
      replaced_(std::move(o.replaced_)) {
  o.fds_.clear();
}

RunDirClaim& RunDirClaim::operator=(RunDirClaim&& o) noexcept {
  if (this != &o) {
    release();
    fds_ = std::move(o.fds_);
    lock_files_ = std::move(o.lock_files_);
    replaced_ = std::move(o.replaced_);
    o.fds_.clear();
  }
  return *this;
}

RunDirClaim::~RunDirClaim() { release(); }

void RunDirClaim::release() {
  for (int fd : fds_) ::close(fd);  // closing the last descriptor releases the flock
  fds_.clear();
}

namespace {

// Absolute, normalised, without a trailing separator.
fs::path absolute_path(const std::string& p) {
  fs::path a = fs::absolute(p).lexically_normal();
  if (!a.has_filename() && a != a.root_path()) a = a.parent_path();
  return a;
}

// A folder that must be a folder, or creatable: refuse a file in its place or a parent's.
void check_folder_path(const std::string& path, const std::string& what) {
  const fs::path full = absolute_path(path);
  for (fs::path q = full;; q = q.parent_path()) {
    std::error_code ec;
    const fs::file_status st = fs::status(q, ec);
    if (st.type() == fs::file_type::not_found) {
      if (q == q.parent_path()) return;
      continue;
    }
    if (st.type() == fs::file_type::none ||
        st.type() == fs::file_type::unknown)  // a name refused, EACCES, ...
      throw UsageError(what + " " + path + " cannot be created: " +
                       (q == full ? "" : q.string() + ": ") + ec.message());
    if (fs::is_directory(st)) return;
    const std::string is =
        fs::is_regular_file(st) ? " is a file, not a folder" : " exists and is not a folder";
    if (q == full) throw UsageError(what + " " + path + is);
    throw UsageError(what + " " + path + " cannot be created: " + q.string() + is);
  }
}

void create_folder(const std::string& path, const std::string& what) {
  std::error_code ec;
  fs::create_directories(path, ec);
  if (ec) throw Error("cannot create " + what + " " + path + ": " + ec.message());
}

std::string host_name() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "?";
  return buf;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

// "pid=..\nhost=..\nstarted=..\n" of a lock file, as key -> value (at most 4 KiB read).
std::map<std::string, std::string> read_holder(int fd) {
  std::map<std::string, std::string> out;
  char buf[4096];
  const ssize_t n = ::pread(fd, buf, sizeof buf, 0);
  if (n <= 0) return out;
  std::string text(buf, static_cast<size_t>(n));
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(pos, end - pos);
    const size_t eq = line.find('=');
    if (eq != std::string::npos) out[line.substr(0, eq)] = line.substr(eq + 1, 80);
    pos = end + 1;
  }
  return out;
}

// Takes the lock of `folder` (which exists) into `claim`'s lists. Throws Error when another
// process holds it.
void lock_folder(const fs::path& folder, const std::string& what, std::vector<int>& fds,
                 std::vector<std::string>& files) {
  const std::string path = (folder / kLockFile).string();
  for (int attempt = 0;; ++attempt) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) throw Error("cannot open the run lock " + path + ": " + std::strerror(errno));
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      if (err == EWOULDBLOCK) {
        const auto h = read_holder(fd);
        ::close(fd);
        auto get = [&](const char* k) {
          auto it = h.find(k);
          return it == h.end() ? std::string("?") : it->second;
        };
        const std::string holder = h.empty() ? "another process (its lock file names no holder yet)"
                                             : "ciuic-run pid " + get("pid") + " on host " +
                                                   get("host") + ", started " + get("started");
        throw Error(what + " " + folder.string() + " is in use by another run: " + holder +
                    " (lock file " + path +
                    "). Two runs in one folder would interleave their metrics and overwrite each "
                    "other's checkpoints: wait for that run to end (or stop it), or give this run "
                    "another run.output_dir.");
      }
      ::close(fd);
      if (err == ENOLCK || err == EOPNOTSUPP || err == ENOSYS || err == EINVAL) {
        log_warn("cannot lock " + path + " (" + std::strerror(err) +
                 "; the filesystem does not support "
                 "flock): a second run in " +
                 folder.string() + " would not be detected");
        return;
      }
      throw Error("cannot lock the run lock " + path + ": " + std::strerror(err));
    }
    // The file may have been replaced between open and flock (someone removed it): lock the one
    // that is at the path now.
    struct stat a {
    }, b{};
    if (::fstat(fd, &a) == 0 && ::stat(path.c_str(), &b) == 0 &&
        (a.st_ino != b.st_ino || a.st_dev != b.st_dev) && attempt < 3) {
      ::close(fd);
      continue;
    }
    const std::string info = "pid=" + std::to_string(::getpid()) + "\nhost=" + host_name() +
                             "\nstarted=" + utc_now() + "\n";
    if (::ftruncate(fd, 0) != 0 ||
        ::pwrite(fd, info.data(), info.size(), 0) != static_cast<ssize_t>(info.size()))
      log_warn("cannot write the holder into the run lock " + path + ": " + std::strerror(errno));
    fds.push_back(fd);
    files.push_back(path);
    return;
  }
}

// Another run's files in the run's folders.
struct Previous {
  std::vector<fs::path> checkpoints;  // step_* folders, by name
  std::vector<fs::path> files;        // metrics file, hf/ folder, report.html, tb/ folder
  bool empty() const { return checkpoints.empty() && files.empty(); }
};

Previous find_previous(const RunPaths& p) {
  Previous out;
  std::error_code ec;
  if (fs::is_directory(p.checkpoint_dir, ec)) {
    for (const auto& e : fs::directory_iterator(p.checkpoint_dir, ec)) {
      const std::string n = e.path().filename().string();
      std::error_code ec2;
      if (n.rfind("step_", 0) == 0 && e.is_directory(ec2)) out.checkpoints.push_back(e.path());
    }
    std::sort(out.checkpoints.begin(), out.checkpoints.end());
  }
  if (fs::is_regular_file(p.metrics_file, ec) && fs::file_size(p.metrics_file, ec) > 0 && !ec)
    out.files.emplace_back(p.metrics_file);
  if (fs::is_directory(p.hf_dir, ec) && !fs::is_empty(p.hf_dir, ec) && !ec)
    out.files.emplace_back(p.hf_dir);
  // The run report next to the metrics file and the TensorBoard folder ([log] tensorboard)
  // belong to that run too: moved aside with it, never mixed with the next run's.
  const fs::path report = fs::path(p.metrics_file).parent_path() / "report.html";
  if (!p.metrics_file.empty() && fs::is_regular_file(report, ec)) out.files.emplace_back(report);
  const fs::path tb = fs::path(p.output_dir) / "tb";
  if (fs::is_directory(tb, ec) && !fs::is_empty(tb, ec) && !ec) out.files.emplace_back(tb);
  return out;
}

bool is_under(const fs::path& path, const fs::path& folder) {
  const fs::path rel =
      absolute_path(path.string()).lexically_relative(absolute_path(folder.string()));
  return !rel.empty() && *rel.begin() != ".." && rel != ".";
}

std::string describe(const Previous& prev, const RunPaths& p) {
  std::string s;
  if (!prev.checkpoints.empty()) {
    const size_t n = prev.checkpoints.size();
    s = std::to_string(n) + (n == 1 ? " checkpoint" : " checkpoints") + " in " + p.checkpoint_dir +
        " (" + prev.checkpoints.front().filename().string() +
        (n > 1 ? (n > 2 ? " ... " : ", ") + prev.checkpoints.back().filename().string() : "") + ")";
  }
  for (const auto& f : prev.files) s += (s.empty() ? "" : ", ") + f.string();
  return s;
}

// --overwrite: moves the previous run's files into replaced-<stamp> folders. Returns the folders.
std::vector<std::string> move_aside(const Previous& prev, const RunPaths& p) {
  const fs::path out = absolute_path(p.output_dir);
  // (container folder, path relative to it) for each file.
  std::vector<std::pair<fs::path, fs::path>> moves;
  for (const auto& c : prev.checkpoints) {
    if (is_under(c, out))
      moves.emplace_back(out, absolute_path(c.string()).lexically_relative(out));
    else
      moves.emplace_back(absolute_path(p.checkpoint_dir), c.filename());
  }
  for (const auto& f : prev.files) {
    if (is_under(f, out))
      moves.emplace_back(out, absolute_path(f.string()).lexically_relative(out));
    else
      moves.emplace_back(absolute_path(f.string()).parent_path(), f.filename());
  }
  // One name, free in every container.
  std::vector<fs::path> containers;
  for (const auto& m : moves)
    if (std::find(containers.begin(), containers.end(), m.first) == containers.end())
      containers.push_back(m.first);
  const std::string base = replaced_name();
  std::string name = base;
  for (int i = 2;; ++i) {
    bool free = true;
    for (const auto& c : containers) free = free && !fs::exists(c / name);
    if (free) break;
    name = base + "-" + std::to_string(i);
  }
  std::vector<std::string> made;
  for (const auto& [container, rel] : moves) {
    const fs::path dest = container / name / rel;
    const fs::path src = container / rel;
    try {
      fs::create_directories(dest.parent_path());
      if (std::find(made.begin(), made.end(), (container / name).string()) == made.end())
        made.push_back((container / name).string());
      fs::rename(src, dest);
    } catch (const fs::filesystem_error& e) {
      throw Error("--overwrite: cannot move " + src.string() + " to " + dest.string() + ": " +
                  e.code().message() + " (nothing was deleted" +
                  (made.empty() ? "" : "; what was moved so far is in " + made.front()) + ")");
    }
  }
  return made;
}

}  // namespace

RunDirClaim claim_run_dir(const RunPaths& p, const ClaimOptions& o) {
  const bool in_place = resumes_in_place(o.resume, p.checkpoint_dir);
  if (o.overwrite && in_place)
    throw UsageError("--overwrite starts a fresh run, --resume " + o.resume +
                     " continues the run in " + p.checkpoint_dir + ": give one of them");
  RunDirClaim claim;
  // 1. Paths.
  check_folder_path(p.output_dir, "[run] output_dir");
  check_folder_path(p.checkpoint_dir, "[checkpoint] dir");
  create_folder(p.output_dir, "[run] output_dir");

  // 2. Locks: output_dir, and the checkpoint dir if it exists already (else once created).
  lock_folder(p.output_dir, "[run] output_dir", claim.fds_, claim.lock_files_);
  std::error_code ec;
  auto same_as_output = [&] { return fs::equivalent(p.checkpoint_dir, p.output_dir, ec); };
  bool ckpt_locked = false;
  if (fs::is_directory(p.checkpoint_dir, ec) && !same_as_output()) {
    lock_folder(p.checkpoint_dir, "[checkpoint] dir", claim.fds_, claim.lock_files_);
    ckpt_locked = true;
  }

  // 3. Another run's files.
  if (!in_place) {
    const Previous prev = find_previous(p);
    if (!prev.empty() && !o.overwrite) {
      const bool only_ckpt_dir = prev.files.empty() && !is_under(p.checkpoint_dir, p.output_dir);
      const std::string where = only_ckpt_dir ? "[checkpoint] dir " + p.checkpoint_dir
                                              : "[run] output_dir " + p.output_dir;
      throw UsageError(
          where + " already holds the files of another run: " + describe(prev, p) +
          ". A run that does not continue that run must not mix with them (its metrics would be "
          "appended to "
          "theirs, and pruning old checkpoints could delete its own). Choose one:\n"
          "  --resume latest|auto      continue that run from its newest checkpoint\n"
          "  --set run.output_dir=DIR  start this run in another folder" +
          std::string(only_ckpt_dir || !is_under(p.checkpoint_dir, p.output_dir)
                          ? " (with another [checkpoint] dir: --set checkpoint.dir=DIR)"
                          : "") +
          "\n  --overwrite               move that run's files into " +
          (fs::path(only_ckpt_dir ? p.checkpoint_dir : p.output_dir) /
           (std::string(kReplacedPrefix) + "<date-time>"))
              .string() +
          " and start fresh (nothing is deleted)");
    }
    if (!prev.empty()) {
      claim.replaced_ = move_aside(prev, p);
      std::string where;
      for (const auto& r : claim.replaced_) where += (where.empty() ? "" : " and ") + r;
      log_info("--overwrite: moved the previous run's files (" + describe(prev, p) + ") into " +
               where);
    }
  }

  // The checkpoint dir, now that the run may start.
  create_folder(p.checkpoint_dir, "[checkpoint] dir");
  if (!ckpt_locked && !same_as_output())
    lock_folder(p.checkpoint_dir, "[checkpoint] dir", claim.fds_, claim.lock_files_);
  return claim;
}

RunDirClaim claim_run_dir(const RunPaths& paths, const ClaimOptions& options,
                          const RunContext& ctx) {
  const std::string key = "run_dir/claim";
  Store& store = *ctx.store;
  if (ctx.rank != 0) {
    const std::string verdict = store.get(key);
    if (verdict == "ok") return RunDirClaim();
    store.add(key + "/read", 1);  // rank 0 (maybe the store's host) may exit now
    // "<exit code> <message>"
    const size_t sp = verdict.find(' ');
    int code = kExitRuntime;
    try {
      code = std::stoi(verdict.substr(0, sp));
    } catch (const std::exception&) {
    }
    throw Error(sp == std::string::npos ? verdict : verdict.substr(sp + 1), code);
  }
  auto publish = [&](const std::string& v) {
    try {
      store.set(key, v);
    } catch (const std::exception& e) {
      log_warn(std::string("could not tell the other ranks about the run directory: ") + e.what());
    }
  };
  // On a refusal, rank 0 waits (a little) until the other ranks have read it: when rank 0 hosts
  // the store, its exit would otherwise take the verdict with it.
  auto wait_read = [&] {
    const auto deadline =
        std::chrono::steady_clock::now() + std::min(ctx.timeout, std::chrono::milliseconds(10000));
    try {
      while (store.add(key + "/read", 0) < ctx.world_size - 1 &&
             std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    } catch (const std::exception&) {
    }
  };
  try {
    RunDirClaim claim = claim_run_dir(paths, options);
    publish("ok");
    return claim;
  } catch (const Error& e) {
    publish(std::to_string(e.exit_code()) + " " + e.what());
    wait_read();
    throw;
  } catch (const std::exception& e) {
    publish(std::to_string(kExitRuntime) + " " + e.what());
    wait_read();
    throw;
  }
}

}  // namespace ciuic::checkpoint
