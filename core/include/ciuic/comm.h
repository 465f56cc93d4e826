// ciuic/comm.h — the communication backend slot ([comm] plugin = gloo | nccl | ...).
//
// A Comm connects the ranks of one run (created once per process, after the context is
// complete) and runs collectives on tensors of its device() (CPU tensors for gloo, CUDA tensors
// of the rank's device for nccl).
//
// Asynchrony: every collective returns immediately with a Work handle. Until that Work's wait()
// returns, the caller must keep the tensors alive and must neither read the outputs nor write the
// inputs. On CUDA, the collective is ordered after all work already queued on the *current*
// stream when it is called, and wait() makes the *current* stream wait for it (it does not block
// the host) — the same semantics as c10d's NCCL Work. On CPU, wait() blocks until done.
// Collectives must be issued in the same order on every rank.
//
// Threading: collectives are issued from one thread at a time (the training thread or an
// autograd hook on it). rank()/size()/device()/counters() are safe from any thread.
//
// Tensors: contiguous, on device(); dtypes fp32, bf16 and fp16 for every collective, fp64 for
// all_reduce too (the core's losses, label-token counts and gradient norms travel as fp64). Reduce
// ops: SUM is what the core and the kits use (gradients are pre-divided, never averaged); AVG, MAX
// and MIN must be right or throw. What the core and the in-tree kits issue, and what the
// conformance kit checks (ciuic/testing/conformance.h, "comm"): all_reduce SUM in
// fp64/fp32/bf16/fp16, reduce_scatter SUM and all_gather (in place too) in fp32/bf16/fp16,
// broadcast from any root, barrier.
//
// Failure: a peer that does not join a collective within the run's timeout makes wait() throw
// ciuic::Error naming the collective and the timeout; the backend aborts its communicator so the
// process can exit instead of hanging. Operations a backend does not support, and tensors that
// break the rules above (wrong device, dtype, size, not contiguous), throw ciuic::Error naming the
// collective and what was expected — at the call, before anything is sent — e.g.
// ciuic::Error("comm backend <name> does not support <op>").
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <ciuic/plugin.h>

namespace ciuic {

enum class ReduceOp : uint32_t { kSum = 0, kAvg = 1, kMax = 2, kMin = 3 };

// Handle of one asynchronous collective. Owned by the caller; destroying it without wait() is
// allowed (the collective still completes; its tensors must stay alive until then — prefer
// waiting).
class CIUIC_API Work {
 public:
  virtual ~Work();
  virtual void wait() = 0;
  // True when the collective has finished (non-blocking).
  virtual bool is_completed() = 0;
};

// Cumulative counters since creation.
struct CommCounters {
  uint64_t calls = 0;
  uint64_t bytes = 0;         // payload bytes handed to collectives (input size)
  double busy_seconds = 0.0;  // time collectives were running (measured on the comm stream/thread)
};

class CIUIC_API Comm : public PluginObject {
 public:
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual c10::Device device() const = 0;
  virtual std::string backend_name() const = 0;

  // In place on `tensor`: every rank ends with the reduction of all ranks' values.
  virtual std::unique_ptr<Work> all_reduce(at::Tensor& tensor, ReduceOp op) = 0;
  // input: contiguous, numel == size() * output.numel(); rank r receives the reduction of chunk r
  // of every rank's input into `output`.
  virtual std::unique_ptr<Work> reduce_scatter(at::Tensor& output, const at::Tensor& input,
                                               ReduceOp op) = 0;
  // output: contiguous, numel == size() * input.numel(); chunk r of output receives rank r's input.
  // `input` may alias chunk rank() of `output` (in-place all-gather).
  virtual std::unique_ptr<Work> all_gather(at::Tensor& output, const at::Tensor& input) = 0;
  // In place: every rank's `tensor` ends with rank `root`'s values (0 <= root < size()).
  virtual std::unique_ptr<Work> broadcast(at::Tensor& tensor, int root) = 0;
  // Blocks the calling thread until every rank has called barrier() (the run's timeout applies,
  // as for wait()).
  virtual void barrier() = 0;

  // Since creation, for the log's comm_* metrics and the per-rank monitoring; any thread, cheap
  // (a copy of counters the backend updates as collectives complete).
  virtual CommCounters counters() const = 0;
};

}  // namespace ciuic
