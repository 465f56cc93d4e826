// ciuic/c10d.h — the run's Store as a LibTorch c10d::Store, for comm plugins built on c10d.
//
// Comm plugins that use c10d process groups (ProcessGroupGloo, ...) need a c10d::Store to
// rendezvous. c10d_store() gives them one backed by the run's Store:
//  - the core's TCP-backed Store (multi-process runs) returns its underlying c10d store (a
//    c10d::PrefixStore, with the same "ciuic/" key namespace, over the connection to the run's
//    store — which already presented the run's token — or over torchrun's agent TCPStore), so
//    c10d talks to the store directly;
//  - any other Store (the in-memory store of single-process runs, a test's own Store) is wrapped
//    in an adapter implementing set/get/add/check/wait/deleteKey through the ciuic::Store
//    interface (deleteKey and getNumKeys throw c10::NotImplementedError).
// The result shares ownership of the Store. Prefix your keys (c10d::PrefixStore) so that two
// process groups of one run do not collide.
//
// Threading: as thread-safe as the underlying Store (the core's stores are). Failure: store
// timeouts inside c10d surface as c10 exceptions (c10::DistStoreError), not ciuic::Error; catch
// c10::Error around c10d calls and rethrow as ciuic::Error with context.
//
// Including this header pulls in c10d's Store.hpp (part of LibTorch's distributed headers);
// include it only in plugins that need it.
#pragma once

#include <ciuic/export.h>
#include <ciuic/store.h>

#include <memory>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace ciuic {

// A Store implementation that is itself backed by a c10d::Store (the engine's TCPStore-backed
// store) derives from this too, so that c10d_store() hands out the c10d store directly.
class CIUIC_API C10dBackedStore {
 public:
  virtual ~C10dBackedStore();
  virtual c10::intrusive_ptr<c10d::Store> c10d() const = 0;
};

// `store` must not be null.
CIUIC_API c10::intrusive_ptr<c10d::Store> c10d_store(const std::shared_ptr<Store>& store);

}  // namespace ciuic
