// launch_and_supervise(): spawns this node's workers, routes their output, stops the run on the
// first failure, forwards signals, and never leaves a worker behind.
//
// Event loop on the main thread: poll() over the workers' stdout/stderr pipes and a self-pipe that
// the signal handlers (SIGINT, SIGTERM, SIGCHLD) write to; waitpid(WNOHANG) on each live worker
// after every wake-up. Multi-node runs add one thread (NodeWatch) that does all of this launcher's
// talking to the run's store (hosted by node 0's launcher), so that the store never blocks the
// loop: heartbeats, this node's failure report, the run's verdict; on node 0 also the watch over
// the other nodes (joined, finished, lost) and the choice of the verdict. It wakes the loop
// through a pipe of its own when something changed.
#include <c10/util/Logging.h>
#include <ciuic/error.h>
#include <ciuic/log.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <vector>

#include "launch/launch.h"
#include "launch/tcp_store.h"

extern char** environ;

namespace ciuic::launch {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kTailLines = 20;
constexpr size_t kMaxLine = 64 * 1024;

// ---- signals -------------------------------------------------------------------------------
int g_wake_write = -1;  // write end of the self-pipe; the handler's only state

void on_signal(int sig) {
  const int saved = errno;
  const unsigned char b = static_cast<unsigned char>(sig);
  if (g_wake_write >= 0) (void)!write(g_wake_write, &b, 1);
  errno = saved;
}

// Installs the launcher's handlers; restores the previous ones on destruction.
class SignalScope {
 public:
  SignalScope() {
    if (pipe2(fds_, O_CLOEXEC | O_NONBLOCK) != 0)
      throw Error(std::string("launcher: pipe2 failed: ") + strerror(errno));
    g_wake_write = fds_[1];
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    sigaction(SIGCHLD, &sa, &old_chld_);
    struct sigaction ign {};
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    sigaction(SIGPIPE, &ign, &old_pipe_);
    // Make sure the signals are deliverable to this thread.
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGINT);
    sigaddset(&s, SIGTERM);
    sigaddset(&s, SIGCHLD);
    pthread_sigmask(SIG_UNBLOCK, &s, &old_mask_);
  }
  ~SignalScope() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
    sigaction(SIGCHLD, &old_chld_, nullptr);
    sigaction(SIGPIPE, &old_pipe_, nullptr);
    pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
    g_wake_write = -1;
    close(fds_[0]);
    close(fds_[1]);
  }
  int read_fd() const { return fds_[0]; }

 private:
  int fds_[2] = {-1, -1};
  struct sigaction old_int_ {
  }, old_term_{}, old_chld_{}, old_pipe_{};
  sigset_t old_mask_{};
};

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

// ---- output --------------------------------------------------------------------------------
void write_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = write(fd, s.data() + off, s.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {
      struct pollfd p {
        fd, POLLOUT, 0
      };
      poll(&p, 1, 100);
      continue;
    }
    if (n <= 0) return;  // our stdout is gone (closed pipe): drop the output, keep supervising
    off += static_cast<size_t>(n);
  }
}

struct TailLine {
  std::string text;
  bool to_stderr;
  bool shown;
};

struct Worker {
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  int status = 0;        // waitpid status once exited
  int fd[2] = {-1, -1};  // read ends of the stdout, stderr pipes
  std::string partial[2];
  std::deque<TailLine> tail;
};

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
           signal_name(WTERMSIG(status)) + ")" + (WCOREDUMP(status) ? ", core dumped" : "");
  return "ended with status " + std::to_string(status);
}

// ---- spawning ------------------------------------------------------------------------------
std::string find_executable(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t pos = 0;
  while (pos <= p.size()) {
    size_t colon = p.find(':', pos);
    std::string dir = p.substr(pos, colon == std::string::npos ? std::string::npos : colon - pos);
    std::string cand = (dir.empty() ? "." : dir) + "/" + name;
    if (access(cand.c_str(), X_OK) == 0) return cand;
    if (colon == std::string::npos) break;
    pos = colon + 1;
  }
  throw UsageError("launcher: cannot find the worker executable \"" + name + "\" in PATH");
}

bool is_launch_var(std::string_view kv) {
  static const char* kNames[] = {"RANK",
                                 "LOCAL_RANK",
                                 "WORLD_SIZE",
                                 "LOCAL_WORLD_SIZE",
                                 "GROUP_RANK",
                                 "NODE_RANK",
                                 "GROUP_WORLD_SIZE",
                                 "ROLE_RANK",
                                 "ROLE_WORLD_SIZE",
                                 "MASTER_ADDR",
                                 "MASTER_PORT",
                                 "CIUIC_LAUNCHER",
                                 "CIUIC_STORE_TOKEN",
                                 "CIUIC_STORE_TOKEN_FILE",
                                 "TORCHELASTIC_USE_AGENT_STORE",
                                 "TORCHELASTIC_RESTART_COUNT",
                                 "TORCHELASTIC_RUN_ID"};
  size_t eq = kv.find('=');
  std::string_view name = kv.substr(0, eq);
  for (const char* n : kNames)
    if (name == n) return true;
  return false;
}

// Async-signal-safe decimal formatting for the child's exec-failure message.
size_t format_int(char* out, int v) {
  char tmp[16];
  size_t n = 0;
  unsigned u = v < 0 ? 0u - static_cast<unsigned>(v) : static_cast<unsigned>(v);
  do {
    tmp[n++] = static_cast<char>('0' + u % 10);
    u /= 10;
  } while (u);
  size_t k = 0;
  if (v < 0) out[k++] = '-';
  while (n) out[k++] = tmp[--n];
  return k;
}

