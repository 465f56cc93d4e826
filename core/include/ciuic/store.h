// ciuic/store.h — the run's key-value store, shared by all ranks.
//
// Backed by the run's TCP store (the launcher of node 0 or rank 0 hosts it, bound to loopback on
// one node, requiring the run's token on several: docs/launch.md; torchrun's agent TCPStore under
// torchrun; single-process runs get an in-memory store). Plugins use it to exchange small blobs at
// set-up (an NCCL unique id, a cache build's completion), never on the training hot path.
//
// Thread-safe. get()/wait() block until the key exists or the run's rendezvous timeout passes,
// then throw ciuic::Error naming the key and the timeout. set() and add() return once the store
// holds the new value: a rank that learns of it by other means (a barrier, a collective) finds it
// with check() or get(). (The raw c10d::Store of ciuic/c10d.h keeps c10d's own semantics: its
// set() returns before the server has applied it.) Keys are namespaced by the caller
// (e.g. "nccl/uid/0").
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ciuic/export.h>

namespace ciuic {

class CIUIC_API Store {
 public:
  virtual ~Store();
  virtual void set(const std::string& key, const std::string& value) = 0;
  virtual std::string get(const std::string& key) = 0;
  // Atomically adds `delta` to the integer stored at `key` (0 when absent); returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  virtual bool check(const std::string& key) = 0;  // exists now? never blocks
  virtual void wait(const std::vector<std::string>& keys) = 0;
  virtual std::chrono::milliseconds timeout() const = 0;
};

// An in-memory store for single-process runs and tests.
CIUIC_API std::shared_ptr<Store> make_local_store(std::chrono::milliseconds timeout);

}  // namespace ciuic
