// Internal: the comm plugin as the core hands it to the loop and the other slots, with the link
// traffic split by direction counted on the way (the per-rank records' link_sent_bytes_per_s and
// link_received_bytes_per_s, docs/metrics.md).
//
// Plugin API 7's CommCounters has one `bytes` figure (the collectives' input size) and no kind
// of collective, so the core cannot split it after the fact. This wrapper sees every collective
// the core and the plugins issue (they all get the Run's Comm), and adds the ring algorithm's
// bytes sent and received for its kind, size and the world (report::ring_link_bytes). Everything
// else is the plugin's: each call is forwarded unchanged, counters() and append_metrics() are the
// plugin's own. Cost: two additions per collective. Threading: as Comm's (collectives from one
// thread at a time); traffic() from any thread.
#pragma once

#include <atomic>
#include <memory>

#include <ciuic/comm.h>

#include "report/ranks.h"

namespace ciuic::train {

class TrafficComm final : public Comm {
 public:
  explicit TrafficComm(std::shared_ptr<Comm> inner) : inner_(std::move(inner)) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  c10::Device device() const override { return inner_->device(); }
  std::string backend_name() const override { return inner_->backend_name(); }
  std::unique_ptr<Work> all_reduce(at::Tensor& tensor, ReduceOp op) override;
  std::unique_ptr<Work> reduce_scatter(at::Tensor& output, const at::Tensor& input,
                                       ReduceOp op) override;
  std::unique_ptr<Work> all_gather(at::Tensor& output, const at::Tensor& input) override;
  std::unique_ptr<Work> broadcast(at::Tensor& tensor, int root) override;
  void barrier() override { inner_->barrier(); }
  CommCounters counters() const override { return inner_->counters(); }
  void append_metrics(Metrics& out) const override { inner_->append_metrics(out); }

  // Bytes sent and received since creation, as the ring algorithm moves them (cumulative).
  struct Traffic {
    double sent = 0, received = 0;
  };
  Traffic traffic() const { return {sent_.load(), received_.load()}; }

 private:
  void count(report::Collective kind, const at::Tensor& input, int root = 0);
  std::shared_ptr<Comm> inner_;
  std::atomic<double> sent_{0}, received_{0};
};

}  // namespace ciuic::train
