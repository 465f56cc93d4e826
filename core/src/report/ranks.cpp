// Per-rank figures and the straggler rule (report/ranks.h).
#include "report/ranks.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

namespace ciuic::report {

namespace {

using json = nlohmann::json;

struct Field {
  const char* key;
  double RankFigures::*member;
};
// The exchange order. Appending is compatible within one run only (all ranks run one binary).
const Field kFields[] = {
    {"rank", &RankFigures::rank},
    {"step_s", &RankFigures::step_s},
    {"data_wait_s", &RankFigures::data_wait_s},
    {"fwd_bwd_s", &RankFigures::fwd_bwd_s},
    {"optim_s", &RankFigures::optim_s},
    {"work_s", &RankFigures::work_s},
    {"mem_gib", &RankFigures::mem_gib},
    {"mem_reserved_gib", &RankFigures::mem_reserved_gib},
    {"mem_now_gib", &RankFigures::mem_now_gib},
    {"mem_reserved_now_gib", &RankFigures::mem_reserved_now_gib},
    {"device_busy", &RankFigures::device_busy},
    {"link_bytes_per_s", &RankFigures::link_bytes_per_s},
    {"link_busy", &RankFigures::link_busy},
    {"link_calls_per_s", &RankFigures::link_calls_per_s},
    {"comm_calls", &RankFigures::comm_calls},
    {"comm_bytes", &RankFigures::comm_bytes},
    {"host_rss_gib", &RankFigures::host_rss_gib},
    {"host_rss_peak_gib", &RankFigures::host_rss_peak_gib},
    {"optim_step_s", &RankFigures::optim_step_s},
    {"compute_s", &RankFigures::compute_s},
    {"comm_wait_s", &RankFigures::comm_wait_s},
    {"compute_busy", &RankFigures::compute_busy},
    {"link_sent_bytes_per_s", &RankFigures::link_sent_bytes_per_s},
    {"link_received_bytes_per_s", &RankFigures::link_received_bytes_per_s},
    {"busy_source", &RankFigures::busy_source},  // a name in the record (record())
};

double RankFigures::*member_of(const std::string& key) {
  for (const Field& f : kFields)
    if (key == f.key) return f.member;
  throw std::logic_error("no rank figure named " + key);
}

// Median of the finite values (NaN when there are none).
double median(std::vector<double> v) {
  v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return !std::isfinite(x); }), v.end());
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

const std::vector<std::string>& rank_figure_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> k;
    for (const Field& f : kFields) k.push_back(f.key);
    return k;
  }();
  return keys;
}

std::vector<double> RankFigures::to_vector() const {
  std::vector<double> v;
  for (const Field& f : kFields) v.push_back(this->*f.member);
  return v;
}

RankFigures RankFigures::from_vector(const double* values) {
  RankFigures r;
  size_t i = 0;
  for (const Field& f : kFields) r.*f.member = values[i++];
  return r;
}

const std::vector<std::string>& straggler_figure_keys() {
  static const std::vector<std::string> keys = {"rank", "work_s", "data_wait_s"};
  return keys;
}

std::vector<double> RankFigures::to_vector(const std::vector<std::string>& keys) const {
  std::vector<double> v;
  for (const std::string& k : keys) v.push_back(this->*member_of(k));
  return v;
}

RankFigures RankFigures::from_vector(const double* values, const std::vector<std::string>& keys) {
  RankFigures r;
  size_t i = 0;
  for (const std::string& k : keys) r.*member_of(k) = values[i++];
  return r;
}

const char* busy_source_name(BusySource s) {
  switch (s) {
    case BusySource::kNvml: return "nvml";
    case BusySource::kCudaEvents: return "cuda_events";
    case BusySource::kNone: break;
  }
  return "none";
}

json RankFigures::record(int64_t step) const {
  json j = {{"event", "rank"}, {"step", step}, {"rank", static_cast<int64_t>(rank)}};
  for (const Field& f : kFields) {
    const double v = this->*f.member;
    if (f.member == &RankFigures::rank || !std::isfinite(v)) continue;
    if (f.member == &RankFigures::busy_source)
      j[f.key] = busy_source_name(static_cast<BusySource>(static_cast<int>(v)));
    else
      j[f.key] = v;
  }
  return j;
}