// Forks one worker. Between fork and exec the child calls async-signal-safe functions only.
pid_t spawn(const std::string& exe, const std::vector<char*>& argv, const std::vector<char*>& envp,
            int out_w, int err_w, int devnull) {
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) throw Error(std::string("launcher: fork failed: ") + strerror(errno));
  if (pid > 0) {
    setpgid(pid, pid);  // also done by the child; whichever runs first wins the race
    return pid;
  }
  // ---- child ----
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(128 + SIGKILL);  // the launcher died before prctl took effect
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGCHLD, SIGPIPE, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2})
    sigaction(sig, &dfl, nullptr);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  dup2(devnull, 0);
  dup2(out_w, 1);
  dup2(err_w, 2);
  if (syscall(SYS_close_range, 3u, ~0u, 0u) != 0) {
    long max = sysconf(_SC_OPEN_MAX);
    if (max < 0 || max > 65536) max = 65536;
    for (int fd = 3; fd < max; ++fd) close(fd);
  }
  execve(exe.c_str(), argv.data(), envp.data());
  const int err = errno;
  char msg[512];
  size_t n = 0;
  auto put = [&](const char* s) {
    while (*s && n < sizeof msg - 1) msg[n++] = *s++;
  };
  put("ciuic error: launcher: cannot execute ");
  put(exe.c_str());
  put(": errno ");
  char num[16];
  num[format_int(num, err)] = 0;
  put(num);
  put("\n");
  (void)!write(2, msg, n);
  _exit(127);
}

// ---- multi-node: the launchers watch each other ---------------------------------------------
// Keys of the launchers, under "ciuic/launch/" of the run's store (workers see "launch/..."):
//   node/<k>     "<host> pid <pid>" of node k's launcher, set when it has connected
//   alive/<k>    node k's heartbeat counter, incremented every kHeartbeat
//   report/<k>   node k's failure: "<1 when secondary, else 0>\t<message>" (rewritten when this
//                node's choice of the worker to name changes)
//   failed_node, failed   the run's verdict, set by node 0: whose failure stopped the run (-1 for a
//                node lost or missing) and the message
//   done/<k>     node k's launcher has finished
constexpr std::chrono::milliseconds kHeartbeat{250};
// A node whose heartbeat counter has not moved for this long is lost (its launcher was killed,
// or its host or the network failed): node 0 stops the run naming it.
constexpr std::chrono::milliseconds kLostAfter{5000};
// ... once the run is failing (the workers of a lost node's peers fail within a fraction of a
// second, and the run is stopping anyway): shorter.
constexpr std::chrono::milliseconds kLostAfterFailure{2000};
// Node 0 names a failure that looks like a consequence of another (is_secondary_error) only when no
// other report has come within this long of the first one.
constexpr std::chrono::milliseconds kSecondaryWait{3000};
// A launcher whose workers' failures so far look like consequences (is_secondary_error) lets the
// others run this long before it stops them, so that the worker with the cause can print it.
constexpr std::chrono::milliseconds kSecondaryStopDelay{2000};

std::string seconds_text(Clock::duration d) {
  char buf[32];
  snprintf(buf, sizeof buf, "%.1f s", std::chrono::duration<double>(d).count());
  return buf;
}

// Writes `token` to `path` readable by its owner only (0600), replacing what was there at once
// (a new file renamed over it), so that a node never reads half a token.
void write_token_file(const std::string& path, const std::string& token) {
  const std::string tmp = path + ".tmp" + std::to_string(getpid());
  unlink(tmp.c_str());
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  auto fail = [&](const char* what) {
    const std::string m = std::string(what) + ": " + strerror(errno);
    if (fd >= 0) close(fd);
    unlink(tmp.c_str());
    throw Error("launcher: cannot write the store token file " + path + " (" + m +
                "); the run directory must be writable and shared by every node");
  };
  if (fd < 0) fail("open");
  const std::string line = token + "\n";
  if (write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) fail("write");
  if (fsync(fd) != 0) fail("fsync");
  if (close(fd) != 0) {
    unlink(tmp.c_str());
    throw Error("launcher: cannot write the store token file " + path);
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string m = strerror(errno);
    unlink(tmp.c_str());
    throw Error("launcher: cannot write the store token file " + path + " (rename: " + m + ")");
  }
}

std::string host_name() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof buf - 1) != 0) return "?";
  return buf;
}

// A c10 error's first line (no "Exception raised from ..." and no backtrace).
std::string c10_first_line(const c10::Error& e) {
  std::string m = e.what_without_backtrace();
  if (auto nl = m.find('\n'); nl != std::string::npos) m.resize(nl);
  return m;
}

// "1, 3-5"
std::string node_list(const std::vector<int>& nodes) {
  std::string s;
  for (size_t i = 0; i < nodes.size();) {
    size_t j = i;
    while (j + 1 < nodes.size() && nodes[j + 1] == nodes[j] + 1) ++j;
    s += (s.empty() ? "" : ", ") + std::to_string(nodes[i]);
    if (j > i) s += "-" + std::to_string(nodes[j]);
    i = j + 1;
  }
  return s;
}

class NodeWatch {
 public:
  struct Verdict {
    int node = -1;  // the node whose failure report was chosen; -1: a node lost or missing
    std::string message;
  };
  struct State {
    std::optional<Verdict> verdict;
    std::string store_error;  // this launcher lost the store ("" = no)
    int pending = 0;          // node 0: nodes that joined and have neither finished nor been lost
    std::vector<std::string> lost;  // node 0: nodes lost after the verdict (for the log)
  };

  // Connects (nodes other than 0: waiting for node 0's store up to the rendezvous timeout) and
  // registers this launcher. Throws Error when the store cannot be reached or the run has already
  // been stopped.
  NodeWatch(const LaunchOptions& o, c10::intrusive_ptr<c10d::Store> store, std::string where)
      : o_(o), store_(std::move(store)), where_(std::move(where)), start_(Clock::now()) {
    if (pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0)
      throw Error(std::string("launcher: pipe2 failed: ") + strerror(errno));
    peers_.resize(o_.nnodes);
    const std::string me = host_name() + " pid " + std::to_string(getpid());
    call([&] {
      if (o_.node_rank != 0) {
        if (store_->check({"failed"}))
          throw Error("launcher of node " + std::to_string(o_.node_rank) +
                      ": the run was already stopped: " + text(store_->get("failed")));
      }
      store_->set(key("node/", o_.node_rank), bytes(me));
      store_->add(key("alive/", o_.node_rank), 1);  // answered: the set above is applied
    });
  }
  ~NodeWatch() {
    stop();
    close(wake_[0]);
    close(wake_[1]);
  }

