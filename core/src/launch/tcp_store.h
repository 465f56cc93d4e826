// Internal: the run's Store on top of LibTorch's c10d TCPStore (used by connect_store and by the
// launcher, which hosts the store of a run on node 0).
#pragma once

#include <ciuic/export.h>
#include <ciuic/store.h>

#include <chrono>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

namespace ciuic::launch {

// Opens a TCPStore at addr:port: the server (bound to every interface; port 0 picks a free one,
// see TCPStore::getPort()) or a client that retries connecting until `timeout`. `who` names the
// caller in errors ("rank 3", "the launcher of node 1"). Throws ciuic::Error naming the address,
// port and timeout.
CIUIC_API c10::intrusive_ptr<c10d::TCPStore> open_tcp_store(const std::string& addr, int port,
                                                            bool is_server,
                                                            std::chrono::milliseconds timeout,
                                                            const std::string& who);

// Waits until something accepts TCP connections at addr:port (a store's server), trying every
// 100 ms until `deadline`; false when nothing did by then. open_tcp_store's clients call it first.
CIUIC_API bool wait_for_listener(const std::string& addr, int port,
                                 std::chrono::steady_clock::time_point deadline);

// A ciuic::Store over `store` (typically a c10d::PrefixStore). `where` ("host:port") goes into
// error messages. c10d errors become ciuic::Error; timeouts name the keys and the timeout.
CIUIC_API std::shared_ptr<Store> wrap_c10d_store(c10::intrusive_ptr<c10d::Store> store,
                                                 std::string where,
                                                 std::chrono::milliseconds timeout);

}  // namespace ciuic::launch