RankFigures RankFigures::from_record(const json& record) {
  RankFigures r;
  for (const Field& f : kFields)
    if (record.contains(f.key) && record[f.key].is_number())
      r.*f.member = record[f.key].get<double>();
  if (record.contains("busy_source") && record["busy_source"].is_string())
    for (BusySource s : {BusySource::kNone, BusySource::kNvml, BusySource::kCudaEvents})
      if (record["busy_source"] == busy_source_name(s)) r.busy_source = static_cast<int>(s);
  return r;
}

LinkBytes ring_link_bytes(Collective collective, double input_bytes, int world, int rank,
                          int root) {
  if (world < 2) return {};
  const double w = world;
  switch (collective) {
    case Collective::kAllReduce:
      return {2 * (w - 1) / w * input_bytes, 2 * (w - 1) / w * input_bytes};
    case Collective::kReduceScatter: return {(w - 1) / w * input_bytes, (w - 1) / w * input_bytes};
    case Collective::kAllGather: return {(w - 1) * input_bytes, (w - 1) * input_bytes};
    case Collective::kBroadcast: {
      const bool is_root = rank == root, is_last = rank == (root + world - 1) % world;
      return {is_last ? 0.0 : input_bytes, is_root ? 0.0 : input_bytes};
    }
  }
  return {};
}

bool Straggler::data_bound() const {
  const double extra = work_s - median_work_s;
  return extra > 0 && data_wait_s - median_data_wait_s > 0.5 * extra;
}

std::string Straggler::describe() const {
  char b[256];
  std::snprintf(b, sizeof b, "rank %d: %.0f%% slower than the median for %lld steps", rank,
                100.0 * slower, static_cast<long long>(steps));
  std::string s = b;
  if (data_bound()) {
    std::snprintf(b, sizeof b, "; waiting on data %.2g s/step", data_wait_s);
  } else {
    std::snprintf(b, sizeof b, "; forward/backward and data %.2g s/step against %.2g s", work_s,
                  median_work_s);
  }
  return s + b;
}

StragglerDetector::StragglerDetector(StragglerOptions options, int64_t first_step)
    : options_(options), last_step_(first_step - 1) {}

StragglerDetector::Update StragglerDetector::update(int64_t step,
                                                    const std::vector<RankFigures>& ranks) {
  Update u;
  int max_rank = -1;
  for (const RankFigures& f : ranks)
    if (std::isfinite(f.rank)) max_rank = std::max(max_rank, static_cast<int>(f.rank));
  if (static_cast<int>(streaks_.size()) < max_rank + 1)
    streaks_.resize(static_cast<size_t>(max_rank + 1));
  for (const RankFigures& f : ranks) {
    if (!std::isfinite(f.rank) || f.rank < 0) continue;
    Streak& s = streaks_[static_cast<size_t>(f.rank)];
    std::vector<double> work, wait;
    for (const RankFigures& o : ranks)
      if (&o != &f) {
        work.push_back(o.work_s);
        wait.push_back(o.data_wait_s);
      }
    const double med = median(work), med_wait = median(wait);
    const bool slow = options_.margin > 0 && std::isfinite(f.work_s) && std::isfinite(med) &&
                      f.work_s > med * (1.0 + options_.margin) &&
                      f.work_s - med >= options_.min_excess_s;
    if (!slow) {
      if (s.named) u.recovered.push_back(static_cast<int>(f.rank));
      s = Streak{};
      continue;
    }
    if (s.count == 0) s.since = last_step_;
    ++s.count;
    if (s.count < options_.log_steps) continue;
    Straggler g;
    g.rank = static_cast<int>(f.rank);
    g.slower = med > 0 ? (f.work_s - med) / med : INFINITY;
    g.since_step = s.since;
    g.steps = step - s.since;
    g.work_s = f.work_s;
    g.median_work_s = med;
    g.data_wait_s = std::isfinite(f.data_wait_s) ? f.data_wait_s : 0.0;
    g.median_data_wait_s = std::isfinite(med_wait) ? med_wait : 0.0;
    u.now.push_back(g);
    if (!s.named) u.named.push_back(g);
    s.named = true;
  }
  last_step_ = step;
  auto by_rank = [](const Straggler& a, const Straggler& b) { return a.rank < b.rank; };
  std::sort(u.now.begin(), u.now.end(), by_rank);
  std::sort(u.named.begin(), u.named.end(), by_rank);
  std::sort(u.recovered.begin(), u.recovered.end());
  return u;
}

}  // namespace ciuic::report