  void start() { thread_ = std::thread([this] { run(); }); }

  // Read end of the pipe that the thread writes a byte to whenever the state changed.
  int wake_fd() const { return wake_[0]; }

  // This node's failure report (the worker it names); replaces the previous one.
  void report(const std::string& message, bool secondary) {
    std::lock_guard<std::mutex> l(mu_);
    failing_ = true;
    if (report_ == message) return;
    report_ = message;
    report_secondary_ = secondary;
    report_written_ = false;
    if (!report_at_) report_at_ = Clock::now();
    cv_.notify_all();
  }
  void set_failing() {
    std::lock_guard<std::mutex> l(mu_);
    failing_ = true;
  }
  State state() {
    std::lock_guard<std::mutex> l(mu_);
    return state_;
  }
  // "node 0 (host pid 12)": who hosts the store, as known to the other nodes.
  std::string node0() {
    std::lock_guard<std::mutex> l(mu_);
    return node0_.empty() ? std::string("node 0") : "node 0 (" + node0_ + ")";
  }

  // Stops the thread and marks this node finished in the store.
  void finish() {
    stop();
    try {
      store_->set(key("done/", o_.node_rank), bytes("1"));
      store_->check({key("done/", o_.node_rank)});  // applied before this launcher goes on
    } catch (const c10::Error&) {
      // The store is gone (node 0 ended or was lost): nobody waits for this node any more.
    }
  }

