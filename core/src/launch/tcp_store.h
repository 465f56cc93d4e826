// Internal: the run's key-value store over TCP (used by connect_store and by the launcher, which
// hosts the store of a run on node 0).
//
// The run hosts its own store (StoreServer, with clients from connect_run_store): it binds one
// address (loopback for a single node), and every connection must open with the run's token
// before it may read or write a key. LibTorch's c10d TCPStore is only a client here, for
// torchrun's agent store (open_c10d_client), which ciuic does not host.
#pragma once

#include <ciuic/export.h>
#include <ciuic/store.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <ciuic/error.h>

namespace ciuic::launch {

// A store server, serving from its own thread until destroyed.
//
// Binds bind_addr (a numeric address or a host name of this machine; "127.0.0.1" for a run on one
// node) and `port` (0 picks a free one). Every connection must send the handshake with `token`
// (compared in constant time; "" accepts any token) and, when loopback_only, come from 127.0.0.1
// or ::1; any other is refused (closed before it can read or write a key) and logged as a warning
// naming its address and why (the first 20; then one line saying further refusals are not
// logged); one that sends nothing is refused after 5 s. Keys and values of accepted clients are
// bounded (64 KiB / 256 MiB): a larger request closes that connection with a warning.
// There is no way to list keys.
// Throws Error naming the address and port when the address is not one of this host's or the port
// is in use. Thread-safe: refused() may be called from any thread.
class CIUIC_API StoreServer {
 public:
  StoreServer(const std::string& bind_addr, int port, std::string token, bool loopback_only);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  int port() const { return port_; }
  // The bound address as "host:port" (numeric, as getsockname reports it): what the log states.
  const std::string& address() const { return address_; }
  const std::string& host() const { return host_; }
  int refused() const { return refused_.load(); }

  class Impl;

 private:
  int port_ = 0;
  std::string host_, address_;
  std::atomic<int> refused_{0};
  std::unique_ptr<Impl> impl_;
  std::thread thread_;
};

// The server closed the connection at the handshake: the token (or the client's address) is not
// the run's. what() names the address.
class CIUIC_API StoreRefused : public Error {
 public:
  using Error::Error;
};

// Nothing accepted a connection at the store's address within the timeout. what() names the
// caller, address, port and timeout.
class CIUIC_API StoreUnreachable : public Error {
 public:
  using Error::Error;
};

// A client of a StoreServer, as a c10d::Store (so that c10d process groups use it directly).
// Connects to addr:port, retrying every 100 ms until `timeout`, and presents `token` — or, when
// `late_token` is set, what it returns, asked once the TCP connection is made (so a token that the
// server's host writes before it listens is read fresh). `who` names the caller in errors
// ("rank 3"). `keep` (optional) is kept alive as long as the client (rank 0 hosting the store for
// its peers). Throws StoreRefused when the server refuses the handshake, StoreUnreachable when
// nothing accepted a connection within `timeout`, and what late_token throws.
// The returned store: get/wait throw c10::DistStoreError on a timeout, c10::DistNetworkError when
// the connection fails ("Connection closed by peer", ...); a request answered by nothing within
// its timeout (the store's, plus the wait's own for wait/get) fails the same way. Thread-safe (one
// request at a time per connection; clone() opens another connection). deleteKey and getNumKeys
// work; listKeys, compareSet and the queue calls are not supported (c10d's default throws).
CIUIC_API c10::intrusive_ptr<c10d::Store> connect_run_store(
    const std::string& addr, int port, const std::string& token, std::chrono::milliseconds timeout,
    const std::string& who, std::shared_ptr<void> keep = {},
    std::function<std::string()> late_token = {});

// A new per-job token: 32 random bytes from getrandom(2) as 64 hex digits. Throws Error when the
// kernel has no entropy source to give.
CIUIC_API std::string new_store_token();

// Opens a c10d TCPStore client at addr:port (torchrun's agent store), first waiting until
// something accepts connections there (wait_for_listener) up to `timeout`. Throws ciuic::Error
// naming the caller, address, port and timeout.
CIUIC_API c10::intrusive_ptr<c10d::TCPStore> open_c10d_client(const std::string& addr, int port,
                                                              std::chrono::milliseconds timeout,
                                                              const std::string& who);

// Waits until something accepts TCP connections at addr:port (a store's server), trying every
// 100 ms until `deadline`; false when nothing did by then.
CIUIC_API bool wait_for_listener(const std::string& addr, int port,
                                 std::chrono::steady_clock::time_point deadline);

// A ciuic::Store over `store` (typically a c10d::PrefixStore). `where` ("host:port") goes into
// error messages. c10d errors become ciuic::Error; timeouts name the keys and the timeout.
CIUIC_API std::shared_ptr<Store> wrap_c10d_store(c10::intrusive_ptr<c10d::Store> store,
                                                 std::string where,
                                                 std::chrono::milliseconds timeout);

}  // namespace ciuic::launch
