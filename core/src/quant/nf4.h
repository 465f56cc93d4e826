// quant/nf4.h — 4-bit NormalFloat (NF4) storage of frozen base weights, as QLoRA (Dettmers et al.,
// 2023) and bitsandbytes store them, and a frozen linear layer that dequantizes on the fly.
//
// The same bits as bitsandbytes 0.50.2 (tests/quant/nf4_test.cpp against
// tests/fixtures/gen_nf4.py's fixture of bitsandbytes.functional.quantize_4bit on CPU):
//   * packing and the fp32 absmax: identical. Block b of `blocksize` consecutive elements of the
//     flattened tensor (the last block may be shorter) has absmax_b = max |x|; each element is
//     scaled into [-1, 1] (x * (1 / absmax_b) in a full block, x / absmax_b in the short last one,
//     absmax clamped to >= 1e-38, as bitsandbytes does) and gets the index of the nearest of the 16
//     NF4 values (a tie takes the lower index); element 2i is the high nibble of byte i, 2i+1 the
//     low one (an odd count pads one zero, index 7).
//   * double quantization (compress_statistics=True): offset = mean(absmax) (ATen's fp32 mean,
//     computed on one thread here as the fixture is), absmax - offset quantized in blocks of 256
//     with bitsandbytes' signed 8-bit dynamic code (create_dynamic_map()): absmax2 per block
//     identical; the uint8 codes are the nearest code value (bitsandbytes' own reference, its
//     "default" backend). bitsandbytes' native CPU kernel picks a neighbour code for about 1% of
//     values (its binary search is approximate), so the codes are not bit-identical to its CPU
//     path; the test holds every code to be at least as near as bitsandbytes' and the dequantized
//     absmax to its error.
//   * dequantization: code[nibble] * absmax in fp32, rounded once to the output dtype — identical
//     to bitsandbytes' dequantize_4bit for a state it wrote (nested or not).
//
// Threading: every function is reentrant; the CPU loops use ATen's intra-op thread pool. An
// Nf4Tensor is an immutable value once built (its tensors are shared, not copied, by copies of it),
// safe to read from any thread. Failure: bad input throws ciuic::Error naming what is wrong
// (dtype, block size, shapes, the tensor's name when loading).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <ciuic/export.h>

#include "quant/nf4_size.h"

namespace ciuic::quant {

// A tensor stored as NF4. Owns its tensors (reference-counted ATen tensors, on one device).
struct CIUIC_API Nf4Tensor {
  at::Tensor packed;  // uint8 [ceil(numel / 2)]: two 4-bit indices into `code` per byte
  at::Tensor code;    // fp32 [16]: the NF4 values (bitsandbytes' get_4bit_type("nf4"))
  // Without double quantization: fp32 [blocks]. With it: uint8 [blocks], codes into code2.
  at::Tensor absmax;
  // Double quantization only (undefined otherwise): absmax ~= code2[absmax] * absmax2[b / 256] +
  // offset.
  at::Tensor code2;    // fp32 [256]: bitsandbytes' create_dynamic_map()
  at::Tensor absmax2;  // fp32 [ceil(blocks / 256)]
  float offset = 0.0f;
  std::vector<int64_t> shape;                    // the original tensor's shape
  at::ScalarType dtype = at::ScalarType::Float;  // the original tensor's dtype
  int64_t blocksize = 64;

  bool double_quant() const { return code2.defined(); }
  int64_t numel() const;
  int64_t blocks() const { return (numel() + blocksize - 1) / blocksize; }
  // What the tensors hold, in bytes (equals nf4_bytes(numel(), blocksize, double_quant())).
  int64_t bytes() const;
};

// Quantizes `w` (fp32, bf16 or fp16, any shape, any device; finite values) in blocks of
// `blocksize` (32, 64, ..., 4096, as bitsandbytes allows), with double quantization of the scales
// when `double_quant` (bitsandbytes' compress_statistics; QLoRA's default). Where
// nf4_quantizes_on(w's device) (a CUDA tensor in a CUDA build) it runs on the device with the
// kernels of quant/cuda: the same bits as the CPU path (the offset, the absmax's mean, is taken on
// the CPU by both; one host synchronisation); elsewhere the computation runs on the CPU. The
// result's tensors are on w's device. Holds at most w, a contiguous copy of it (fp32 on the CPU)
// and the result. Throws ciuic::Error on an unsupported dtype or block size, an empty tensor, or a
// non-finite value.
CIUIC_API Nf4Tensor quantize_nf4(const at::Tensor& w, int64_t blocksize = 64,
                                 bool double_quant = true);
// Whether quantize_nf4 runs on `device` itself (CUDA devices in CUDA builds) rather than the CPU.
CIUIC_API bool nf4_quantizes_on(c10::Device device);

// The fp32 absmax per block (undoes the double quantization when there is one).
CIUIC_API at::Tensor nf4_absmax(const Nf4Tensor& q);

// The dequantized tensor, q.shape, in `dtype` (fp32/bf16/fp16), on q's device: a CUDA kernel for
// CUDA tensors in CUDA builds (CIUIC_FUSED_KERNELS), ATen otherwise. Throws ciuic::Error on an
// inconsistent Nf4Tensor or an unsupported dtype.
CIUIC_API at::Tensor dequantize_nf4(const Nf4Tensor& q, at::ScalarType dtype);

// y = x W^T + bias with W = dequantize_nf4(w, x's dtype) [out, in] (w.shape must be 2-D), an
// autograd op: the forward dequantizes W, multiplies and drops W; the backward dequantizes it
// again for grad_x = grad_y W. W gets no gradient and nothing of W is saved for backward (the
// saved state is w's 4-bit tensors and nothing else; x is not saved either). `bias` (optional,
// [out]) gets a gradient if it requires one. x: [..., in], floating point (its dtype is the compute
// dtype: cast x to choose it). Throws ciuic::Error on shape or dtype mismatches.
CIUIC_API at::Tensor nf4_linear(const at::Tensor& x, const Nf4Tensor& w,
                                const at::Tensor& bias = {});

// ---- serialisation, in bitsandbytes/transformers' layout ---------------------------------------
// For a weight named `name` ("model.layers.0.self_attn.q_proj.weight"), the tensors a
// transformers checkpoint of a bitsandbytes 4-bit model holds: `name` (uint8 [ceil(n/2), 1]),
// `name.absmax`, `name.quant_map`, and with double quantization `name.nested_absmax`,
// `name.nested_quant_map`, plus `name.quant_state.bitsandbytes__nf4` (uint8 bytes of the JSON
// {"quant_type", "blocksize", "dtype", "shape", and nested_blocksize/nested_dtype/nested_offset}).
// Tensors are moved to the CPU; the map is ordered by name (write it with
// model/safetensors.h's write_safetensors).
CIUIC_API std::map<std::string, at::Tensor> nf4_state_dict(const std::string& name,
                                                           const Nf4Tensor& q);
// The inverse: reads those entries of `tensors` (e.g. a SafetensorsFile's) back. Throws
// ciuic::Error naming `name` and the missing or inconsistent entry.
CIUIC_API Nf4Tensor nf4_from_state_dict(const std::string& name,
                                        const std::map<std::string, at::Tensor>& tensors);

}  // namespace ciuic::quant