 private:
  static std::string key(const char* prefix, int node) { return prefix + std::to_string(node); }
  static std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
  static std::string text(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

  template <class F>
  void call(F&& f) {
    try {
      f();
    } catch (const c10::Error& e) {
      throw Error(c10_first_line(e));
    }
  }

  void stop() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
      cv_.notify_all();
    }
    if (thread_.joinable()) thread_.join();
  }

  void wake() {
    const unsigned char b = 0;
    (void)!write(wake_[1], &b, 1);
  }

  void run() {
    std::unique_lock<std::mutex> l(mu_);
    while (!stop_) {
      l.unlock();
      std::string error;
      try {
        tick();
      } catch (const std::exception& e) {
        error = e.what();
      }
      l.lock();
      if (!error.empty()) {
        state_.store_error = error;
        wake();
        return;  // the store is gone (it lives in node 0's launcher): nothing more to watch
      }
      cv_.wait_for(l, kHeartbeat, [&] { return stop_ || (!report_.empty() && !report_written_); });
    }
  }

  void tick() {
    std::string report;
    bool secondary = false, failing = false, have_verdict = false;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (!report_written_) report = report_;
      secondary = report_secondary_;
      failing = failing_;
      have_verdict = state_.verdict.has_value();
    }
    call([&] { store_->add(key("alive/", o_.node_rank), 1); });
    if (!report.empty()) {
      if (o_.node_rank != 0)
        call([&] {
          store_->set(key("report/", o_.node_rank), bytes((secondary ? "1\t" : "0\t") + report));
        });
      std::lock_guard<std::mutex> l(mu_);
      if (report_ == report) report_written_ = true;
    }
    if (o_.node_rank == 0) {
      watch_nodes(failing);
      return;
    }
    if (!have_node0_) {  // node 0 registers right after its store starts, maybe after we connected
      std::string who;
      call([&] {
        if (store_->check({"node/0"})) who = text(store_->get("node/0"));
      });
      if (!who.empty()) {
        std::lock_guard<std::mutex> l(mu_);
        node0_ = who;
        have_node0_ = true;
      }
    }
    if (have_verdict) return;
    bool there = false;
    call([&] { there = store_->check({"failed"}); });
    if (!there) return;
    Verdict v;
    call([&] {
      v.node = std::atoi(text(store_->get("failed_node")).c_str());
      v.message = text(store_->get("failed"));
    });
    std::lock_guard<std::mutex> l(mu_);
    state_.verdict = std::move(v);
    failing_ = true;
    wake();
  }

  // ---- node 0 ----
  struct Peer {
    bool joined = false;
    std::string who;
    int64_t beat = -1;
    Clock::time_point moved{};
    int still = 0;  // reads since the heartbeat last moved
    bool done = false;
    bool lost = false;
    std::string lost_why;
    std::string report;  // its failure report ("" = none)
    bool secondary = false;
    Clock::time_point report_at{};
    int64_t beat_after_failure = -1;  // its counter at the first read after the first report
    bool alive_after_failure = false;  // it sent a heartbeat after the first report
  };

  std::string name(int k) const {
    return "node " + std::to_string(k) + (peers_[k].who.empty() ? "" : " (" + peers_[k].who + ")");
  }

  void watch_nodes(bool failing) {
    const auto now = Clock::now();
    std::string own_report;
    bool own_secondary = false;
    Clock::time_point own_at{};
    bool have_verdict;
    {
      std::lock_guard<std::mutex> l(mu_);
      own_report = report_;
      own_secondary = report_secondary_;
      if (report_at_) own_at = *report_at_;
      have_verdict = state_.verdict.has_value();
    }
    // The first failure report of the run, as seen here.
    std::optional<Clock::time_point> first;
    if (!own_report.empty()) first = own_at;
    for (int k = 1; k < o_.nnodes; ++k)
      if (!peers_[k].report.empty() && (!first || peers_[k].report_at < *first))
        first = peers_[k].report_at;
    failing = failing || first.has_value() || have_verdict;
    const auto lost_after = failing ? kLostAfterFailure : kLostAfter;

    std::vector<int> missing;
    std::vector<std::string> newly_lost;
    int pending = 0;
    for (int k = 1; k < o_.nnodes; ++k) {
      Peer& n = peers_[k];
      if (n.done || n.lost) continue;
      if (!n.joined) {
        bool there = false;
        call([&] { there = store_->check({key("node/", k)}); });
        if (!there) {
          missing.push_back(k);
          continue;
        }
        call([&] { n.who = text(store_->get(key("node/", k))); });
        n.joined = true;
        n.moved = now;
      }
      call([&] { n.done = store_->check({key("done/", k)}); });
      if (n.done) continue;
      if (!have_verdict && n.report.empty()) {
        bool there = false;
        call([&] { there = store_->check({key("report/", k)}); });
        if (there) {
          std::string r;
          call([&] { r = text(store_->get(key("report/", k))); });
          n.secondary = r.compare(0, 2, "1\t") == 0;
          n.report = r.size() > 2 ? r.substr(2) : r;
          n.report_at = now;
          if (!first || now < *first) first = now;
        }
      } else if (!have_verdict) {  // a node may name another worker later: keep the latest
        std::string r;
        call([&] { r = text(store_->get(key("report/", k))); });
        n.secondary = r.compare(0, 2, "1\t") == 0;
        n.report = r.size() > 2 ? r.substr(2) : r;
      }
      int64_t beat = 0;
      call([&] { beat = store_->add(key("alive/", k), 0); });
      if (beat != n.beat) {
        n.beat = beat;
        n.moved = now;
        n.still = 0;
      } else {
        ++n.still;
      }
      if (first) {
        if (n.beat_after_failure < 0) n.beat_after_failure = beat;
        else if (beat > n.beat_after_failure) n.alive_after_failure = true;
      }
      // Lost: no heartbeat for lost_after, seen by several reads (a watch thread here that
      // stalled for a while would see the counter moved on its next read).
      if (n.still >= 2 && now - n.moved >= lost_after) {
        n.lost = true;
        n.lost_why = name(k) + " was lost: its launcher sent no heartbeat for " +
                     seconds_text(now - n.moved) +
                     " (it was killed, or its host or the network failed)";
        newly_lost.push_back(n.lost_why);
        continue;
      }
      ++pending;
    }

    std::optional<Verdict> verdict;
    if (!have_verdict) {
      if (!missing.empty() && now - start_ >= o_.rendezvous_timeout) {
        const bool one = missing.size() == 1;
        const std::string which = node_list(missing);
        verdict = Verdict{-1, (one ? "node " : "nodes ") + which +
                                  " never joined: no launcher of " + (one ? "node " : "nodes ") +
                                  which + " connected to the run's store at " + where_ +
                                  " within " + seconds_text(o_.rendezvous_timeout) +
                                  " ([cluster] timeout_s). Start every node with the same "
                                  "--nnodes, --master-addr and --master-port"};
      } else if (!newly_lost.empty()) {
        std::string m = newly_lost.front();
        for (size_t i = 1; i < newly_lost.size(); ++i) m += "; also " + newly_lost[i];
        verdict = Verdict{-1, m};
      } else if (first) {
        // Every node that has not reported has been heard from since the first report: none of
        // them is lost. Name the first report that is not a consequence, else (after
        // kSecondaryWait) the first one.
        bool all_heard = true;
        for (int k = 1; k < o_.nnodes; ++k) {
          const Peer& n = peers_[k];
          if (n.joined && !n.done && !n.lost && n.report.empty() && !n.alive_after_failure)
            all_heard = false;
        }
        struct Cand {
          int node;
          const std::string* msg;
          bool secondary;
          Clock::time_point at;
        };
        std::vector<Cand> cands;
        if (!own_report.empty()) cands.push_back({0, &own_report, own_secondary, own_at});
        for (int k = 1; k < o_.nnodes; ++k)
          if (!peers_[k].report.empty())
            cands.push_back({k, &peers_[k].report, peers_[k].secondary, peers_[k].report_at});
        std::sort(cands.begin(), cands.end(),
                  [](const Cand& a, const Cand& b) { return a.at < b.at; });
        const Cand* pick = nullptr;
        for (const auto& c : cands)
          if (!c.secondary) {
            pick = &c;
            break;
          }
        if (!pick && now - *first >= kSecondaryWait && !cands.empty()) pick = &cands.front();
        if (all_heard && pick)
          verdict =
              Verdict{pick->node, "node " + std::to_string(pick->node) + " failed: " + *pick->msg};
      }
      if (verdict) {
        call([&] {
          store_->set("failed_node", bytes(std::to_string(verdict->node)));
          store_->set("failed", bytes(verdict->message));
        });
      }
    }
    std::lock_guard<std::mutex> l(mu_);
    const bool changed = verdict || state_.pending != pending || !newly_lost.empty();
    if (verdict) {
      state_.verdict = std::move(verdict);
      failing_ = true;
    } else {
      for (auto& m : newly_lost) state_.lost.push_back(std::move(m));
    }
    state_.pending = pending;
    if (changed) wake();
  }

  const LaunchOptions& o_;
  c10::intrusive_ptr<c10d::Store> store_;  // used by the thread only once it runs
  std::string where_;
  Clock::time_point start_;
  std::string node0_;  // "<host> pid <pid>" of node 0's launcher (other nodes)
  bool have_node0_ = false;  // (thread only)
  std::vector<Peer> peers_;  // node 0: the other nodes (thread only)
  int wake_[2] = {-1, -1};
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool failing_ = false;
  std::string report_;
  bool report_secondary_ = false;
  bool report_written_ = false;
  std::optional<Clock::time_point> report_at_;
  State state_;
};

// While it lives, c10's log level is at least ERROR in this process: c10d's TCPStore client logs
// a warning with a C++ backtrace for each failed request when the store's host goes away, and the
// launcher reports that loss itself. (The workers are other processes: their logs are unchanged.)
class QuietC10dWarnings {
 public:
  QuietC10dWarnings() : old_(FLAGS_caffe2_log_level) {
    if (old_ < 2) FLAGS_caffe2_log_level = 2;
  }
  ~QuietC10dWarnings() { FLAGS_caffe2_log_level = old_; }

 private:
  int old_;
};

class Supervisor {
 public:
  explicit Supervisor(const LaunchOptions& o) : o_(o) {}

