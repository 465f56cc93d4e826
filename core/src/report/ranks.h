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
  double step_s = NAN;              // wall time of the last step
  double data_wait_s = NAN;         // training thread waiting in DataSource::next, mean per step of the interval
  double fwd_bwd_s = NAN;           // last step: forward + backward of its micro-batches
  double optim_s = NAN;             // last step: the optimizer step (reductions left, norm, update, publish)
  double work_s = NAN;              // data_wait_s + fwd_bwd_s: the rank's own part, before it waits for the others
  double mem_gib = NAN;             // device: peak allocated since the run began (CUDA caching allocator)
  double mem_reserved_gib = NAN;    // device: peak reserved
  double mem_now_gib = NAN;         // device: allocated now
  double mem_reserved_now_gib = NAN;  // device: reserved now
  double device_busy = NAN;         // fraction of the interval the device ran a kernel (NVML), 0..1
  double link_bytes_per_s = NAN;    // payload handed to the comm plugin's collectives per second (Comm::counters)
  double link_busy = NAN;           // fraction of the interval collectives were running (Comm::counters)
  double link_calls_per_s = NAN;    // collectives issued per second
  double comm_calls = NAN;          // the comm plugin's counters when sampled (cumulative; the log step's
  double comm_bytes = NAN;          //   own exchange of these figures comes after)
  double host_rss_gib = NAN;        // host resident set now
  double host_rss_peak_gib = NAN;   // host resident set, peak
  double optim_step_s = NAN;        // the optimizer plugin's own host time of its last step (optim_step_s)

  // The figures in a fixed order, for the exchange between ranks (kFields names them).
  std::vector<double> to_vector() const;
  static RankFigures from_vector(const double* values);
  // {"event": "rank", "step": step, "rank": N, ...}: the measured figures only.
  nlohmann::json record(int64_t step) const;
  // Reads a record written by record(); keys it lacks stay NaN.
  static RankFigures from_record(const nlohmann::json& record);
};

// The record keys of RankFigures, in to_vector() order.
CIUIC_API const std::vector<std::string>& rank_figure_keys();

// [log] straggler_margin, straggler_log_steps (docs/recipe.md).
struct StragglerOptions {
  double margin = 0.2;       // a rank is slow when its work_s exceeds the others' median by this fraction; 0 = off
  int64_t log_steps = 3;     // for this many log steps in a row
  double min_excess_s = 0.002;  // and by at least this many seconds a step (steps of microseconds jitter by more than 20%)
};

// A rank named as a straggler.
struct CIUIC_API Straggler {
  int rank = 0;
  double slower = 0;          // (work_s - median of the others) / median of the others
  int64_t since_step = 0;     // the last log step before it became slow
  int64_t steps = 0;          // optimizer steps it has been slow for
  double work_s = 0, median_work_s = 0;
  double data_wait_s = 0, median_data_wait_s = 0;
  bool data_bound() const;    // its extra time is mostly waiting for data
  // "rank 2: 31% slower than the median for 20 steps; waiting on data 0.4 s/step"
  std::string describe() const;
};

// Feeds on every log step's figures of all ranks (rank 0). Not thread-safe.
class CIUIC_API StragglerDetector {
 public:
  StragglerDetector(StragglerOptions options, int64_t first_step);
  struct Update {
    std::vector<Straggler> now;        // every rank slow for at least log_steps log steps
    std::vector<Straggler> named;      // of those, the ones that became stragglers at this step
    std::vector<int> recovered;        // stragglers that are no longer slow
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
