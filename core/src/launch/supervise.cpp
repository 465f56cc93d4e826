// launch_and_supervise(): spawns this node's workers, routes their output, stops the run on the
// first failure, forwards signals, and never leaves a worker behind.
//
// Single-threaded event loop: poll() over the workers' stdout/stderr pipes and a self-pipe that
// the signal handlers (SIGINT, SIGTERM, SIGCHLD) write to; waitpid(WNOHANG) on each live worker
// after every wake-up. Multi-node runs also poll the run's store (hosted by node 0's launcher)
// every 500 ms for a failure reported by another node.
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
#include <cstring>
#include <deque>
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
  std::string last_error;   // last is_error_line() line
  std::string last_stderr;  // last non-empty stderr line
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

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
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
    open_store();
    SignalScope signals;
    start_workers();
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

  std::string where() const { return o_.master_addr + ":" + std::to_string(port_); }

  void open_store() {
    const std::string who = "the launcher of node " + std::to_string(o_.node_rank);
    const bool server = o_.node_rank == 0;
    tcp_ = open_tcp_store(o_.master_addr, o_.master_port, server, o_.rendezvous_timeout, who);
    port_ = server ? tcp_->getPort() : o_.master_port;
    store_ = wrap_c10d_store(c10::make_intrusive<c10d::PrefixStore>("ciuic/launch", tcp_), where(),
                             o_.rendezvous_timeout);
    if (server) log_debug("launcher: the run's store listens on port " + std::to_string(port_));
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
      add("MASTER_ADDR", o_.master_addr);
      add("MASTER_PORT", std::to_string(port_));
      add("CIUIC_LAUNCHER", "1");
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
    if (err) w.last_error = line;
    if (stream == 1 && line.find_first_not_of(" \t") != std::string::npos) w.last_stderr = line;
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
      log_warn("launcher: " + why + "; stopping the other workers (SIGTERM, SIGKILL after " +
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
      // During an interrupt, exit 130 or death by the forwarded/killing signal is expected.
      const bool expected =
          (interrupts_ > 0 && ((WIFEXITED(w.status) && WEXITSTATUS(w.status) == kExitInterrupted) ||
                               (WIFSIGNALED(w.status) &&
                                (WTERMSIG(w.status) == SIGINT || WTERMSIG(w.status) == SIGTERM ||
                                 WTERMSIG(w.status) == SIGKILL)))) ||
          (stopping_ && failed_ != nullptr) || remote_failure_;
      if (expected) continue;
      if (!failed_) {
        failed_ = &w;
        const std::string what = "rank " + std::to_string(w.rank) + " (pid " +
                                 std::to_string(w.pid) + ") " + describe_status(w.status);
        if (o_.nnodes > 1) report_failure("node " + std::to_string(o_.node_rank) + ": " + what);
        begin_stop(what);
      }
    }
  }

  // Multi-node: tell the other launchers (first report wins).
  void report_failure(const std::string& msg) {
    try {
      if (!store_->check("failed")) store_->set("failed", msg);
      reported_failure_ = true;
    } catch (const Error& e) {
      log_warn("launcher: could not report the failure to the other nodes: " +
               std::string(e.what()));
    }
  }

  void poll_other_nodes() {
    if (o_.nnodes == 1) return;
    auto now = Clock::now();
    if (now < next_store_poll_) return;
    next_store_poll_ = now + std::chrono::milliseconds(500);
    try {
      if (!reported_failure_ && !remote_failure_ && store_->check("failed")) {
        remote_failure_ = true;
        remote_message_ = "another node failed (" + store_->get("failed") + ")";
        begin_stop(remote_message_);
      }
    } catch (const Error& e) {
      if (!remote_failure_ && !failed_) {
        remote_failure_ = true;
        remote_message_ =
            "this launcher lost contact with the run's store at " + where() + ": " + e.what();
        begin_stop(remote_message_);
      }
    }
  }

  bool any_running() const {
    for (const auto& w : workers_)
      if (w.running) return true;
    return false;
  }

  void loop(int wake_fd) {
    std::optional<Clock::time_point> drain_deadline;
    for (;;) {
      const bool running = any_running();
      bool open_fds = false;
      std::vector<pollfd> pfds{{wake_fd, POLLIN, 0}};
      std::vector<std::pair<Worker*, int>> owners{{nullptr, 0}};
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
        for (size_t i = 1; i < pfds.size(); ++i)
          if (pfds[i].revents & (POLLIN | POLLHUP | POLLERR))
            read_stream(*owners[i].first, owners[i].second);
      }
      reap();
      poll_other_nodes();
      if (stopping_ && !killed_ && any_running() && Clock::now() >= kill_deadline_) {
        log_warn("launcher: workers still running " + std::to_string(o_.stop_grace.count()) +
                 " s after SIGTERM: sending SIGKILL");
        killed_ = true;
        signal_workers(SIGKILL);
      }
    }
  }

  // Multi-node: report completion; node 0 keeps the store up until every node has.
  void finish_nodes() {
    if (o_.nnodes == 1) return;
    try {
      store_->add("done", 1);
      if (o_.node_rank != 0) return;
      const bool failing = failed_ || remote_failure_;
      auto limit = failing ? std::chrono::duration_cast<std::chrono::milliseconds>(o_.stop_grace) +
                                 std::chrono::seconds(5)
                           : o_.rendezvous_timeout;
      auto deadline = Clock::now() + limit;
      bool told = false;
      while (store_->add("done", 0) < o_.nnodes) {
        if (Clock::now() >= deadline) {
          log_warn("launcher: not every node reported completion; closing the run's store");
          return;
        }
        if (!told && Clock::now() + limit - deadline > std::chrono::seconds(2)) {
          log_info("launcher: waiting for the other nodes to finish");
          told = true;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    } catch (const Error& e) {
      log_warn("launcher: " + std::string(e.what()));
    }
  }

  int finish() {
    finish_nodes();
    if (failed_) {
      Worker& w = *failed_;
      std::string msg = "rank " + std::to_string(w.rank) + " (pid " + std::to_string(w.pid) + ") " +
                        describe_status(w.status);
      const std::string& last = !w.last_error.empty() ? w.last_error : w.last_stderr;
      msg += last.empty() ? "; it printed no error message" : "; last error: " + last;
      std::string hidden;
      for (const auto& t : w.tail)
        if (!t.shown) hidden += "[rank " + std::to_string(w.rank) + "] " + t.text + "\n";
      if (!hidden.empty()) {
        write_all(2, "ciuic: last output lines of rank " + std::to_string(w.rank) + ":\n");
        write_all(2, hidden);
      }
      log_error("launcher: " + msg);
      return exit_code_of(w.status);
    }
    if (remote_failure_) {
      log_error("launcher: stopped because " + remote_message_);
      return kExitRuntime;
    }
    if (interrupts_ > 0) return kExitInterrupted;
    return kExitOk;
  }

  const LaunchOptions& o_;
  std::string exe_;
  int devnull_ = -1;
  std::vector<Worker> workers_;
  c10::intrusive_ptr<c10d::TCPStore> tcp_;
  std::shared_ptr<Store> store_;
  int port_ = 0;
  bool stopping_ = false;
  bool killed_ = false;
  // This process's stderr is a terminal (or CIUIC_PROGRESS_TTY says to draw as if it were).
  const bool tty_ = isatty(STDERR_FILENO) == 1 || std::getenv("CIUIC_PROGRESS_TTY") != nullptr;
  bool progress_drawn_ = false;                  // a progress line is on the terminal:
  std::string progress_text_;                    // this one
  int interrupts_ = 0;
  Clock::time_point kill_deadline_{};
  Worker* failed_ = nullptr;
  bool reported_failure_ = false;
  bool remote_failure_ = false;
  std::string remote_message_;
  Clock::time_point next_store_poll_{};
};

}  // namespace

int launch_and_supervise(const LaunchOptions& options) {
  Supervisor s(options);
  return s.run();
}

}  // namespace ciuic::launch
