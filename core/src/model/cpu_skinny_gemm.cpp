// The skinny GEMM's dispatch: which kernel, how many threads, the tensor checks
// (model/cpu_skinny_gemm.h).
#include "model/cpu_skinny_gemm.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>

#include <ciuic/error.h>

#include "model/cpu_skinny_gemm_kernel.h"

namespace ciuic::model {

namespace {

// W bytes below which a task is not worth a thread of its own: about 10 us of reading at this
// VM's 27 GB/s, several times an OpenMP fork and join on idle cores.
constexpr int64_t kMinTaskBytes = 256 * 1024;

skinny::KernelFn kernel_for(SkinnyIsa isa) {
#if defined(__x86_64__)
  if (isa == SkinnyIsa::kAvx512) return &skinny::kernel_avx512;
  if (isa == SkinnyIsa::kAvx2) return &skinny::kernel_avx2;
#endif
  return &skinny::kernel_scalar;
}

bool cpu_fp32(const at::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.layout() == at::kStrided &&
         t.scalar_type() == at::kFloat && t.has_storage();
}

}  // namespace

const char* skinny_isa_name(SkinnyIsa isa) {
  switch (isa) {
    case SkinnyIsa::kAvx512: return "avx512";
    case SkinnyIsa::kAvx2: return "avx2";
    default: return "scalar";
  }
}

bool skinny_isa_supported(SkinnyIsa isa) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  switch (isa) {
    // __builtin_cpu_supports also checks that the OS saves the wider registers (XCR0).
    case SkinnyIsa::kAvx512: return __builtin_cpu_supports("avx512f");
    case SkinnyIsa::kAvx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    default: return true;
  }
#else
  return isa == SkinnyIsa::kScalar;
#endif
}

SkinnyIsa skinny_isa_best() {
  static const SkinnyIsa best = [] {
    if (skinny_isa_supported(SkinnyIsa::kAvx512)) return SkinnyIsa::kAvx512;
    if (skinny_isa_supported(SkinnyIsa::kAvx2)) return SkinnyIsa::kAvx2;
    return SkinnyIsa::kScalar;
  }();
  return best;
}

bool skinny_gemm_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("CIUIC_SKINNY_GEMM");
    return !(e && std::string(e) == "0");
  }();
  return on;
}

bool skinny_linear_applies(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias) {
  if (!cpu_fp32(x) || !cpu_fp32(w) || x.dim() < 1 || w.dim() != 2) return false;
  const int64_t k = w.size(1), n = w.size(0);
  if (k < 1 || n < 1 || x.size(-1) != k || w.stride(1) != 1) return false;
  const int64_t rows = x.numel() / k;
  if (rows < 1 || rows > kSkinnyMaxRows) return false;
  if (bias.defined() && (!cpu_fp32(bias) || bias.dim() != 1 || bias.size(0) != n)) return false;
  if (at::GradMode::is_enabled() &&
      (x.requires_grad() || w.requires_grad() || (bias.defined() && bias.requires_grad())))
    return false;
  return true;
}

at::Tensor skinny_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias,
                         std::optional<SkinnyIsa> isa) {
  if (!skinny_linear_applies(x, w, bias))
    throw Error(
        "skinny_linear: needs CPU fp32 x [..., K] of 1.." + std::to_string(kSkinnyMaxRows) +
        " rows, w [N, K] with contiguous rows, bias [N] or none, and no gradient to record");
  const SkinnyIsa use = isa.value_or(skinny_isa_best());
  if (!skinny_isa_supported(use))
    throw Error(std::string("skinny_linear: this CPU does not support ") + skinny_isa_name(use));
  const int64_t k = w.size(1), n = w.size(0);
  at::Tensor x2 = x.reshape({-1, k});
  if (x2.stride(1) != 1) x2 = x2.contiguous();
  const at::Tensor b = bias.defined() ? bias.contiguous() : bias;
  at::Tensor y = at::empty({x2.size(0), n}, x.options());
  skinny::Args a;
  a.x = x2.const_data_ptr<float>();
  a.ldx = x2.stride(0);
  a.w = w.const_data_ptr<float>();
  a.ldw = w.stride(0);
  a.bias = b.defined() ? b.const_data_ptr<float>() : nullptr;
  a.y = y.mutable_data_ptr<float>();
  a.ldy = n;
  a.rows = x2.size(0);
  a.n = n;
  a.k = k;
  const skinny::KernelFn fn = kernel_for(use);
  const int64_t chunk_bytes = skinny::kRowChunk * k * static_cast<int64_t>(sizeof(float));
  const int64_t chunks = (n + skinny::kRowChunk - 1) / skinny::kRowChunk;
  const int64_t grain = (kMinTaskBytes + chunk_bytes - 1) / chunk_bytes;
  at::parallel_for(0, chunks, grain, [&](int64_t begin, int64_t end) {
    fn(a, begin * skinny::kRowChunk, std::min(end * skinny::kRowChunk, n));
  });
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = n;
  return y.view(shape);
}

at::Tensor decode_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias) {
  if (skinny_gemm_enabled() && skinny_linear_applies(x, w, bias)) return skinny_linear(x, w, bias);
  return at::linear(x, w, bias);
}

at::Tensor onednn_reorder_linear_weight(const at::Tensor& w, int64_t batch) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("mkldnn::_reorder_linear_weight", "")
                             .typed<at::Tensor(const at::Tensor&, std::optional<int64_t>)>();
  return op.call(w.detach(), batch);
}

at::Tensor onednn_linear(const at::Tensor& x, const at::Tensor& reordered) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                            c10::string_view, c10::List<std::optional<at::Scalar>>,
                            std::optional<c10::string_view>)>();
  return op.call(x, reordered, std::nullopt, "none", c10::List<std::optional<at::Scalar>>(),
                 std::nullopt);
}

}  // namespace ciuic::model
