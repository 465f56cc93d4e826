// Internal to the conformance kit: a world of forked ranks around a store this process hosts.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include <ciuic/context.h>
#include <ciuic/store.h>

#include "support.h"

namespace ciuic::conformance {

// The body of one rank: rank `rank` of `world`, connected to the world's store (at
// 127.0.0.1:`port`, for RunContext::master_port); adds its failures to `lines` (or throws: the
// exception's text becomes a line). Runs in a forked child.
using RankBody = std::function<void(int rank, int world, int port,
                                    const std::shared_ptr<Store>& store, Lines& lines)>;

// Forks `world` ranks first, while this process runs no thread of its own (a child of a
// multi-threaded process may only call async-signal-safe functions; ThreadSanitizer refuses it
// outright), then hosts the store — one server per call, so that no key of another world remains —
// and hands each rank its port through a pipe. Each rank's lines and exit status become GoogleTest
// failures naming the rank; a rank still running after `limit` is killed and named.
void run_ranks(int world, std::chrono::seconds limit, const RankBody& body);

}  // namespace ciuic::conformance
