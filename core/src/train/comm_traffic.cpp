// The comm plugin with its traffic split by direction (train/comm_traffic.h).
#include "train/comm_traffic.h"

namespace ciuic::train {

void TrafficComm::count(report::Collective kind, const at::Tensor& input, int root) {
  const double bytes =
      static_cast<double>(input.numel()) * static_cast<double>(input.element_size());
  const report::LinkBytes b =
      report::ring_link_bytes(kind, bytes, inner_->size(), inner_->rank(), root);
  // One issuing thread at a time (Comm's rule): a plain read-modify-write is enough; the atomics
  // make traffic() safe to read from elsewhere.
  sent_.store(sent_.load(std::memory_order_relaxed) + b.sent, std::memory_order_relaxed);
  received_.store(received_.load(std::memory_order_relaxed) + b.received,
                  std::memory_order_relaxed);
}

std::unique_ptr<Work> TrafficComm::all_reduce(at::Tensor& tensor, ReduceOp op) {
  auto w = inner_->all_reduce(
      tensor, op);  // the plugin checks the tensor first: a refused call counts nothing
  count(report::Collective::kAllReduce, tensor);
  return w;
}

std::unique_ptr<Work> TrafficComm::reduce_scatter(at::Tensor& output, const at::Tensor& input,
                                                  ReduceOp op) {
  auto w = inner_->reduce_scatter(output, input, op);
  count(report::Collective::kReduceScatter, input);
  return w;
}

std::unique_ptr<Work> TrafficComm::all_gather(at::Tensor& output, const at::Tensor& input) {
  auto w = inner_->all_gather(output, input);
  count(report::Collective::kAllGather, input);
  return w;
}

std::unique_ptr<Work> TrafficComm::broadcast(at::Tensor& tensor, int root) {
  auto w = inner_->broadcast(tensor, root);
  count(report::Collective::kBroadcast, tensor, root);
  return w;
}

}  // namespace ciuic::train
