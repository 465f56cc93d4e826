// Internal (report/): one rank's figures at a log step — the "rank" records of metrics.jsonl
// (docs/metrics.md, "Per-rank records") — and the straggler rule that reads them.
//
// The trainer fills a RankFigures on every rank at a logged step (train/rank_monitor.h), the
// ranks exchange them in the step's one all-reduce (train/report.cpp), and rank 0 writes one
// record per rank and feeds StragglerDetector. Nothing here talks to a device or a peer: the
// rules are plain arithmetic, tested on their own (tests/report/ranks_test.cpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <ciuic/export.h>

namespace ciuic::report {

// One rank's figures. NaN = not measured on this rank (left out of its record): device figures on
// a CPU run, the busy fraction without NVML, a plugin figure its optimizer does not report.
struct CIUIC_API RankFigures {
  double rank = NAN;
  double step_s = NAN;  // wall time of the last step
  double data_wait_s =
      NAN;  // training thread waiting in DataSource::next, mean per step of the interval
  double fwd_bwd_s = NAN;  // last step: forward + backward of its micro-batches
  double optim_s = NAN;    // last step: the optimizer step (reductions left, norm, update, publish)
  double work_s =
      NAN;  // data_wait_s + fwd_bwd_s: the rank's own part, before it waits for the others
  double mem_gib = NAN;  // device: peak allocated since the run began (CUDA caching allocator)
  double mem_reserved_gib = NAN;      // device: peak reserved
  double mem_now_gib = NAN;           // device: allocated now
  double mem_reserved_now_gib = NAN;  // device: reserved now
  double device_busy = NAN;  // fraction of the interval the device ran a kernel (NVML), 0..1
  double link_bytes_per_s =
      NAN;  // payload handed to the comm plugin's collectives per second (Comm::counters)
  double link_busy = NAN;  // fraction of the interval collectives were running (Comm::counters)
  double link_calls_per_s = NAN;  // collectives issued per second
  double comm_calls = NAN;    // the comm plugin's counters when sampled (cumulative; the log step's
  double comm_bytes = NAN;    //   own exchange of these figures comes after)
  double host_rss_gib = NAN;  // host resident set now
  double host_rss_peak_gib = NAN;  // host resident set, peak
  double optim_step_s =
      NAN;  // the optimizer plugin's own host time of its last step (optim_step_s)
  // Where the last step's wall time went, from the loop's own timers (no NVML needed; CPU runs
  // too):
  double compute_s =
      NAN;  // forward/backward + the optimizer step, less comm_wait_s's parts inside them
  double comm_wait_s =
      NAN;  // waiting in the loop's collectives: the label-count agreement, finishing the
            //   reductions + the norm's all-reduce (step_norm_s), the publish (step_publish_s)
  double compute_busy = NAN;  // compute_s / step_s, 0..1
  // Link traffic split by direction, per second over the interval: derived by the core from each
  // collective's kind, size and the world size (report/link_traffic.h), not measured by the plugin.
  double link_sent_bytes_per_s = NAN;
  double link_received_bytes_per_s = NAN;
  // Where device_busy came from (BusySource, as a double to travel in the exchange): written to
  // the record as "busy_source": "nvml" | "cuda_events" | "none"; NaN (CPU runs): left out.
  double busy_source = NAN;

  // The figures in a fixed order, for the exchange between ranks (kFields names them).
  std::vector<double> to_vector() const;
  static RankFigures from_vector(const double* values);
  // Only the figures named by `keys` (of rank_figure_keys()), in that order: a smaller exchange.
  // from_vector(values, keys) leaves the others NaN. An unknown key is a std::logic_error.
  std::vector<double> to_vector(const std::vector<std::string>& keys) const;
  static RankFigures from_vector(const double* values, const std::vector<std::string>& keys);
  // {"event": "rank", "step": step, "rank": N, ...}: the measured figures only.
  nlohmann::json record(int64_t step) const;
  // Reads a record written by record(); keys it lacks stay NaN.
  static RankFigures from_record(const nlohmann::json& record);
};

// The sources of device_busy (RankFigures::busy_source).
enum class BusySource : int { kNone = 0, kNvml = 1, kCudaEvents = 2 };
CIUIC_API const char* busy_source_name(BusySource s);  // "none", "nvml", "cuda_events"

// The record keys of RankFigures, in to_vector() order.
CIUIC_API const std::vector<std::string>& rank_figure_keys();
// What the straggler rule reads (rank, work_s, data_wait_s): all the ranks exchange when
// [log] rank_records = false.
CIUIC_API const std::vector<std::string>& straggler_figure_keys();

// Link traffic of one collective on one rank as a ring moves it — the factors nccl-tests uses for
// its bus bandwidth (docs/metrics.md, "Link traffic: sent and received"). `input_bytes` is the
// collective's input, as CommCounters::bytes counts it; W = world:
//   all-reduce      sent = received = 2(W-1)/W x input
//   reduce-scatter  sent = received = (W-1)/W x input   (input = W x output)
//   all-gather      sent = received = (W-1) x input     (output = W x input)
//   broadcast       a chain from the root in rank order: the root sends the tensor, the rank
//                   before it (root - 1 mod W) only receives it, every other rank both
// One rank (W = 1) moves nothing. These are the algorithm's bytes, not a measurement: a backend
// that picks a tree or a direct exchange moves other amounts (the API-8 proposal in
// docs/architecture.md lets the backend say).
enum class Collective { kAllReduce, kReduceScatter, kAllGather, kBroadcast };
struct LinkBytes {
  double sent = 0, received = 0;
};
CIUIC_API LinkBytes ring_link_bytes(Collective collective, double input_bytes, int world, int rank,
                                    int root = 0);

// [log] straggler_margin, straggler_log_steps (docs/recipe.md).
struct StragglerOptions {
  double margin =
      0.2;  // a rank is slow when its work_s exceeds the others' median by this fraction; 0 = off
  int64_t log_steps = 3;        // for this many log steps in a row
  double min_excess_s = 0.002;  // and by at least this many seconds a step (steps of microseconds
                                // jitter by more than 20%)
};

// A rank named as a straggler.
struct CIUIC_API Straggler {
  int rank = 0;
  double slower = 0;       // (work_s - median of the others) / median of the others
  int64_t since_step = 0;  // the last log step before it became slow
  int64_t steps = 0;       // optimizer steps it has been slow for
  double work_s = 0, median_work_s = 0;
  double data_wait_s = 0, median_data_wait_s = 0;
  bool data_bound() const;  // its extra time is mostly waiting for data
  // "rank 2: 31% slower than the median for 20 steps; waiting on data 0.4 s/step"
  std::string describe() const;
};

// Feeds on every log step's figures of all ranks (rank 0). Not thread-safe.
class CIUIC_API StragglerDetector {
 public:
  StragglerDetector(StragglerOptions options, int64_t first_step);
  struct Update {
    std::vector<Straggler> now;    // every rank slow for at least log_steps log steps
    std::vector<Straggler> named;  // of those, the ones that became stragglers at this step
    std::vector<int> recovered;    // stragglers that are no longer slow
  };
  // `ranks` has one entry per rank (any order; RankFigures::rank says which); a rank without
  // work_s counts as not slow.
  Update update(int64_t step, const std::vector<RankFigures>& ranks);

 private:
  struct Streak {
    int64_t count = 0, since = 0;
    bool named = false;
  };
  StragglerOptions options_;
  int64_t last_step_;
  std::vector<Streak> streaks_;
};

}  // namespace ciuic::report
