// The run's key-value store (ciuic's own server, launch/store_server.cpp, or torchrun's agent
// store), seen as a ciuic/c10d.h C10dBackedStore, and the rendezvous.
#include <c10/util/Exception.h>
#include <ciuic/c10d.h>
#include <ciuic/error.h>
#include <ciuic/log.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <thread>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "launch/launch.h"
#include "launch/tcp_store.h"

namespace ciuic {
namespace launch {
namespace {

std::string seconds_str(std::chrono::milliseconds t) {
  char buf[32];
  snprintf(buf, sizeof buf, "%g s", static_cast<double>(t.count()) / 1000.0);
  return buf;
}

std::string join_keys(const std::vector<std::string>& keys) {
  std::string s;
  for (const auto& k : keys) s += (s.empty() ? "" : ", ") + k;
  return s;
}

// c10 exceptions carry a C++ backtrace in what(); users need the first line only.
std::string c10_message(const c10::Error& e) {
  std::string m = e.what_without_backtrace();
  while (!m.empty() && (m.back() == '\n' || m.back() == ' ')) m.pop_back();
  return m;
}

class C10dRunStore final : public Store, public C10dBackedStore {
 public:
  C10dRunStore(c10::intrusive_ptr<c10d::Store> store, std::string where,
               std::chrono::milliseconds timeout)
      : store_(std::move(store)), where_(std::move(where)), timeout_(timeout) {}

  // c10d's TCPStore::set only sends the request and returns before the server has applied it:
  // another rank that learns of the set by another channel (a barrier, a collective) and then
  // checks the key could miss it (about 7% of immediate checks from another connection did on
  // this machine; comm_gloo_test failed that way once). The server answers one connection's
  // requests in order, so a check of the key on the same connection returns once the set is
  // applied: set() returns when every rank can see the value (ciuic/store.h).
  void set(const std::string& key, const std::string& value) override {
    call("set", key, [&] {
      store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
      store_->check({key});
    });
  }
  std::string get(const std::string& key) override {
    std::vector<uint8_t> v;
    call("get", key, [&] { v = store_->get(key); });
    return std::string(v.begin(), v.end());
  }
  int64_t add(const std::string& key, int64_t delta) override {
    int64_t r = 0;
    call("add", key, [&] { r = store_->add(key, delta); });
    return r;
  }
  bool check(const std::string& key) override {
    bool r = false;
    call("check", key, [&] { r = store_->check({key}); });
    return r;
  }
  void wait(const std::vector<std::string>& keys) override {
    call("wait", join_keys(keys), [&] { store_->wait(keys, timeout_); });
  }
  std::chrono::milliseconds timeout() const override { return timeout_; }

  c10::intrusive_ptr<c10d::Store> c10d() const override { return store_; }

 private:
  template <class F>
  void call(const char* op, const std::string& keys, F&& f) {
    try {
      f();
    } catch (const c10::DistStoreError& e) {
      // get/wait on a key that never appears.
      throw Error("store at " + where_ + ": timed out after " + seconds_str(timeout_) +
                  " waiting for key(s) " + keys + " (" + c10_message(e) + ")");
    } catch (const c10::Error& e) {
      throw Error("store at " + where_ + ": " + op + " of key(s) " + keys +
                  " failed: " + c10_message(e));
    }
  }

  c10::intrusive_ptr<c10d::Store> store_;
  std::string where_;
  std::chrono::milliseconds timeout_;
};

std::string host_name() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof buf - 1) != 0) return "?";
  return buf;
}

// "1, 3-5, 9"
std::string rank_ranges(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    s += (s.empty() ? "" : ", ") + std::to_string(ranks[i]);
    if (j > i) s += "-" + std::to_string(ranks[j]);
    i = j + 1;
  }
  return s;
}

}  // namespace

// c10d's TCPStore client retries on its own too, but its connect and validation steps each wait
// up to the whole timeout: a store that never came up was reported after twice the timeout.
bool wait_for_listener(const std::string& addr, int port,
                       std::chrono::steady_clock::time_point deadline) {
  using Clock = std::chrono::steady_clock;
  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    if (getaddrinfo(addr.c_str(), std::to_string(port).c_str(), &hints, &res) == 0) {
      bool up = false;
      for (addrinfo* ai = res; ai && !up; ai = ai->ai_next) {
        const int s =
            socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
        if (s < 0) continue;
        int r = connect(s, ai->ai_addr, ai->ai_addrlen);
        if (r != 0 && errno == EINPROGRESS) {
          const auto left =
              std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
          pollfd p{s, POLLOUT, 0};
          int err = -1;
          socklen_t len = sizeof err;
          if (poll(&p, 1, static_cast<int>(std::clamp<int64_t>(left.count(), 1, 1000))) == 1 &&
              getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len) == 0)
            r = err == 0 ? 0 : -1;
        }
        close(s);
        up = r == 0;
      }
      freeaddrinfo(res);
      if (up) return true;
    }
    const auto now = Clock::now();
    if (now >= deadline) return false;
    std::this_thread::sleep_for(
        std::min<Clock::duration>(std::chrono::milliseconds(100), deadline - now));
  }
}

