// Gradient norms for plugins (ciuic/grad_norm.h).
#include <ciuic/grad_norm.h>

#include <cmath>

#include <ATen/ops/linalg_vector_norm.h>
#include <ATen/ops/zeros.h>

#include <ciuic/comm.h>

namespace ciuic {

at::Tensor sum_of_squares(const at::Tensor& x) {
  // fp32 norms of rows of kRow elements, their squares summed in fp64: one fp32 reduction over a
  // whole shard is off by ~1e-5 relative at 270k elements on a CPU (3.6e-5 at 800k), 64k-element
  // rows by 2e-6, 4k-element rows by ~1e-7.
  constexpr int64_t kRow = 1 << 12;
  const at::Tensor flat = x.reshape({-1});
  const int64_t n = flat.numel(), rows = n / kRow;
  at::Tensor sq = at::zeros({1}, flat.options().dtype(at::kDouble));
  if (rows > 0)
    sq += at::linalg_vector_norm(flat.narrow(0, 0, rows * kRow).view({rows, kRow}), 2, {1}, false,
                                 at::kFloat)
              .to(at::kDouble)
              .square()
              .sum();
  if (n > rows * kRow)
    sq += at::linalg_vector_norm(flat.narrow(0, rows * kRow, n - rows * kRow), 2, c10::nullopt,
                                 false, at::kFloat)
              .to(at::kDouble)
              .square();
  return sq;
}

GradNorm global_grad_norm(const at::Tensor& local_part, Comm& comm, bool sharded) {
  return global_grad_norm_from_squares(sum_of_squares(local_part), comm, sharded);
}

GradNorm global_grad_norm_from_squares(const at::Tensor& local_sum_sq, Comm& comm, bool sharded) {
  at::Tensor buf = local_sum_sq.reshape({1}).to(comm.device(), at::kDouble, /*non_blocking=*/false,
                                                /*copy=*/true);
  if (sharded && comm.size() > 1) comm.all_reduce(buf, ReduceOp::kSum)->wait();
  const double total = buf.cpu().item<double>();
  GradNorm r;
  r.nonfinite = !std::isfinite(total);
  r.norm = r.nonfinite ? total : std::sqrt(total);
  return r;
}

}  // namespace ciuic
