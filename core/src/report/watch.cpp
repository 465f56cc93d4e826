// The live view of a run folder (report/watch.h).
#include "report/watch.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include <ciuic/error.h>
#include <ciuic/json.h>

#include "report/progress.h"

namespace ciuic::report {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

double number(const json& r, const char* key) {
  return r.contains(key) && r[key].is_number() ? r[key].get<double>() : NAN;
}

std::string fixed(double v, int decimals, int width) {
  char b[64];
  if (!std::isfinite(v))
    std::snprintf(b, sizeof b, "%*s", width, "-");
  else
    std::snprintf(b, sizeof b, "%*.*f", width, decimals, v);
  return b;
}

std::string percent(double fraction, int width) {
  char b[64];
  if (!std::isfinite(fraction))
    std::snprintf(b, sizeof b, "%*s", width, "-");
  else
    std::snprintf(b, sizeof b, "%*.0f%%", width - 1, 100.0 * fraction);
  return b;
}

}  // namespace

void MetricsFollower::feed(const std::string& chunk) {
  partial_ += chunk;
  size_t start = 0;
  for (size_t nl; (nl = partial_.find('\n', start)) != std::string::npos; start = nl + 1)
    take(partial_.substr(start, nl - start));
  partial_.erase(0, start);
}

void MetricsFollower::take(const std::string& line) {
  if (line.find_first_not_of(" \t\r") == std::string::npos) return;
  const json r = json_depth_problem(line).empty() ? json::parse(line, nullptr, false) : json();
  if (!r.is_object()) return;
  ++state_.records;
  WatchState& s = state_;
  const std::string event =
      r.contains("event") && r["event"].is_string() ? r["event"].get<std::string>() : "";
  const bool has_step = r.contains("step") && r["step"].is_number_integer();
  if (event.empty() && has_step) {
    s.step = r["step"].get<int64_t>();
    if (r.contains("max_steps") && r["max_steps"].is_number_integer())
      s.max_steps = r["max_steps"].get<int64_t>();
    s.loss = number(r, "loss");
    s.tokens_per_s = number(r, "tokens_per_s");
    s.tokens = number(r, "tokens");
    s.ended.clear();
  } else if (event == "rank" && has_step && r.contains("rank") && r["rank"].is_number_integer()) {
    const int64_t step = r["step"].get<int64_t>();
    if (step != s.ranks_step) {  // a new log step: ranks that did not report again are gone (an
                                 // elastic restart)
      s.ranks.clear();
      s.ranks_step = step;
    }
    s.ranks[static_cast<int>(r["rank"].get<int64_t>())] = RankFigures::from_record(r);
  } else if (event == "straggler" && r.contains("rank") && r["rank"].is_number_integer()) {
    s.stragglers[static_cast<int>(r["rank"].get<int64_t>())] = number(r, "slower");
  } else if (event == "straggler_recovered" && r.contains("rank") &&
             r["rank"].is_number_integer()) {
    s.stragglers.erase(static_cast<int>(r["rank"].get<int64_t>()));
  } else if (event == "eval") {
    s.eval_loss = number(r, "eval_loss");
  } else if (event == "end" || event == "interrupted") {
    s.ended = event;
    s.elapsed_s = number(r, "elapsed_s");
    s.stragglers.clear();
  }
}