c10::intrusive_ptr<c10d::TCPStore> open_c10d_client(const std::string& addr, int port,
                                                    std::chrono::milliseconds timeout,
                                                    const std::string& who) {
  if (port <= 0 || port > 65535)
    throw UsageError(who + ": invalid store port " + std::to_string(port));
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<uint16_t>(port);
  opts.isServer = false;
  opts.waitWorkers = false;
  opts.timeout = timeout;
  auto unreachable = [&](const std::string& detail) {
    return Error(who + " could not reach the run's store at " + addr + ":" + std::to_string(port) +
                 " within " + seconds_str(timeout) +
                 " (is the launcher of node 0, or rank 0, running, and are MASTER_ADDR/MASTER_PORT "
                 "right and reachable from this host?)" +
                 detail);
  };
  if (!wait_for_listener(addr, port, std::chrono::steady_clock::now() + timeout))
    throw unreachable(": nothing accepted a connection there");
  try {
    return c10::make_intrusive<c10d::TCPStore>(addr, opts);
  } catch (const c10::Error& e) {
    throw unreachable(": " + c10_message(e));
  }
}

std::shared_ptr<Store> wrap_c10d_store(c10::intrusive_ptr<c10d::Store> store, std::string where,
                                       std::chrono::milliseconds timeout) {
  return std::make_shared<C10dRunStore>(std::move(store), std::move(where), timeout);
}

std::shared_ptr<Store> connect_store(const WorkerEnv& env, std::chrono::milliseconds timeout) {
  if (env.world_size == 1 && !env.store_hosted_by_launcher) return make_local_store(timeout);
  const std::string who = "rank " + std::to_string(env.rank);
  // One node: the store serves loopback only, whatever MASTER_ADDR names (the run's own launcher
  // or rank 0 binds 127.0.0.1). Several: the address given, and the run's token.
  const bool one_node = env.num_nodes <= 1;
  const std::string addr = one_node ? "127.0.0.1" : env.master_addr;
  std::string where = addr + ":" + std::to_string(env.master_port);
  c10::intrusive_ptr<c10d::Store> tcp;
  if (env.store_hosted_by_launcher && env.launcher != "ciuic") {
    // torchrun's agent store: c10d's TCPStore, hosted by torchrun, not by ciuic.
    tcp = open_c10d_client(env.master_addr, env.master_port, timeout, who);
  } else if (env.store_hosted_by_launcher) {
    tcp = connect_run_store(addr, env.master_port, env.store_token, timeout, who);
  } else if (env.rank == 0) {
    if (!one_node && env.store_token.empty())
      throw UsageError(
          env.launcher + " environment: a run on " + std::to_string(env.num_nodes) +
          " nodes needs a store token shared by every rank: set CIUIC_STORE_TOKEN "
          "(e.g. export CIUIC_STORE_TOKEN=$(od -An -N32 -tx1 /dev/urandom | tr -d ' "
          "\\n') in the job script) or CIUIC_STORE_TOKEN_FILE (a file readable only by you)");
    auto server = std::make_shared<StoreServer>(addr, env.master_port, env.store_token, one_node);
    where = server->address();
    log_info("rank 0 hosts the run's store at " + where +
             (env.store_token.empty() ? " (loopback only)" : " (token required)"));
    tcp = connect_run_store(server->host(), server->port(), env.store_token, timeout, who, server);
  } else {
    tcp = connect_run_store(addr, env.master_port, env.store_token, timeout, who);
  }

  std::string prefix = "ciuic";
  if (env.restart_count > 0) prefix += "/attempt_" + std::to_string(env.restart_count);
  auto store = c10::make_intrusive<c10d::PrefixStore>(prefix, tcp);

  // Rendezvous: announce, then wait for every rank's announcement.
  auto rank_key = [](int r) { return "rdzv/rank/" + std::to_string(r); };
  std::vector<std::string> keys;
  keys.reserve(env.world_size);
  for (int r = 0; r < env.world_size; ++r) keys.push_back(rank_key(r));
  const std::string me = host_name() + " pid " + std::to_string(getpid());
  try {
    store->set(rank_key(env.rank), std::vector<uint8_t>(me.begin(), me.end()));
    store->wait(keys, timeout);
  } catch (const c10::Error& e) {
    std::vector<int> missing;
    std::string joined;
    int njoined = 0;
    try {
      for (int r = 0; r < env.world_size; ++r) {
        if (store->check({rank_key(r)})) {
          ++njoined;
          if (njoined <= 16) {
            auto v = store->get(rank_key(r));
            joined += (joined.empty() ? "" : ", ") + std::to_string(r) + " (" +
                      std::string(v.begin(), v.end()) + ")";
          }
        } else {
          missing.push_back(r);
        }
      }
    } catch (const c10::Error& e2) {
      throw Error("rendezvous at " + where + " failed for " + who + ": " + c10_message(e) +
                  "; then the store became unreachable: " + c10_message(e2));
    }
    if (njoined > 16) joined += ", ...";
    throw Error("rendezvous at " + where + " timed out after " + seconds_str(timeout) + " (" + who +
                " of " + std::to_string(env.world_size) + ", launcher " + env.launcher +
                "): " + std::to_string(njoined) + " of " + std::to_string(env.world_size) +
                " ranks joined: " + joined + "; missing ranks: " + rank_ranges(missing) +
                ". Check that every node was started with the same number of nodes, processes "
                "per node, master address and port.");
  }
  log_debug("rendezvous complete at " + where + " (" + who + " of " +
            std::to_string(env.world_size) + ")");
  return wrap_c10d_store(store, where, timeout);
}

}  // namespace launch

}  // namespace ciuic
