// The launcher's process plumbing (launch/spawn.h).
#include "launch/spawn.h"

#include <ciuic/error.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>

namespace ciuic::launch::detail {
namespace {
// ---- signals -------------------------------------------------------------------------------
int g_wake_write = -1;  // write end of the self-pipe; the handler's only state

void on_signal(int sig) {
  const int saved = errno;
  const unsigned char b = static_cast<unsigned char>(sig);
  if (g_wake_write >= 0) (void)!write(g_wake_write, &b, 1);
  errno = saved;
}

}  // namespace

SignalScope::SignalScope() {
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

SignalScope::~SignalScope() {
  sigaction(SIGINT, &old_int_, nullptr);
  sigaction(SIGTERM, &old_term_, nullptr);
  sigaction(SIGCHLD, &old_chld_, nullptr);
  sigaction(SIGPIPE, &old_pipe_, nullptr);
  pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
  g_wake_write = -1;
  close(fds_[0]);
  close(fds_[1]);
}

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

namespace {
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

}  // namespace

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

}  // namespace ciuic::launch::detail
