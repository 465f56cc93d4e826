// Internal (core/src/launch): the launchers of a multi-node run watch each other through the
// run's store (NodeWatch: one thread per launcher that does all of its store traffic), and the
// helpers they share with the Supervisor (supervisor.cpp). launch.h documents the behaviour.
#pragma once

#include <c10/util/Exception.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include <ciuic/error.h>

#include "launch/launch.h"

namespace ciuic::launch::detail {

using Clock = std::chrono::steady_clock;

// ---- multi-node: the launchers watch each other ---------------------------------------------
// Keys of the launchers, under "ciuic/launch/" of the run's store (workers see "launch/..."):
//   node/<k>     "<host> pid <pid>" of node k's launcher, set when it has connected
//   alive/<k>    node k's heartbeat counter, incremented every kHeartbeat
//   report/<k>   node k's failure: "<1 when secondary, else 0>\t<message>" (rewritten when this
//                node's choice of the worker to name changes)
//   failed_node, failed   the run's verdict, set by node 0: whose failure stopped the run (-1 for a
//                node lost or missing) and the message
//   done/<k>     node k's launcher has finished
inline constexpr std::chrono::milliseconds kHeartbeat{250};
// A node whose heartbeat counter has not moved for this long is lost (its launcher was killed,
// or its host or the network failed): node 0 stops the run naming it.
inline constexpr std::chrono::milliseconds kLostAfter{5000};
// ... once the run is failing (the workers of a lost node's peers fail within a fraction of a
// second, and the run is stopping anyway): shorter.
inline constexpr std::chrono::milliseconds kLostAfterFailure{2000};
// Node 0 names a failure that looks like a consequence of another (is_secondary_error) only when no
// other report has come within this long of the first one.
inline constexpr std::chrono::milliseconds kSecondaryWait{3000};
// A launcher whose workers' failures so far look like consequences (is_secondary_error) lets the
// others run this long before it stops them, so that the worker with the cause can print it.
inline constexpr std::chrono::milliseconds kSecondaryStopDelay{2000};

std::string seconds_text(Clock::duration d);           // "2.1 s"
std::string host_name();                               // gethostname(), "?" when it fails
std::string c10_first_line(const c10::Error& e);       // what() without c10's backtrace
std::string node_list(const std::vector<int>& nodes);  // "1, 3-5"

// One launcher's view of the other nodes, from its own thread. Threading: the public methods may
// be called from the launcher's main thread while the thread runs; it wakes the main loop through
// wake_fd() when state() changed.
class NodeWatch {
 public:
  struct Verdict {
    int node = -1;  // the node whose failure report was chosen; -1: a node lost or missing
    std::string message;
  };
  struct State {
    std::optional<Verdict> verdict;
    std::string store_error;  // this launcher lost the store ("" = no)
    int pending = 0;          // node 0: nodes that joined and have neither finished nor been lost
    std::vector<std::string> lost;  // node 0: nodes lost after the verdict (for the log)
  };

  // Connects (nodes other than 0: waiting for node 0's store up to the rendezvous timeout) and
  // registers this launcher. Throws Error when the store cannot be reached or the run has already
  // been stopped.
  NodeWatch(const LaunchOptions& o, c10::intrusive_ptr<c10d::Store> store, std::string where);
  ~NodeWatch();

  void start() {
    thread_ = std::thread([this] { run(); });
  }

  // Read end of the pipe that the thread writes a byte to whenever the state changed.
  int wake_fd() const { return wake_[0]; }

  // This node's failure report (the worker it names); replaces the previous one.
  void report(const std::string& message, bool secondary);
  void set_failing();
  State state();
  // "node 0 (host pid 12)": who hosts the store, as known to the other nodes.
  std::string node0();

  // Stops the thread and marks this node finished in the store.
  void finish();

 private:
  static std::string key(const char* prefix, int node) { return prefix + std::to_string(node); }
  static std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
  static std::string text(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

  template <class F>
  void call(F&& f) {
    try {
      f();
    } catch (const c10::Error& e) {
      throw Error(c10_first_line(e));
    }
  }

  void stop();
  void wake();  // the main loop, through wake_fd()
  void run();   // the thread
  void tick();  // one heartbeat: this node's report; node 0 watches, the others read the verdict

  // ---- node 0 ----
  struct Peer {
    bool joined = false;
    std::string who;
    int64_t beat = -1;
    Clock::time_point moved{};
    int still = 0;  // reads since the heartbeat last moved
    bool done = false;
    bool lost = false;
    std::string lost_why;
    std::string report;  // its failure report ("" = none)
    bool secondary = false;
    Clock::time_point report_at{};
    int64_t beat_after_failure = -1;   // its counter at the first read after the first report
    bool alive_after_failure = false;  // it sent a heartbeat after the first report
  };

  std::string name(int k) const;   // "node 1 (host pid 12)"
  void watch_nodes(bool failing);  // node 0: joined, finished, lost, reports; chooses the verdict

  const LaunchOptions& o_;
  c10::intrusive_ptr<c10d::Store> store_;  // used by the thread only once it runs
  std::string where_;
  Clock::time_point start_;
  std::string node0_;        // "<host> pid <pid>" of node 0's launcher (other nodes)
  bool have_node0_ = false;  // (thread only)
  std::vector<Peer> peers_;  // node 0: the other nodes (thread only)
  int wake_[2] = {-1, -1};
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool failing_ = false;
  std::string report_;
  bool report_secondary_ = false;
  bool report_written_ = false;
  std::optional<Clock::time_point> report_at_;
  State state_;
};

}  // namespace ciuic::launch::detail