  ~Supervisor() {
    // Whatever happened (exceptions included): no worker outlives the launcher.
    for (auto& w : workers_) {
      if (w.running) {
        kill(-w.pid, SIGKILL);
        kill(w.pid, SIGKILL);
        waitpid(w.pid, &w.status, 0);
        w.running = false;
      }
      for (int& fd : w.fd)
        if (fd >= 0) close(fd), fd = -1;
    }
    if (devnull_ >= 0) close(devnull_);
  }

  int run() {
    validate();
    std::optional<QuietC10dWarnings> quiet;
    if (o_.nnodes > 1) quiet.emplace();
    open_store();
    SignalScope signals;
    start_workers();
    if (watch_) watch_->start();
    loop(signals.read_fd());
    return finish();
  }

 private:
  void validate() {
    auto bad = [](const std::string& m) { throw UsageError("launcher: " + m); };
    if (o_.argv.empty()) bad("no worker command line");
    if (o_.nproc_per_node < 1) bad("nproc_per_node must be >= 1");
    if (o_.nnodes < 1) bad("nnodes must be >= 1");
    if (o_.node_rank < 0 || o_.node_rank >= o_.nnodes)
      bad("node_rank " + std::to_string(o_.node_rank) + " is not in [0, " +
          std::to_string(o_.nnodes) + ")");
    if (o_.master_port < 0 || o_.master_port > 65535)
      bad("master_port " + std::to_string(o_.master_port) + " is not a TCP port");
    if (o_.nnodes > 1 && o_.master_port == 0)
      bad("a run on " + std::to_string(o_.nnodes) +
          " nodes needs an explicit master port (--master-port), the same on every node");
    if (o_.master_addr.empty()) bad("master_addr is empty");
  }

  std::string where() const { return host_ + ":" + std::to_string(port_); }

  void open_store() {
    const std::string who = "the launcher of node " + std::to_string(o_.node_rank);
    const bool one_node = o_.nnodes == 1;
    // A token given by the user (the same on every node) wins over the one node 0 makes.
    if (const char* t = std::getenv("CIUIC_STORE_TOKEN"); t && *t) token_ = t;
    else if (const char* f = std::getenv("CIUIC_STORE_TOKEN_FILE"); f && *f)
      token_ = read_token_file(f, "CIUIC_STORE_TOKEN_FILE");
    const bool given = !token_.empty();
    if (!one_node && !given && o_.store_token_file.empty())
      throw UsageError("launcher: a run on " + std::to_string(o_.nnodes) +
                       " nodes needs a store token: set CIUIC_STORE_TOKEN on every node");
    if (o_.node_rank == 0) {
      if (!given) {
        token_ = new_store_token();
        if (!one_node) write_token_file(o_.store_token_file, token_);
      }
      server_ = std::make_unique<StoreServer>(one_node ? std::string("127.0.0.1") : o_.master_addr,
                                              o_.master_port, token_, one_node);
      host_ = server_->host();
      port_ = server_->port();
      log_info("launcher: the run's store listens at " + server_->address() +
               (one_node ? " (loopback only, token required)" : " (token required)"));
      tcp_ = connect_run_store(host_, port_, token_, o_.rendezvous_timeout, who);
    } else {
      host_ = o_.master_addr;
      port_ = o_.master_port;
      tcp_ = connect_node0(who);
    }
    if (o_.nnodes > 1)
      watch_ = std::make_unique<NodeWatch>(
          o_, c10::make_intrusive<c10d::PrefixStore>("ciuic/launch", tcp_), where());
  }

  // Nodes other than 0: connects to node 0's store until the rendezvous timeout. A token read from
  // store_token_file may be an earlier run's until node 0 rewrote it (node 0 writes it before its
  // store listens, and the file is read once connected): a refusal is retried until the timeout.
  c10::intrusive_ptr<c10d::Store> connect_node0(const std::string& who) {
    const auto deadline = Clock::now() + o_.rendezvous_timeout;
    std::function<std::string()> from_file;
    if (token_.empty())
      from_file = [&] { return token_ = read_token_file(o_.store_token_file, "the store token file"); };
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      try {
        return connect_run_store(host_, port_, token_, std::max(left, std::chrono::milliseconds(1)),
                                 who, {}, from_file);
      } catch (const StoreUnreachable&) {
        throw Error(who + " could not reach node 0: nothing accepted a connection at " + where() +
                    ", where the launcher of node 0 hosts the run's store, within " +
                    seconds_text(o_.rendezvous_timeout) +
                    " ([cluster] timeout_s). Check that node 0 was started, with the same "
                    "--nnodes, --master-addr and --master-port, and that this host can reach it");
      } catch (const StoreRefused& e) {
        if (!from_file || Clock::now() >= deadline)
          throw Error(std::string(e.what()) +
                      (from_file ? " (token from " + o_.store_token_file + ")" : ""));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }

  void start_workers() {
    exe_ = find_executable(o_.argv[0]);
    devnull_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (devnull_ < 0)
      throw Error(std::string("launcher: cannot open /dev/null: ") + strerror(errno));

    std::vector<std::string> base_env;
    bool have_omp = false;
    for (char** e = environ; *e; ++e) {
      std::string_view kv(*e);
      if (kv.substr(0, 16) == "OMP_NUM_THREADS=") have_omp = true;
      if (!is_launch_var(kv)) base_env.emplace_back(kv);
    }
    const int world = o_.nnodes * o_.nproc_per_node;
    auto common = [&](std::vector<std::string>& env) {
      auto add = [&](const char* k, const std::string& v) {
        env.push_back(std::string(k) + "=" + v);
      };
      add("WORLD_SIZE", std::to_string(world));
      add("LOCAL_WORLD_SIZE", std::to_string(o_.nproc_per_node));
      add("GROUP_RANK", std::to_string(o_.node_rank));
      add("NODE_RANK", std::to_string(o_.node_rank));
      add("GROUP_WORLD_SIZE", std::to_string(o_.nnodes));
      add("ROLE_WORLD_SIZE", std::to_string(world));
      add("MASTER_ADDR", host_);
      add("MASTER_PORT", std::to_string(port_));
      add("CIUIC_LAUNCHER", "1");
      add("CIUIC_STORE_TOKEN", token_);
      // The workers' stderr is a pipe to this process; when this process's stderr is a terminal,
      // rank 0 draws its one-line progress display anyway and this process passes it through.
      if (tty_) add("CIUIC_PROGRESS_TTY", "1");
      if (!have_omp)
        add("OMP_NUM_THREADS", std::to_string(std::max(1, usable_cores() / o_.nproc_per_node)));
    };

    std::vector<char*> argv;
    for (const auto& a : o_.argv) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);

    fflush(stdout);
    fflush(stderr);
    workers_.resize(o_.nproc_per_node);
    for (int lr = 0; lr < o_.nproc_per_node; ++lr) {
      Worker& w = workers_[lr];
      w.rank = o_.node_rank * o_.nproc_per_node + lr;
      std::vector<std::string> env = base_env;
      common(env);
      env.push_back("RANK=" + std::to_string(w.rank));
      env.push_back("ROLE_RANK=" + std::to_string(w.rank));
      env.push_back("LOCAL_RANK=" + std::to_string(lr));
      std::vector<char*> envp;
      for (auto& s : env) envp.push_back(s.data());
      envp.push_back(nullptr);

      int out[2], err[2];
      if (pipe2(out, O_CLOEXEC) != 0)
        throw Error(std::string("launcher: pipe2: ") + strerror(errno));
      if (pipe2(err, O_CLOEXEC) != 0) {
        close(out[0]), close(out[1]);
        throw Error(std::string("launcher: pipe2: ") + strerror(errno));
      }
      w.fd[0] = out[0];
      w.fd[1] = err[0];
      try {
        w.pid = spawn(exe_, argv, envp, out[1], err[1], devnull_);
      } catch (...) {
        close(out[1]), close(err[1]);
        throw;
      }
      w.running = true;
      close(out[1]);
      close(err[1]);
      fcntl(w.fd[0], F_SETFL, fcntl(w.fd[0], F_GETFL) | O_NONBLOCK);
      fcntl(w.fd[1], F_SETFL, fcntl(w.fd[1], F_GETFL) | O_NONBLOCK);
    }
    log_info("launcher: started " + std::to_string(o_.nproc_per_node) + " worker(s) (ranks " +
             std::to_string(workers_.front().rank) + "-" + std::to_string(workers_.back().rank) +
             " of " + std::to_string(world) + "), store at " + where());
  }

