// Test helpers for multi-process tests (tests/launch, tests/plugins/comm): run a program with its
// output in files, wait with a deadline, check that processes are gone, find a free port. A Child
// is SIGKILLed and reaped when destroyed, so a failing test leaves nothing behind; the test process
// becomes a child subreaper so that orphans of killed launchers are reparented to it and can be
// reaped and checked.
#pragma once

#include <arpa/inet.h>
#include <ciuic/files.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../support/read_file.h"

extern char** environ;

namespace ciuic::testing {

inline std::string read_file(const std::string& path) { return ciuic_test::slurp(path); }

// A fresh, empty folder under CIUIC_TEST_TMP.
inline std::string fresh_dir(const std::string& name) {
  namespace fs = std::filesystem;
  fs::path p = fs::path(CIUIC_TEST_TMP) / (name + "-" + std::to_string(getpid()));
  {
    std::error_code rm_ec;
    ciuic::remove_tree(std::filesystem::path(p).string(), rm_ec);
  }
  fs::create_directories(p);
  return p.string();
}

// A TCP port on 127.0.0.1 that was free a moment ago.
inline int free_port() {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  close(s);
  return ntohs(a.sin_port);
}

// True when `pid` no longer runs (reaps it when it is our child or was reparented to us).
inline bool process_gone(pid_t pid) {
  int st;
  waitpid(pid, &st, WNOHANG);
  if (kill(pid, 0) != 0) return true;
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(f, line);
  auto close_paren = line.rfind(')');
  if (close_paren == std::string::npos || close_paren + 2 >= line.size()) return true;
  char state = line[close_paren + 2];
  return state == 'Z' || state == 'X';
}

inline bool wait_gone(pid_t pid, std::chrono::milliseconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (!process_gone(pid)) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

// Reads an integer from `path` once it exists (written atomically by the test worker).
inline pid_t wait_pid_file(const std::string& path, std::chrono::milliseconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream f(path);
    pid_t pid = 0;
    if (f >> pid && pid > 0) return pid;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
}

class Child {
 public:
  // Starts argv with this process's environment plus `set` ("K=V") minus `unset` (names);
  // stdout and stderr go to <out_prefix>.out / .err.
  Child(const std::vector<std::string>& argv, const std::string& out_prefix,
        const std::vector<std::string>& set = {}, const std::vector<std::string>& unset = {})
      : out_(out_prefix + ".out"), err_(out_prefix + ".err") {
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) {
      std::string kv(*e);
      std::string name = kv.substr(0, kv.find('='));
      bool drop = false;
      for (const auto& u : unset) drop |= name == u;
      for (const auto& s : set) drop |= name == s.substr(0, s.find('='));
      if (!drop) env.push_back(kv);
    }
    for (const auto& s : set) env.push_back(s);
    std::vector<char*> a, e;
    for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    for (auto& s : env) e.push_back(s.data());
    e.push_back(nullptr);
    int out = open(out_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int err = open(err_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    const pid_t parent = getpid();
    start_ = std::chrono::steady_clock::now();
    pid_ = fork();
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(99);
      dup2(out, 1);
      dup2(err, 2);
      execve(a[0], a.data(), e.data());
      _exit(127);
    }
    close(out);
    close(err);
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() {
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status_, 0);
    }
  }

  pid_t pid() const { return pid_; }
  // Waits up to `limit`; true when it exited (exit_code() is then valid).
  bool wait(std::chrono::milliseconds limit) {
    auto deadline = std::chrono::steady_clock::now() + limit;
    while (!exited_) {
      pid_t r = waitpid(pid_, &status_, WNOHANG);
      if (r == pid_) {
        exited_ = true;
        end_ = std::chrono::steady_clock::now();
        break;
      }
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return true;
  }
  // Exit code, or 128 + signal.
  int exit_code() const {
    return WIFEXITED(status_) ? WEXITSTATUS(status_) : 128 + WTERMSIG(status_);
  }
  double seconds() const { return std::chrono::duration<double>(end_ - start_).count(); }
  std::string out() const { return read_file(out_); }
  std::string err() const { return read_file(err_); }

 private:
  std::string out_, err_;
  pid_t pid_ = -1;
  int status_ = 0;
  bool exited_ = false;
  std::chrono::steady_clock::time_point start_, end_;
};

}  // namespace ciuic::testing
