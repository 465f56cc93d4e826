// Autograd wrappers of the model's fused CUDA kernels (model/fused_ops.h). Without CUDA
// (CIUIC_FUSED_KERNELS undefined) only the availability checks and their errors exist.
#include "model/fused_ops.h"

#include <string>

#include <ciuic/error.h>

#ifdef CIUIC_FUSED_KERNELS
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/sum.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/autograd/custom_function.h>

#include "model/cuda/fused_kernels.h"
#endif

namespace ciuic::model {

bool fused_kernels_built() {
#ifdef CIUIC_FUSED_KERNELS
  return true;
#else
  return false;
#endif
}

bool fused_kernels_supported(at::ScalarType dtype, c10::Device device) {
  return fused_kernels_built() && device.is_cuda() &&
         (dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf);
}

namespace {
void check_supported(const at::Tensor& t, const char* who) {
  if (!t.defined() || !fused_kernels_supported(t.scalar_type(), t.device()))
    throw Error(
        std::string(who) +
        ": the fused kernels need a CUDA build and a CUDA tensor in fp32, bf16 or fp16 (got " +
        (t.defined() ? std::string(c10::toString(t.scalar_type())) + " on " + t.device().str()
                     : std::string("an undefined tensor")) +
        (fused_kernels_built() ? "" : "; this build has no CUDA") + ")");
}
}  // namespace

#ifdef CIUIC_FUSED_KERNELS
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

cuda::DType kernel_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return cuda::DType::kFloat;
    case at::kBFloat16: return cuda::DType::kBFloat16;
    case at::kHalf: return cuda::DType::kHalf;
    default: throw Error(std::string("fused kernels: unsupported dtype ") + c10::toString(t));
  }
}

void check_launch(const char* err, const char* who) {
  if (err) throw Error(std::string(who) + ": CUDA kernel launch failed: " + err);
}

cudaStream_t stream_of(const at::Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}

// x [B, T, H, D], any strides with the last dimension contiguous (otherwise copied): the
// gradient arriving from attention is a transposed view.
at::Tensor rope_apply(const at::Tensor& x_in, const at::Tensor& cos, const at::Tensor& sin,
                      bool backward) {
  at::Tensor x = x_in.stride(3) == 1 ? x_in : x_in.contiguous();
  at::Tensor out = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  const int64_t strides[3] = {x.stride(0), x.stride(1), x.stride(2)};
  const c10::cuda::CUDAGuard guard(x.device());
  check_launch(cuda::rope(x.data_ptr(), cos.data_ptr(), sin.data_ptr(), out.data_ptr(), x.size(0),
                          x.size(1), x.size(2), x.size(3) / 2, strides, backward,
                          kernel_dtype(x.scalar_type()), stream_of(x)),
               "fused_rope");
  return out;
}

struct FusedRope : public torch::autograd::Function<FusedRope> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos,
                            const at::Tensor& sin) {
    ctx->save_for_backward({cos, sin});  // the batch's tables: no new memory
    return rope_apply(x, cos, sin, /*backward=*/false);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const variable_list saved = ctx->get_saved_variables();
    return {rope_apply(grad_out[0], saved[0], saved[1], /*backward=*/true), at::Tensor(),
            at::Tensor()};
  }
};

cuda::Glu glu_of(Activation act) {
  return act == Activation::kGeluTanh ? cuda::Glu::kGeluTanh : cuda::Glu::kSilu;
}

struct FusedGlu : public torch::autograd::Function<FusedGlu> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up,
                            int64_t act) {
    ctx->save_for_backward({gate, up});
    ctx->saved_data["act"] = act;
    at::Tensor out = at::empty_like(gate, at::MemoryFormat::Contiguous);
    const c10::cuda::CUDAGuard guard(gate.device());
    check_launch(cuda::glu_forward(gate.data_ptr(), up.data_ptr(), out.data_ptr(), gate.numel(),
                                   static_cast<cuda::Glu>(act), kernel_dtype(gate.scalar_type()),
                                   stream_of(gate)),
                 "fused_glu");
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& gate = saved[0];
    const at::Tensor& up = saved[1];
    const at::Tensor dy = grad_out[0].contiguous();
    at::Tensor d_gate = at::empty_like(gate, at::MemoryFormat::Contiguous);
    at::Tensor d_up = at::empty_like(up, at::MemoryFormat::Contiguous);
    const c10::cuda::CUDAGuard guard(gate.device());
    const auto act = static_cast<cuda::Glu>(ctx->saved_data["act"].toInt());
    check_launch(cuda::glu_backward(gate.data_ptr(), up.data_ptr(), dy.data_ptr(),
                                    d_gate.data_ptr(), d_up.data_ptr(), gate.numel(), act,
                                    kernel_dtype(gate.scalar_type()), stream_of(gate)),
                 "fused_glu backward");
    return {d_gate, d_up, at::Tensor()};
  }
};