  // ---- output ----
  // A worker's line: shown (prefixed with its rank) or only kept in its tail.
  void emit(Worker& w, int stream, std::string line) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    strip_clear_line(line);
    const bool err = is_error_line(line);
    const bool show = w.rank == 0 || o_.output_all_ranks || err;
    if (show) {
      clear_progress();
      write_all(stream == 0 ? 1 : 2, "[rank " + std::to_string(w.rank) + "] " + line + "\n");
    }
    notes_.line(w.rank, line, stream == 1);
    w.tail.push_back({std::move(line), stream == 1, show});
    if (w.tail.size() > kTailLines) w.tail.pop_front();
  }

  // The progress display: rank 0 redraws one line with "\r\033[2K<text>" (no newline) on its
  // stderr (train/metrics.cpp Progress). Each redraw is passed through to this process's stderr,
  // prefixed; any other line first clears it.
  static void strip_clear_line(std::string& s) {
    static const std::string kClear = "\033[2K";
    while (s.compare(0, kClear.size(), kClear) == 0) s.erase(0, kClear.size());
  }
  void draw_progress(Worker& w, std::string text) {
    strip_clear_line(text);
    if (text.empty() || w.rank != 0 || (progress_drawn_ && text == progress_text_)) return;
    write_all(2, "\r\033[2K[rank 0] " + text);
    progress_drawn_ = true;
    progress_text_ = std::move(text);
  }
  void clear_progress() {
    if (!progress_drawn_) return;
    write_all(2, "\r\033[2K");
    progress_drawn_ = false;
  }

  void read_stream(Worker& w, int stream) {
    char buf[65536];
    for (;;) {
      ssize_t n = read(w.fd[stream], buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return;  // EAGAIN: drained for now
      if (n == 0) {       // EOF
        if (!w.partial[stream].empty()) emit(w, stream, std::move(w.partial[stream]));
        w.partial[stream].clear();
        close(w.fd[stream]);
        w.fd[stream] = -1;
        return;
      }
      std::string& p = w.partial[stream];
      p.append(buf, static_cast<size_t>(n));
      size_t start = 0, end;
      // On stderr a '\r' also ends a segment: the progress text drawn before it (dropped when the
      // display is off: it was a redraw of the line that a later '\n' completes).
      const char* terminators = stream == 1 && tty_ ? "\n\r" : "\n";
      while ((end = p.find_first_of(terminators, start)) != std::string::npos) {
        if (p[end] == '\n') emit(w, stream, p.substr(start, end - start));
        else draw_progress(w, p.substr(start, end - start));
        start = end + 1;
      }
      p.erase(0, start);
      // A progress redraw arrives whole (one write) and stays unterminated until the next one:
      // draw what is there now; it is drawn again, complete, if more of it arrives.
      if (stream == 1 && tty_ && start > 0 && p[0] == '\033') draw_progress(w, p);
      if (p.size() > kMaxLine) {  // a very long line without newline: pass it on in pieces
        emit(w, stream, std::move(p));
        p.clear();
      }
    }
  }

  // ---- supervision ----
  void signal_workers(int sig) {
    for (auto& w : workers_)
      if (w.running) {
        kill(-w.pid, sig);
        kill(w.pid, sig);
      }
  }

  void begin_stop(const std::string& why) {
    if (stopping_) return;
    stopping_ = true;
    kill_deadline_ = Clock::now() + o_.stop_grace;
    bool any = false;
    for (auto& w : workers_) any |= w.running;
    if (any)
      log_warn("launcher: " + why + "; stopping the workers of this node (SIGTERM, SIGKILL after " +
               std::to_string(o_.stop_grace.count()) + " s)");
    signal_workers(SIGTERM);
  }

  void on_interrupt(int sig) {
    ++interrupts_;
    if (interrupts_ == 1) {
      log_warn("launcher: received " + signal_name(sig) +
               ": forwarded to the workers, which save a checkpoint and exit (send it again to "
               "kill them)");
      signal_workers(sig);
    } else {
      log_warn("launcher: received " + signal_name(sig) + " again: killing the workers");
      killed_ = true;
      signal_workers(SIGKILL);
    }
  }

  void reap() {
    for (auto& w : workers_) {
      if (!w.running) continue;
      int st = 0;
      pid_t r = waitpid(w.pid, &st, WNOHANG);
      if (r == 0 || (r < 0 && errno == EINTR)) continue;
      w.running = false;
      w.status = r < 0 ? (1 << 8) : st;
      kill(-w.pid, SIGKILL);  // anything the worker left in its process group
      const bool clean = WIFEXITED(w.status) && WEXITSTATUS(w.status) == 0;
      if (clean) continue;
      // After an interrupt or a stop of ours, exit 130 or death by the signal we sent is expected.
      const bool signalled = interrupts_ > 0 || stopping_;
      const bool expected =
          signalled && ((WIFEXITED(w.status) && WEXITSTATUS(w.status) == kExitInterrupted) ||
                        (WIFSIGNALED(w.status) &&
                         (WTERMSIG(w.status) == SIGINT || WTERMSIG(w.status) == SIGTERM ||
                          (WTERMSIG(w.status) == SIGKILL && killed_))));
      if (expected) continue;
      // Everything it wrote before exiting is in its pipes: read it before judging its error.
      for (int s = 0; s < 2; ++s)
        if (w.fd[s] >= 0) read_stream(w, s);
      notes_.failed(w.rank);
      report_local_failure();
      const std::string what = "rank " + std::to_string(w.rank) + " (pid " +
                               std::to_string(w.pid) + ") " + describe_status(w.status);
      // A failure that looks like a consequence (a peer's connection lost) usually comes before
      // the error of its cause: a rank that throws closes its connections while unwinding, and
      // prints its error only then. Stopping it at once would lose that error (SIGTERM kills a
      // process that no longer handles it), so the others get kSecondaryStopDelay first.
      if (!notes_.pick()->secondary) begin_stop(what);
      else if (!stop_at_) stop_at_ = {Clock::now() + kSecondaryStopDelay, what};
    }
  }

  const Worker* worker_of_rank(int rank) const {
    for (const auto& w : workers_)
      if (w.rank == rank) return &w;
    return nullptr;
  }

  // "rank 2 (pid 1234) exited with code 3; first error: <its first error line>"
  std::string describe(const FailureNotes::Pick& p) const {
    const Worker& w = *worker_of_rank(p.rank);
    std::string msg = "rank " + std::to_string(w.rank) + " (pid " + std::to_string(w.pid) + ") " +
                      describe_status(w.status);
    std::string q = p.quote;
    if (q.size() > 1200)
      q = q.substr(0, 1000) + " [... " + std::to_string(q.size() - 1000) + " bytes]";
    if (q.empty()) return msg + "; it printed no error message";
    return msg + (p.error_line ? "; first error: " : "; its last line on stderr: ") + q;
  }

  // Multi-node: hands this node's choice of the failure to name to the watch (which reports it).
  void report_local_failure() {
    if (!watch_) return;
    if (auto p = notes_.pick()) watch_->report(describe(*p), p->secondary);
  }

  // Multi-node: acts on what the watch thread saw: the run's verdict naming another node (a
  // failure there, a lost or missing node), or the store lost with node 0.
  void watch_other_nodes() {
    if (!watch_) return;
    const NodeWatch::State st = watch_->state();
    if (st.verdict && st.verdict->node != o_.node_rank && !remote_failure_) {
      remote_failure_ = true;
      begin_stop("the run stopped: " + st.verdict->message);
    }
    if (!st.store_error.empty() && !st.verdict && !store_lost_) {
      store_lost_ = true;
      begin_stop("lost contact with the run's store: " + node0_lost_message(st.store_error));
    }
  }

  std::string node0_lost_message(const std::string& error) const {
    if (o_.node_rank == 0) return "the run's store, hosted by this launcher, failed: " + error;
    return watch_->node0() + " was lost: its launcher, which hosts the run's store at " + where() +
           ", stopped answering (it was killed, or its host or the network failed; the store "
           "connection said: " + error + ")";
  }

  bool any_running() const {
    for (const auto& w : workers_)
      if (w.running) return true;
    return false;
  }

  void loop(int wake_fd) {
    std::optional<Clock::time_point> drain_deadline;
    const int watch_fd = watch_ ? watch_->wake_fd() : -1;
    for (;;) {
      const bool running = any_running();
      bool open_fds = false;
      std::vector<pollfd> pfds{{wake_fd, POLLIN, 0}, {watch_fd, POLLIN, 0}};
      std::vector<std::pair<Worker*, int>> owners{{nullptr, 0}, {nullptr, 0}};
      for (auto& w : workers_)
        for (int s = 0; s < 2; ++s)
          if (w.fd[s] >= 0) {
            pfds.push_back({w.fd[s], POLLIN, 0});
            owners.emplace_back(&w, s);
            open_fds = true;
          }
      if (!running) {
        // Drain what the workers wrote before exiting; something that inherited a pipe and
        // outlived its worker cannot hold the launcher for more than 2 s.
        if (!open_fds) break;
        if (!drain_deadline) drain_deadline = Clock::now() + std::chrono::seconds(2);
        if (Clock::now() >= *drain_deadline) break;
      }
      int timeout_ms = 200;
      if (stopping_ && running && !killed_) {
        auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(kill_deadline_ - Clock::now());
        timeout_ms = static_cast<int>(std::clamp<int64_t>(left.count(), 0, 200));
      }
      int n = poll(pfds.data(), pfds.size(), timeout_ms);
      if (n < 0 && errno != EINTR) throw Error(std::string("launcher: poll: ") + strerror(errno));
      if (n > 0) {
        if (pfds[0].revents & POLLIN) {
          unsigned char sigs[64];
          ssize_t k;
          while ((k = read(wake_fd, sigs, sizeof sigs)) > 0)
            for (ssize_t i = 0; i < k; ++i)
              if (sigs[i] == SIGINT || sigs[i] == SIGTERM) on_interrupt(sigs[i]);
        }
        if (pfds[1].revents & POLLIN) {
          unsigned char b[64];
          while (read(watch_fd, b, sizeof b) > 0) {
          }
        }
        for (size_t i = 2; i < pfds.size(); ++i)
          if (pfds[i].revents & (POLLIN | POLLHUP | POLLERR))
            read_stream(*owners[i].first, owners[i].second);
      }
      reap();
      watch_other_nodes();
      if (stop_at_ && !stopping_ && Clock::now() >= stop_at_->first) begin_stop(stop_at_->second);
      if (stopping_ && !killed_ && any_running() && Clock::now() >= kill_deadline_) {
        log_warn("launcher: workers still running " + std::to_string(o_.stop_grace.count()) +
                 " s after SIGTERM: sending SIGKILL");
        killed_ = true;
        signal_workers(SIGKILL);
      }
    }
  }

  // Multi-node, after this node's workers ended: waits for the run's verdict when a worker here
  // failed (node 0 chooses it within about kSecondaryWait, or kLostAfterFailure when a node was
  // lost); node 0 then keeps the store up until every node that joined has finished or is lost
  // (nodes that never joined are not waited for). Marks this node finished.
  void finish_nodes() {
    if (!watch_) return;
    const bool local_failure = notes_.pick().has_value();
    const bool failing = local_failure || remote_failure_ || store_lost_;
    if (failing) watch_->set_failing();
    auto wait_until = [&](auto done, Clock::duration limit, const char* what) {
      const auto begin = Clock::now();
      bool told = false;
      while (!done(watch_->state())) {
        if (Clock::now() - begin >= limit) {
          log_warn(std::string("launcher: ") + what + " within " + seconds_text(limit));
          return;
        }
        if (!told && Clock::now() - begin > std::chrono::seconds(2)) {
          log_info("launcher: waiting for the other nodes to finish");
          told = true;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    };
    if (local_failure)
      wait_until(
          [&](const NodeWatch::State& st) {
            return st.verdict.has_value() || !st.store_error.empty();
          },
          kSecondaryWait + kLostAfterFailure + std::chrono::seconds(5),
          "the run's verdict did not come");
    if (o_.node_rank == 0) {
      const Clock::duration limit =
          failing ? Clock::duration(o_.stop_grace + std::chrono::seconds(5))
                  : Clock::duration(o_.rendezvous_timeout);
      wait_until([](const NodeWatch::State& st) { return st.pending == 0; }, limit,
                 "not every node reported completion; closing the run's store");
      for (const auto& l : watch_->state().lost) log_warn("launcher: " + l);
    }
    watch_->finish();
    watch_other_nodes();  // what the last passes saw
  }

  int finish() {
    finish_nodes();
    const std::optional<FailureNotes::Pick> p = notes_.pick();
    const NodeWatch::State st = watch_ ? watch_->state() : NodeWatch::State{};
    // The cause, when it is not on this node: another node's failure, a node lost or missing, or
    // (other nodes) node 0 lost with the store. A failure here that is not a consequence comes
    // first when the store was lost.
    std::string cause;
    if (st.verdict && st.verdict->node != o_.node_rank)
      cause = st.verdict->message;
    else if (!st.verdict && !st.store_error.empty() && (!p || p->secondary))
      cause = node0_lost_message(st.store_error);
    if (p && cause.empty()) {
      const Worker& w = *worker_of_rank(p->rank);
      std::string hidden;
      for (const auto& t : w.tail)
        if (!t.shown) hidden += "[rank " + std::to_string(w.rank) + "] " + t.text + "\n";
      if (!hidden.empty()) {
        write_all(2, "ciuic: last output lines of rank " + std::to_string(w.rank) + ":\n");
        write_all(2, hidden);
      }
      log_error("launcher: " + describe(*p));
      return exit_code_of(w.status);
    }
    if (!cause.empty()) {
      log_error("launcher: stopped because " + cause);
      return kExitRuntime;
    }
    if (interrupts_ > 0) return kExitInterrupted;
    return kExitOk;
  }

  const LaunchOptions& o_;
  std::string exe_;
  int devnull_ = -1;
  std::vector<Worker> workers_;
  std::unique_ptr<StoreServer> server_;  // node 0 only (destroyed after tcp_ and watch_)
  c10::intrusive_ptr<c10d::Store> tcp_;
  std::string host_, token_;
  int port_ = 0;
  bool stopping_ = false;
  bool killed_ = false;
  // This process's stderr is a terminal (or CIUIC_PROGRESS_TTY says to draw as if it were).
  const bool tty_ = isatty(STDERR_FILENO) == 1 || std::getenv("CIUIC_PROGRESS_TTY") != nullptr;
  bool progress_drawn_ = false;                  // a progress line is on the terminal:
  std::string progress_text_;                    // this one
  int interrupts_ = 0;
  Clock::time_point kill_deadline_{};
  // A stop due after kSecondaryStopDelay (the failure so far looks like a consequence): when, why.
  std::optional<std::pair<Clock::time_point, std::string>> stop_at_;
  FailureNotes notes_;                // every worker's lines and failures, in arrival order
  std::unique_ptr<NodeWatch> watch_;  // multi-node runs only (destroyed before tcp_)
  bool remote_failure_ = false;       // the run's verdict names another node
  bool store_lost_ = false;           // this launcher lost the store (node 0) before a verdict
};

}  // namespace

int launch_and_supervise(const LaunchOptions& options) {
  Supervisor s(options);
  return s.run();
}

}  // namespace ciuic::launch
