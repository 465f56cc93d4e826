// Internal (report/): the live view of a run folder — `ciuic-run --watch RUN_DIR` (docs/metrics.md,
// "Watching a run"). It follows RUN_DIR/metrics.jsonl as the run appends to it (from another
// terminal; on a multi-node run, rank 0's output folder, where every rank's records are) and
// redraws a table of every rank's latest figures — device memory, busy %, link GB/s, step time,
// data wait — under a line with the step, loss, tokens/s and ETA; ranks named as stragglers are
// marked. It reads only the file: it never talks to the run.
//
// The parts are separate for tests: MetricsFollower folds records into a WatchState (no I/O),
// watch_table() draws it, watch() is the loop (file, clock, terminal).
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <ostream>
#include <set>
#include <string>

#include <ciuic/export.h>

#include "report/ranks.h"

namespace ciuic::report {

struct WatchState {
  int64_t records = 0;
  int64_t step = 0,
          max_steps = 0;  // of the last step record (max_steps: 0 when the run did not say)
  double loss = NAN, tokens_per_s = NAN, tokens = NAN, eval_loss = NAN;
  int64_t ranks_step = 0;            // the step of `ranks`
  std::map<int, RankFigures> ranks;  // the latest "rank" records, one per rank
  std::map<int, double> stragglers;  // rank -> how much slower (named and not recovered)
  std::string ended;       // "" while running; "end" or "interrupted" (the last such record)
  double elapsed_s = NAN;  // of the end record
};

// Folds metrics.jsonl text into a WatchState, chunk by chunk as it is read: a line is taken when
// its newline has arrived, so a record half-written is read once complete. Lines that are not
// JSON objects are skipped (the report and --plot name them). A step record after an end record
// (a resumed run) clears `ended`.
class CIUIC_API MetricsFollower {
 public:
  void feed(const std::string& chunk);
  const WatchState& state() const { return state_; }

 private:
  void take(const std::string& line);
  std::string partial_;
  WatchState state_;
};

// The table, plain text (no colours; `width`-independent), ending with a newline. `title`: the
// first line (the run folder).
CIUIC_API std::string watch_table(const WatchState& state, const std::string& title);

struct WatchOptions {
  double interval_s = 2.0;  // between reads of the file
  bool tty = false;         // redraw in place (clear the screen) instead of printing each new table
  double start_wait_s = 60.0;  // how long to wait for a run to appear in the folder
  // Whether the run is still going: 1 yes, 0 no, -1 cannot tell (the run's lock names another
  // host). The caller reads the run folder's lock (checkpoint/run_dir.h).
  std::function<int()> run_alive;
};

// Follows `run_dir` (a run folder holding metrics.jsonl, or the metrics file itself) until the
// run ends, drawing on `out`. Returns 0 when the run ended with its "end" record, 1 when it
// stopped without one (interrupted, or the run's process is gone), and throws UsageError (exit 2)
// when no run appears there within start_wait_s.
CIUIC_API int watch(const std::string& run_dir, std::ostream& out, const WatchOptions& options);

}  // namespace ciuic::report
