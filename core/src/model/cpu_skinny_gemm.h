// model/cpu_skinny_gemm.h — fp32 y = x · Wᵀ (+ bias) on the CPU for a few rows of x (decode steps).
//
// A KV-cache decode step multiplies a few rows (one per sequence of the batch) by every weight
// matrix of the model once; there the product is bound by reading W, or at 8 rows and more by the
// arithmetic, never by packing. MKL's sgemm (LibTorch's CPU GEMM) runs a
// generic path on AMD CPUs that reads W at about half the memory bandwidth for such shapes
// (docs/performance.md, "CPU decode against its floor"). This kernel streams W once: for a block
// of W's rows it takes the dot products with every row of x in SIMD registers (the x rows stay in
// L1), reduces them horizontally at the end of the row, and writes y; W is prefetched into L2 a
// tile ahead. Parallel over blocks of W's rows (at::parallel_for, so at::get_num_threads() threads
// at most).
//
// Three implementations of the same product, chosen at run time from the CPU's features (as the
// cpu_adam plugin's kernels): AVX-512 (avx512f), AVX2 (avx2 + fma) and portable scalar code; the
// SIMD ones are compiled in function-level target regions (cpu_skinny_gemm_avx512.cpp,
// cpu_skinny_gemm_avx2.cpp), so libciuic runs on any x86-64. They differ from at::linear (and
// from each other) only in the order of the additions: a relative difference of order
// K * 2^-24 at worst, ~1e-6 for K = 1000 in practice (tests/model/skinny_gemm_test.cpp).
#pragma once

#include <cstdint>
#include <optional>

#include <ATen/core/Tensor.h>

#include <ciuic/export.h>

namespace ciuic::model {

// Rows of x (all leading dimensions together) up to which skinny_linear_applies: decode steps of
// up to 64 rows and prefills of up to 64 tokens. MKL's sgemm took 1.3-2x as long up to 64 rows
// (16 x 768 x 2048: 1.04 vs 0.71 ms; 64: 2.65 vs 2.04 ms) and as long at 160 (5.5 vs 5.1 ms),
// one thread, cold weights (bench/model/skinny_bench.cpp).
constexpr int64_t kSkinnyMaxRows = 64;

enum class SkinnyIsa : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };
CIUIC_API const char* skinny_isa_name(SkinnyIsa isa);  // "scalar", "avx2", "avx512"
// Whether this CPU and OS support `isa` (kScalar: always; the SIMD ones: x86-64 only).
CIUIC_API bool skinny_isa_supported(SkinnyIsa isa);
// The best supported one (chosen once per process).
CIUIC_API SkinnyIsa skinny_isa_best();

// False when CIUIC_SKINNY_GEMM=0 is in the environment (read once per process): decode_linear
// then always calls at::linear (A/B).
CIUIC_API bool skinny_gemm_enabled();

// Whether skinny_linear takes this product: autograd off (at::GradMode) or no operand requiring
// a gradient; x a CPU fp32 strided tensor [..., K] with between 1 and kSkinnyMaxRows rows (the
// product of its leading sizes) and K >= 1; w a CPU fp32 strided [N, K] with N >= 1 whose rows
// are contiguous (stride(1) == 1); bias undefined or a CPU fp32 [N]. Does not look at
// skinny_gemm_enabled().
CIUIC_API bool skinny_linear_applies(const at::Tensor& x, const at::Tensor& w,
                                     const at::Tensor& bias = at::Tensor());

// at::linear(x, w, bias) through the kernel: a new contiguous fp32 tensor [..., N] (x's leading
// sizes). x needs only a unit stride in its last dimension (a row-strided view, such as one
// position selected out of [B, T, K], is read in place; anything else is copied first). Runs on
// up to at::get_num_threads() threads through at::parallel_for (serially inside a parallel
// region, or when W is too small to be worth a second thread). isa: that implementation (tests);
// nullopt: skinny_isa_best(). Throws ciuic::Error when !skinny_linear_applies(x, w, bias) or when
// `isa` is not supported here. Allocates the result (and a copy of x or bias where either is not
// laid out as above); the inputs are not changed.
CIUIC_API at::Tensor skinny_linear(const at::Tensor& x, const at::Tensor& w,
                                   const at::Tensor& bias = at::Tensor(),
                                   std::optional<SkinnyIsa> isa = std::nullopt);

// The linear products of a KV-cache generation call (decoder_layer with LayerShape::decode, and
// the lm_head of LlamaModel::decode, decode_step and generate_greedy): skinny_linear where
// skinny_gemm_enabled() and skinny_linear_applies(x, w, bias), at::linear otherwise (GPU, bf16,
// prefills of more than kSkinnyMaxRows rows, training). Same result as at::linear up to the
// order of the additions.
CIUIC_API at::Tensor decode_linear(const at::Tensor& x, const at::Tensor& w,
                                   const at::Tensor& bias = at::Tensor());

// oneDNN's fp32 linear, the other CPU path of a decode step's products (the lm_head at batches
// the skinny GEMM does not take): `onednn_reorder_linear_weight` lays out w [out, in] once for
// `batch` rows (a new tensor, detached from w); `onednn_linear` multiplies x [rows, in] by it.
// These are the ops inductor's CPU weight freezing uses (mkldnn::_reorder_linear_weight and
// mkldnn::_linear_pointwise, registered by LibTorch but not in at::), called through the
// dispatcher; they throw c10::Error where this LibTorch lacks them (at::hasMKLDNN() false).
CIUIC_API at::Tensor onednn_reorder_linear_weight(const at::Tensor& w, int64_t batch);
CIUIC_API at::Tensor onednn_linear(const at::Tensor& x, const at::Tensor& reordered);

}  // namespace ciuic::model