// The MLP's tail, act(gate) * up @ w_down^T, keeping only gate and up (and the weight): the
// gated output [N, I] is recomputed in the backward (one elementwise kernel) instead of being
// held from forward to backward.
struct FusedGluDown : public torch::autograd::Function<FusedGluDown> {
  static at::Tensor glu(const at::Tensor& gate, const at::Tensor& up, cuda::Glu act) {
    at::Tensor out = at::empty_like(gate, at::MemoryFormat::Contiguous);
    check_launch(cuda::glu_forward(gate.data_ptr(), up.data_ptr(), out.data_ptr(), gate.numel(),
                                   act, kernel_dtype(gate.scalar_type()), stream_of(gate)),
                 "fused_glu_down");
    return out;
  }
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up,
                            const at::Tensor& w_down, int64_t act) {
    ctx->save_for_backward({gate, up, w_down});
    ctx->saved_data["act"] = act;
    const c10::cuda::CUDAGuard guard(gate.device());
    return at::linear(glu(gate, up, static_cast<cuda::Glu>(act)), w_down);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& gate = saved[0];
    const at::Tensor& up = saved[1];
    const at::Tensor& w = saved[2];
    const auto act = static_cast<cuda::Glu>(ctx->saved_data["act"].toInt());
    const int64_t inter = gate.size(-1), hidden = w.size(0);
    const c10::cuda::CUDAGuard guard(gate.device());
    const at::Tensor dy = grad_out[0].reshape({-1, hidden});
    variable_list result(4);
    if (ctx->needs_input_grad(2)) result[2] = at::mm(dy.t(), glu(gate, up, act).view({-1, inter}));
    if (ctx->needs_input_grad(0) || ctx->needs_input_grad(1)) {
      const at::Tensor d_act = at::mm(dy, w).view(gate.sizes());
      at::Tensor d_gate = at::empty_like(gate, at::MemoryFormat::Contiguous);
      at::Tensor d_up = at::empty_like(up, at::MemoryFormat::Contiguous);
      check_launch(cuda::glu_backward(gate.data_ptr(), up.data_ptr(), d_act.data_ptr(),
                                      d_gate.data_ptr(), d_up.data_ptr(), gate.numel(), act,
                                      kernel_dtype(gate.scalar_type()), stream_of(gate)),
                   "fused_glu_down backward");
      result[0] = d_gate;
      result[1] = d_up;
    }
    return result;
  }
};

// d_w from the kernels' fp32 partial sums [blocks, D], in w's dtype.
at::Tensor weight_grad(const at::Tensor& parts, const at::Tensor& w) {
  return parts.sum(0).to(w.scalar_type());
}

