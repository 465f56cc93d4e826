// Internal (core/src/launch): the launcher's process plumbing — signal handling through a
// self-pipe, writing to a pipe that may be full, worker exit statuses, and forking a worker
// (spawn: its own process group, PR_SET_PDEATHSIG, a clean signal state; async-signal-safe
// between fork and exec). Used by the Supervisor (supervisor.cpp). Main thread only.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <string>
#include <string_view>
#include <vector>

namespace ciuic::launch::detail {

// Installs the launcher's handlers for SIGINT, SIGTERM, SIGCHLD (each writes the signal number to
// a self-pipe) and ignores SIGPIPE; restores the previous ones on destruction. One at a time.
class SignalScope {
 public:
  SignalScope();
  ~SignalScope();
  SignalScope(const SignalScope&) = delete;
  SignalScope& operator=(const SignalScope&) = delete;
  int read_fd() const { return fds_[0]; }  // read end of the self-pipe

 private:
  int fds_[2] = {-1, -1};
  struct sigaction old_int_ {
  }, old_term_{}, old_chld_{}, old_pipe_{};
  sigset_t old_mask_{};
};

std::string signal_name(int sig);  // "SIGKILL", or "signal N"
// Writes all of `s` to `fd`, waiting while a non-blocking pipe is full; drops the rest when the
// reader is gone.
void write_all(int fd, const std::string& s);
int exit_code_of(int status);  // a waitpid status as ciuic-run's exit code (128 + signal)
std::string describe_status(
    int status);  // "exited with code 3", "was killed by signal 9 (SIGKILL)"
// `name` looked up in PATH unless it holds a '/'; throws UsageError when not found.
std::string find_executable(const std::string& name);
// True for "NAME=..." entries that the launcher sets itself in a worker's environment (RANK, ...,
// CIUIC_STORE_TOKEN): they are not inherited from the launcher's own environment.
bool is_launch_var(std::string_view kv);
// Forks one worker running `exe` with `argv`/`envp` (null-terminated), stdout/stderr to out_w and
// err_w, stdin from `devnull`. Returns its pid; throws Error when fork fails.
pid_t spawn(const std::string& exe, const std::vector<char*>& argv, const std::vector<char*>& envp,
            int out_w, int err_w, int devnull);

}  // namespace ciuic::launch::detail
