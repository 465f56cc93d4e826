// model/fused_ops.h — fused CUDA versions of the decoder layer's elementwise steps.
//
// Each function computes what its ATen composition in model/llama_ops.cpp computes (rotary
// embedding: x * cos + roll(x, D/2) * sin_signed; the gated MLP activation act(gate) * up with
// act = silu (SwiGLU) or tanh GELU (GeGLU, gelu(approximate = "tanh")); RMSNorm, plain or
// Gemma's (1 + w), and the per-head q/k RMSNorm fused with rope), differentiably, in
// one kernel forward and one backward, evaluating in fp32 and rounding once (the norms: where
// transformers' modules round; the composition rounds after each step: results differ by
// bf16/fp16 rounding, not more; tests/model/
// fused_ops_test.cpp holds both to each other). The gated activation keeps only gate and up for
// its backward (the composition also keeps act(gate) and the product).
// Available in CUDA builds for CUDA tensors in fp32/bf16/fp16 (fused_kernels_supported); calling
// them otherwise throws ciuic::Error. Stateless; the kernels run on the current CUDA stream.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "model/llama_ops.h"

#include <ciuic/export.h>

namespace ciuic::model {

// Whether this build has the kernels (compiled with CUDA).
CIUIC_API bool fused_kernels_built();
// Whether they run for parameters of this dtype on this device.
CIUIC_API bool fused_kernels_supported(at::ScalarType dtype, c10::Device device);

// x [B, T, heads, D] (last dimension contiguous; any strides otherwise), tables from rope_tables
// for the same B, T, in x's dtype. Returns a contiguous [B, T, heads, D].
CIUIC_API at::Tensor fused_rope(const at::Tensor& x, const RopeTables& rope);
// gate, up: same shape and dtype, contiguous. Returns act(gate) * up.
CIUIC_API at::Tensor fused_glu(const at::Tensor& gate, const at::Tensor& up,
                               Activation act = Activation::kSilu);
// gate, up [..., I]; w_down [H, I]. Returns linear(act(gate) * up, w_down) [..., H], keeping
// only gate and up for the backward, which recomputes act(gate) * up (one elementwise kernel):
// the decoder layer's MLP holds 2 I fewer activations per token than with the composition.
// RMSNorm over the last dimension of x (any shape; copied when not contiguous), weight w [D] in
// x's dtype, with transformers' rounding points (model/cuda/fused_kernels.h): gemma = false as
// LlamaRMSNorm / Qwen3RMSNorm (normalised in fp32, cast to the dtype, times w in the dtype),
// gemma = true as Gemma3RMSNorm (times 1 + w in fp32, cast once). The backward keeps x and w
// only (the composition keeps an fp32 copy of x, and Gemma's its fp32 output too).
CIUIC_API at::Tensor fused_rms_norm(const at::Tensor& x, const at::Tensor& w, double eps,
                                    bool gemma);
// The q/k norm then rope of qwen3 and gemma3_text: rope(rms_norm(x, w)) for x [B, T, heads, D]
// (last dimension contiguous), w [D], D <= 512, the norm as fused_rms_norm's (its output rounded
// to the dtype, as the module's output is) and the rotation as fused_rope's. One kernel forward,
// one backward; keeps x, w and the tables. Returns a contiguous [B, T, heads, D].
CIUIC_API at::Tensor fused_qk_norm_rope(const at::Tensor& x, const at::Tensor& w,
                                        const RopeTables& rope, double eps, bool gemma);
CIUIC_API at::Tensor fused_glu_down(const at::Tensor& gate, const at::Tensor& up,
                                    const at::Tensor& w_down, Activation act = Activation::kSilu);

}  // namespace ciuic::model