struct FusedRmsNorm : public torch::autograd::Function<FusedRmsNorm> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            double eps, bool gemma) {
    ctx->save_for_backward({x, w});
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["gemma"] = gemma;
    at::Tensor y = at::empty_like(x, at::MemoryFormat::Contiguous);
    const int64_t d = x.size(-1);
    const c10::cuda::CUDAGuard guard(x.device());
    check_launch(cuda::rms_norm_forward(x.data_ptr(), w.data_ptr(), y.data_ptr(), x.numel() / d, d,
                                        static_cast<float>(eps), gemma,
                                        kernel_dtype(x.scalar_type()), stream_of(x)),
                 "fused_rms_norm");
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& w = saved[1];
    const at::Tensor g = grad_out[0].contiguous();
    const int64_t d = x.size(-1), rows = x.numel() / d;
    at::Tensor dx = at::empty_like(x, at::MemoryFormat::Contiguous);
    at::Tensor parts;
    if (ctx->needs_input_grad(1))
      parts = at::empty({cuda::rms_norm_backward_blocks(rows), d}, x.options().dtype(at::kFloat));
    const c10::cuda::CUDAGuard guard(x.device());
    check_launch(cuda::rms_norm_backward(x.data_ptr(), w.data_ptr(), g.data_ptr(), dx.data_ptr(),
                                         parts.defined() ? parts.data_ptr<float>() : nullptr, rows,
                                         d, static_cast<float>(ctx->saved_data["eps"].toDouble()),
                                         ctx->saved_data["gemma"].toBool(),
                                         kernel_dtype(x.scalar_type()), stream_of(x)),
                 "fused_rms_norm backward");
    return {dx, parts.defined() ? weight_grad(parts, w) : at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// x [B, T, H, D] with the last dimension contiguous (the projection's view; a gradient arriving
// from attention is a transposed view).
struct FusedQkNormRope : public torch::autograd::Function<FusedQkNormRope> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            const at::Tensor& cos, const at::Tensor& sin, double eps, bool gemma) {
    // x and references: the composition keeps x (in fp32 on the CPU) and the normed output too.
    ctx->save_for_backward({x, w, cos, sin});
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["gemma"] = gemma;
    at::Tensor out = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
    const int64_t strides[3] = {x.stride(0), x.stride(1), x.stride(2)};
    const c10::cuda::CUDAGuard guard(x.device());
    check_launch(cuda::qk_norm_rope_forward(
                     x.data_ptr(), w.data_ptr(), cos.data_ptr(), sin.data_ptr(), out.data_ptr(),
                     x.size(0), x.size(1), x.size(2), x.size(3) / 2, strides,
                     static_cast<float>(eps), gemma, kernel_dtype(x.scalar_type()), stream_of(x)),
                 "fused_qk_norm_rope");
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& w = saved[1];
    const at::Tensor g = grad_out[0].stride(3) == 1 ? grad_out[0] : grad_out[0].contiguous();
    const int64_t rows = x.size(0) * x.size(1) * x.size(2), d = x.size(3);
    at::Tensor dx = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
    at::Tensor parts;
    if (ctx->needs_input_grad(1))
      parts =
          at::empty({cuda::qk_norm_rope_backward_blocks(rows), d}, x.options().dtype(at::kFloat));
    const int64_t xs[3] = {x.stride(0), x.stride(1), x.stride(2)};
    const int64_t gs[3] = {g.stride(0), g.stride(1), g.stride(2)};
    const c10::cuda::CUDAGuard guard(x.device());
    check_launch(cuda::qk_norm_rope_backward(x.data_ptr(), w.data_ptr(), saved[2].data_ptr(),
                                             saved[3].data_ptr(), g.data_ptr(), dx.data_ptr(),
                                             parts.defined() ? parts.data_ptr<float>() : nullptr,
                                             x.size(0), x.size(1), x.size(2), d / 2, xs, gs,
                                             static_cast<float>(ctx->saved_data["eps"].toDouble()),
                                             ctx->saved_data["gemma"].toBool(),
                                             kernel_dtype(x.scalar_type()), stream_of(x)),
                 "fused_qk_norm_rope backward");
    return {dx,           parts.defined() ? weight_grad(parts, w) : at::Tensor(),
            at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

}  // namespace
#endif

at::Tensor fused_rms_norm(const at::Tensor& x, const at::Tensor& w, double eps, bool gemma) {
  check_supported(x, "fused_rms_norm");
  if (x.dim() < 1 || !w.defined() || w.dim() != 1 || w.size(0) != x.size(-1) ||
      w.scalar_type() != x.scalar_type() || w.device() != x.device())
    throw Error("fused_rms_norm: the weight must be [" + std::to_string(x.dim() ? x.size(-1) : 0) +
                "] in x's dtype, on its device");
#ifdef CIUIC_FUSED_KERNELS
  return FusedRmsNorm::apply(x.contiguous(), w.contiguous(), eps, gemma);
#else
  (void)eps;
  (void)gemma;
  return at::Tensor();
#endif
}

at::Tensor fused_qk_norm_rope(const at::Tensor& x, const at::Tensor& w, const RopeTables& rope,
                              double eps, bool gemma) {
  check_supported(x, "fused_qk_norm_rope");
  if (x.dim() != 4 || x.size(3) % 2 != 0 || x.size(3) > 512)
    throw Error("fused_qk_norm_rope: x must be [B, T, heads, D] with an even D <= 512");
  const int64_t rows = x.size(0) * x.size(1), d = x.size(3);
  if (!w.defined() || w.dim() != 1 || w.size(0) != d || w.scalar_type() != x.scalar_type() ||
      w.device() != x.device())
    throw Error("fused_qk_norm_rope: the weight must be [" + std::to_string(d) +
                "] in x's dtype, on its device");
  if (!rope.cos.defined() || rope.cos.numel() != rows * d || rope.sin_signed.numel() != rows * d ||
      rope.cos.scalar_type() != x.scalar_type() ||
      rope.sin_signed.scalar_type() != x.scalar_type() || rope.cos.device() != x.device())
    throw Error(
        "fused_qk_norm_rope: the rotary tables must be [B, T, 1, D] for x's B, T, D, in x's dtype "
        "and on its device");
#ifdef CIUIC_FUSED_KERNELS
  return FusedQkNormRope::apply(x.stride(3) == 1 ? x : x.contiguous(), w.contiguous(),
                                rope.cos.contiguous(), rope.sin_signed.contiguous(), eps, gemma);
#else
  (void)eps;
  (void)gemma;
  return at::Tensor();
#endif
}

at::Tensor fused_glu_down(const at::Tensor& gate, const at::Tensor& up, const at::Tensor& w_down,
                          Activation act) {
  check_supported(gate, "fused_glu_down");
  if (!up.defined() || !up.sizes().equals(gate.sizes()) || up.scalar_type() != gate.scalar_type() ||
      up.device() != gate.device())
    throw Error("fused_glu_down: gate and up must have the same shape, dtype and device");
  if (!w_down.defined() || w_down.dim() != 2 || w_down.size(1) != gate.size(-1) ||
      w_down.scalar_type() != gate.scalar_type() || w_down.device() != gate.device())
    throw Error("fused_glu_down: w_down must be [hidden, " + std::to_string(gate.size(-1)) +
                "] in gate's dtype, on its device");
#ifdef CIUIC_FUSED_KERNELS
  return FusedGluDown::apply(gate.contiguous(), up.contiguous(), w_down,
                             static_cast<int64_t>(glu_of(act)));
#else
  (void)act;
  return at::Tensor();
#endif
}

at::Tensor fused_rope(const at::Tensor& x, const RopeTables& rope) {
  check_supported(x, "fused_rope");
  if (x.dim() != 4 || x.size(3) % 2 != 0)
    throw Error("fused_rope: x must be [B, T, heads, D] with an even D, got " +
                std::to_string(x.dim()) + " dimensions");
  const int64_t rows = x.size(0) * x.size(1), d = x.size(3);
  if (!rope.cos.defined() || rope.cos.numel() != rows * d || rope.sin_signed.numel() != rows * d ||
      rope.cos.scalar_type() != x.scalar_type() ||
      rope.sin_signed.scalar_type() != x.scalar_type() || rope.cos.device() != x.device())
    throw Error(
        "fused_rope: the rotary tables must be [B, T, 1, D] for x's B, T, D, in x's dtype and on "
        "its device");
#ifdef CIUIC_FUSED_KERNELS
  return FusedRope::apply(x, rope.cos.contiguous(), rope.sin_signed.contiguous());
#else
  return at::Tensor();
#endif
}

at::Tensor fused_glu(const at::Tensor& gate, const at::Tensor& up, Activation act) {
  check_supported(gate, "fused_glu");
  if (!up.defined() || !up.sizes().equals(gate.sizes()) || up.scalar_type() != gate.scalar_type() ||
      up.device() != gate.device())
    throw Error("fused_glu: gate and up must have the same shape, dtype and device");
#ifdef CIUIC_FUSED_KERNELS
  return FusedGlu::apply(gate.contiguous(), up.contiguous(), static_cast<int64_t>(glu_of(act)));
#else
  (void)act;
  return at::Tensor();
#endif
}

}  // namespace ciuic::model
