// launch_and_supervise(): spawns this node's workers, routes their output, stops the run on the
// first failure, forwards signals, and never leaves a worker behind.
//
// Event loop on the main thread: poll() over the workers' stdout/stderr pipes and a self-pipe that
// the signal handlers (SIGINT, SIGTERM, SIGCHLD) write to; waitpid(WNOHANG) on each live worker
// after every wake-up. Multi-node runs add one thread (NodeWatch) that does all of this launcher's
// talking to the run's store (hosted by node 0's launcher), so that the store never blocks the
// loop: heartbeats, this node's failure report, the run's verdict; on node 0 also the watch over
// the other nodes (joined, finished, lost) and the choice of the verdict. It wakes the loop
// through a pipe of its own when something changed.#include <c10/util/Logging.h>
#include <ciuic/error.h>
#include <ciuic/log.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <vector>

#include "launch/launch.h"
#include "launch/node_watch.h"
#include "launch/spawn.h"
#include "launch/tcp_store.h"

extern char** environ;

namespace ciuic::launch {
namespace {

using namespace detail;

constexpr size_t kTailLines = 20;
constexpr size_t kMaxLine = 64 * 1024;

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
    if (const char* t = std::getenv("CIUIC_STORE_TOKEN"); t && *t)
      token_ = t;
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
      from_file = [&] {
        return token_ = read_token_file(o_.store_token_file, "the store token file");
      };
    for (;;) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
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
        if (p[end] == '\n')
          emit(w, stream, p.substr(start, end - start));
        else
          draw_progress(w, p.substr(start, end - start));
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
      const std::string what = "rank " + std::to_string(w.rank) + " (pid " + std::to_string(w.pid) +
                               ") " + describe_status(w.status);
      // A failure that looks like a consequence (a peer's connection lost) usually comes before
      // the error of its cause: a rank that throws closes its connections while unwinding, and
      // prints its error only then. Stopping it at once would lose that error (SIGTERM kills a
      // process that no longer handles it), so the others get kSecondaryStopDelay first.
      if (!notes_.pick()->secondary)
        begin_stop(what);
      else if (!stop_at_)
        stop_at_ = {Clock::now() + kSecondaryStopDelay, what};
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
           "connection said: " +
           error + ")";
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
      const Clock::duration limit = failing
                                        ? Clock::duration(o_.stop_grace + std::chrono::seconds(5))
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
  bool progress_drawn_ = false;  // a progress line is on the terminal:
  std::string progress_text_;    // this one
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