std::string watch_table(const WatchState& s, const std::string& title) {
  std::ostringstream o;
  o << title << "\n";
  if (s.step == 0) {
    o << (s.records == 0 ? "waiting for the first log step...\n" : "starting...\n");
    return o.str();
  }
  char b[256];
  std::snprintf(b, sizeof b, "step %lld", static_cast<long long>(s.step));
  o << b;
  if (s.max_steps > 0)
    o << "/" << s.max_steps << " ("
      << static_cast<int>(100.0 * static_cast<double>(s.step) / static_cast<double>(s.max_steps))
      << "%)";
  if (std::isfinite(s.loss)) {
    std::snprintf(b, sizeof b, " | loss %.4f", s.loss);
    o << b;
  }
  if (std::isfinite(s.eval_loss)) {
    std::snprintf(b, sizeof b, " | eval %.4f", s.eval_loss);
    o << b;
  }
  if (std::isfinite(s.tokens_per_s)) o << " | " << human_count(s.tokens_per_s) << " tok/s";
  if (!s.ended.empty()) {
    o << " | " << (s.ended == "end" ? "ended" : "interrupted");
    if (std::isfinite(s.elapsed_s)) o << " after " << human_duration(s.elapsed_s);
  } else if (s.max_steps > 0 && std::isfinite(s.tokens_per_s) && s.tokens_per_s > 0 &&
             std::isfinite(s.tokens)) {
    // tokens / step is the global batch (a resume at another world size changes it; then this is
    // an estimate until the next record)
    const double eta = static_cast<double>(s.max_steps - s.step) *
                       (s.tokens / static_cast<double>(s.step)) / s.tokens_per_s;
    o << " | ETA " << human_duration(eta);
  }
  o << "\n";
  if (s.ranks.empty()) return o.str();
  // busy: the device (NVML); comp: the step's wall time outside data and collectives (loop timers)
  o << "rank  mem GiB  resv GiB  busy  comp  link GB/s  sent GB/s  recv GB/s  link busy  step s  "
       "work s  data s  host GiB\n";
  for (const auto& [rank, f] : s.ranks) {
    std::snprintf(b, sizeof b, "%4d", rank);
    o << b << " " << fixed(f.mem_gib, 2, 8) << " " << fixed(f.mem_reserved_gib, 2, 9) << " "
      << percent(f.device_busy, 5) << " " << percent(f.compute_busy, 5) << " "
      << fixed(f.link_bytes_per_s / 1e9, 3, 10) << " " << fixed(f.link_sent_bytes_per_s / 1e9, 3, 9)
      << " " << fixed(f.link_received_bytes_per_s / 1e9, 3, 9) << " " << percent(f.link_busy, 10)
      << " " << fixed(f.step_s, 3, 7) << " " << fixed(f.work_s, 3, 7) << " "
      << fixed(f.data_wait_s, 3, 7) << " " << fixed(f.host_rss_gib, 2, 9);
    if (const auto g = s.stragglers.find(rank); g != s.stragglers.end())
      o << "  slow"
        << (std::isfinite(g->second)
                ? " +" + std::to_string(static_cast<int>(std::lround(100 * g->second))) + "%"
                : "");
    o << "\n";
  }
  return o.str();
}

int watch(const std::string& run_dir, std::ostream& out, const WatchOptions& opt) {
  std::error_code ec;
  fs::path metrics = run_dir;
  if (fs::is_directory(metrics, ec) || !fs::exists(metrics, ec)) metrics /= "metrics.jsonl";
  const std::string title = "ciuic-run --watch " + run_dir;
  const auto alive = [&] { return opt.run_alive ? opt.run_alive() : -1; };
  const auto started = std::chrono::steady_clock::now();
  MetricsFollower follower;
  std::ifstream in;
  std::string last_drawn;
  const auto poll = [&] {  // reads what was appended since the last poll
    if (!in.is_open()) {
      in.open(metrics, std::ios::binary);
      if (!in.is_open()) return;
    }
    in.clear();
    std::string chunk(1 << 16, '\0');
    for (;;) {
      in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
      const std::streamsize n = in.gcount();
      if (n <= 0) break;
      follower.feed(chunk.substr(0, static_cast<size_t>(n)));
    }
  };
  const auto draw = [&] {  // when something changed: in place on a terminal, else a new block
    const std::string table = watch_table(follower.state(), title);
    if (table == last_drawn) return;
    out << (opt.tty ? "\033[H\033[2J" + table : table + "\n") << std::flush;
    last_drawn = table;
  };
  for (;;) {
    const int running = alive();
    poll();
    const WatchState& s = follower.state();
    const bool have_file = in.is_open();
    if (!have_file && running != 1) {
      const double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      if (waited >= opt.start_wait_s)
        throw UsageError("--watch " + run_dir + ": no run there (no " +
                         metrics.filename().string() + " and no run holds the folder after " +
                         std::to_string(static_cast<int>(opt.start_wait_s)) +
                         " s; give the run's [run] output_dir)");
    } else {
      draw();
      if (!s.ended.empty() && running != 1) return s.ended == "end" ? 0 : 1;
      if (s.ended.empty() && running == 0) {
        poll();  // what the run wrote just before it went
        if (follower.state().ended.empty()) {
          draw();
          out << "the run stopped without an end record (see its log)\n" << std::flush;
          return 1;
        }
        draw();
        return follower.state().ended == "end" ? 0 : 1;
      }
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(opt.interval_s));
  }
}

}  // namespace ciuic::report
