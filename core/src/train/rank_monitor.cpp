// This rank's figures at a log step (train/rank_monitor.h).
#include "train/rank_monitor.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include <ciuic/log.h>

#include "train/device_info.h"
#include "train/run.h"

namespace ciuic::train {

namespace {
constexpr double kGiB = 1073741824.0;
}

namespace {
// CIUIC_BUSY_SOURCE=cuda_events leaves NVML out (docs/metrics.md, busy_source): what
// scripts/gpu/nvml_busy.sh sets to check the CUDA-event figure on a host that has NVML.
bool nvml_disabled() {
  const char* v = std::getenv("CIUIC_BUSY_SOURCE");
  return v && std::string(v) == "cuda_events";
}
}  // namespace

RankMonitor::RankMonitor(const Run& run)
    : r_(run),
      busy_(nvml_disabled() ? DeviceBusyMeter() : DeviceBusyMeter(pci_bus_id(run.ctx.device))),
      events_(run.ctx.device),
      traffic_(dynamic_cast<const TrafficComm*>(run.comm.get())) {
  if (run.ctx.device.is_cuda() && !busy_.available())
    log_debug(
        "device busy fraction from CUDA events (busy_source \"cuda_events\"), not NVML: " +
        (nvml_disabled() ? std::string("CIUIC_BUSY_SOURCE=cuda_events") : busy_.why_unavailable()));
}

void RankMonitor::begin() {
  last_counters_ = r_.comm->counters();
  if (traffic_) last_traffic_ = traffic_->traffic();
  last_ = std::chrono::steady_clock::now();
  busy_.busy_since_last();
  events_.busy_since_last();
}

report::RankFigures RankMonitor::sample(const Timings& t) {
  report::RankFigures f;
  const auto now = std::chrono::steady_clock::now();
  const double interval = std::max(std::chrono::duration<double>(now - last_).count(), 1e-9);
  last_ = now;
  f.rank = r_.ctx.rank;
  f.step_s = t.step_s;
  f.data_wait_s = t.steps > 0 ? t.data_wait_s / static_cast<double>(t.steps) : 0.0;
  f.fwd_bwd_s = t.fwd_bwd_s;
  f.optim_s = t.optim_s;
  f.work_s = f.data_wait_s + t.fwd_bwd_s;
  f.optim_step_s = t.optim_step_s;
  // Busy without NVML: the step's wall time less what the loop spent waiting for data and in its
  // collectives (docs/metrics.md, compute_busy).
  const double publish = std::isfinite(t.publish_s) ? t.publish_s : 0.0;
  f.comm_wait_s = t.agree_s + t.norm_s + publish;
  f.compute_s = std::max(0.0, t.fwd_bwd_s + t.optim_s - t.norm_s - publish);
  if (t.step_s > 0) f.compute_busy = std::clamp(f.compute_s / t.step_s, 0.0, 1.0);
  if (r_.ctx.device.is_cuda()) {
    const MemoryStats m = memory_stats(r_.ctx.device);
    f.mem_gib = m.peak_allocated / kGiB;
    f.mem_reserved_gib = m.peak_reserved / kGiB;
    f.mem_now_gib = m.allocated / kGiB;
    f.mem_reserved_now_gib = m.reserved / kGiB;
    // NVML's samples where it has them; else the CUDA events' brackets (an upper bound: the
    // gaps between a step's kernels count); both are read so that each starts a new interval.
    const double nvml = busy_.busy_since_last(), events = events_.busy_since_last();
    using report::BusySource;
    const BusySource source = std::isfinite(nvml)     ? BusySource::kNvml
                              : std::isfinite(events) ? BusySource::kCudaEvents
                                                      : BusySource::kNone;
    f.device_busy = source == BusySource::kNvml ? nvml : events;
    f.busy_source = static_cast<int>(source);
  }
  const CommCounters c = r_.comm->counters();
  f.link_bytes_per_s = static_cast<double>(c.bytes - last_counters_.bytes) / interval;
  f.link_calls_per_s = static_cast<double>(c.calls - last_counters_.calls) / interval;
  f.link_busy = std::clamp((c.busy_seconds - last_counters_.busy_seconds) / interval, 0.0, 1.0);
  f.comm_calls = static_cast<double>(c.calls);
  f.comm_bytes = static_cast<double>(c.bytes);
  last_counters_ = c;
  if (traffic_) {
    const TrafficComm::Traffic now_traffic = traffic_->traffic();
    f.link_sent_bytes_per_s = (now_traffic.sent - last_traffic_.sent) / interval;
    f.link_received_bytes_per_s = (now_traffic.received - last_traffic_.received) / interval;
    last_traffic_ = now_traffic;
  }
  const HostMemory h = host_memory();
  if (h.rss > 0) f.host_rss_gib = h.rss / kGiB;
  f.host_rss_peak_gib = h.peak_rss / kGiB;
  return f;
}

}  // namespace ciuic::train
