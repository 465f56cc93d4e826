// A child process on a pseudo-terminal for the tests that check what a terminal user sees
// (ciuic-run --watch, --chat): forkpty + execv, output read from the master side.
#pragma once

#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

namespace ciuic::testing {

// A child on a pseudo-terminal: its output is read as a terminal user would see it.
class PtyChild {
 public:
  explicit PtyChild(const std::vector<std::string>& argv) {
    std::vector<char*> a;
    for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    pid_ = forkpty(&master_, nullptr, nullptr, nullptr);
    if (pid_ == 0) {
      execv(a[0], a.data());
      _exit(127);
    }
  }
  ~PtyChild() {
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (master_ >= 0) close(master_);
  }
  // Reads until the child exits (true) or the deadline (false).
  bool run_until_exit(std::chrono::seconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{master_, POLLIN, 0};
      bool drained = false;  // nothing more to read: no data, or the terminal hung up (EIO)
      if (poll(&p, 1, 100) > 0) {
        char buf[4096];
        const ssize_t n = read(master_, buf, sizeof buf);
        if (n > 0) out_.append(buf, static_cast<size_t>(n));
        drained = n <= 0;
      } else {
        drained = true;
      }
      int status = 0;
      if (!exited_ && waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;
        code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      if (exited_ && drained) return true;
    }
    return false;
  }
  // Writes `text` to the child's terminal (as typed) and sends a signal to it.
  void write(const std::string& text) {
    if (::write(master_, text.data(), text.size()) < 0) out_ += "[write to the pty failed]";
  }
  void signal(int sig) {
    if (pid_ > 0 && !exited_) kill(pid_, sig);
  }
  // Reads until `needle` appears after offset `from` of the output (true) or the deadline.
  bool read_until(const std::string& needle, std::chrono::seconds limit, size_t from = 0) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      if (out_.find(needle, from) != std::string::npos) return true;
      pollfd p{master_, POLLIN, 0};
      if (poll(&p, 1, 100) > 0) {
        char buf[4096];
        const ssize_t n = read(master_, buf, sizeof buf);
        if (n > 0) out_.append(buf, static_cast<size_t>(n));
      }
    }
    return out_.find(needle, from) != std::string::npos;
  }
  const std::string& out() const { return out_; }
  int code() const { return code_; }

 private:
  pid_t pid_ = -1;
  int master_ = -1;
  bool exited_ = false;
  int code_ = -1;
  std::string out_;
};

}  // namespace ciuic::testing
