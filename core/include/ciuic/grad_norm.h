// ciuic/grad_norm.h — gradient norms for Sharding and Optimizer plugins.
//
// The global gradient norm decides clipping and, through a non-finite value, overflow. Squares are
// summed accurately whatever the length (fp32 within rows of 4096 elements, fp64 across: one fp32
// reduction over a large CPU tensor is off by 1e-5 and more), and across ranks in one all-reduce.
//
// Threading: any thread that may issue collectives on `comm` (see ciuic/comm.h).
// Failure: a Comm timeout propagates from Work::wait().
#pragma once

#include <ATen/core/Tensor.h>

#include <ciuic/export.h>

namespace ciuic {

class Comm;

struct GradNorm {
  double norm = 0.0;  // of the gradient as passed (callers divide by the loss scale)
  bool nonfinite = false;
};

// Sum of squares of `x` as a one-element fp64 tensor on x's device.
CIUIC_API at::Tensor sum_of_squares(const at::Tensor& x);

// Global L2 norm from this rank's sum of squares (a one-element fp64 tensor on any device, e.g.
// accumulated chunk by chunk while backward ran; not modified). `sharded`: each rank holds a
// disjoint part and the squares are summed across ranks in one all_reduce; otherwise every rank
// holds the whole gradient (DDP) and nothing is exchanged.
CIUIC_API GradNorm global_grad_norm_from_squares(const at::Tensor& local_sum_sq, Comm& comm,
                                                 bool sharded);

// The same for a gradient tensor this rank holds.
CIUIC_API GradNorm global_grad_norm(const at::Tensor& local_part, Comm& comm, bool sharded);

}  // namespace ciuic
