// FusedAdamWShard (ciuic/kit/fused_adamw.h): the tile table and the checks around the CUDA kernel
// (src/cuda/adamw_shard.cu, compiled only in CUDA builds: CIUIC_KIT_CUDA_KERNELS).
#include <ciuic/kit/fused_adamw.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include <ATen/ops/empty.h>

#include <ciuic/error.h>

#if CIUIC_KIT_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "cuda/adamw_shard.h"
static_assert(sizeof(ciuic::kit::cuda::Tile) == 2 * sizeof(int64_t),
              "a tile is two int64 of the table");
#endif

namespace ciuic::kit {

namespace {
constexpr int64_t kTile = int64_t{1} << 16;  // elements per tile (the kernel's block)
#if CIUIC_KIT_CUDA_KERNELS
static_assert(kTile == kit::cuda::kTileElements, "the table's tiles are the kernel's");
#endif
}  // namespace

bool FusedAdamWShard::available(const c10::Device& device) {
#if CIUIC_KIT_CUDA_KERNELS
  return device.is_cuda();
#else
  (void)device;
  return false;
#endif
}

FusedAdamWShard::FusedAdamWShard(const std::vector<ShardSegment>& segments, int64_t numel,
                                 c10::Device device)
    : numel_(numel), device_(device) {
  if (!available(device))
    throw Error("fused AdamW: needs a CUDA device and a CUDA build of ciuic (got " + device.str() +
                ")");
  std::vector<int64_t> table;
  int64_t pos = 0;
  for (const ShardSegment& s : segments) {
    if (s.begin != pos || s.end < s.begin || s.end > numel)
      throw Error("fused AdamW: segments must cover [0, " + std::to_string(numel) +
                  ") in order; a segment starts at " + std::to_string(s.begin) + ", expected " +
                  std::to_string(pos));
    for (int64_t b = s.begin; b < s.end; b += kTile) {
      const int64_t count = std::min(kTile, s.end - b);
      table.push_back(b);
      table.push_back(count | (int64_t{s.weight_decay ? 1 : 0} << 32));
    }
    pos = s.end;
  }
  if (pos != numel)
    throw Error("fused AdamW: segments end at " + std::to_string(pos) + ", the shard has " +
                std::to_string(numel));
  num_tiles_ = static_cast<int64_t>(table.size() / 2);
  at::Tensor host = at::empty({num_tiles_, 2}, at::TensorOptions().dtype(at::kLong));
  if (num_tiles_ > 0) std::copy(table.begin(), table.end(), host.data_ptr<int64_t>());
  tiles_ = host.to(device);
}

void FusedAdamWShard::step(at::Tensor& master, const at::Tensor& grad, at::Tensor& exp_avg,
                           at::Tensor& exp_avg_sq, at::Tensor* params_out, const Hyper& h) const {
  auto check = [&](const at::Tensor& t, const char* what, bool any_float) {
    const bool dtype_ok =
        any_float
            ? (t.defined() && (t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16 ||
                               t.scalar_type() == at::kHalf))
            : (t.defined() && t.scalar_type() == at::kFloat);
    if (!dtype_ok || t.numel() != numel_ || t.device() != device_ || !t.is_contiguous() ||
        reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0)
      throw Error(std::string("fused AdamW: ") + what + " must be a contiguous, 16-byte aligned " +
                  (any_float ? "fp32, bf16 or fp16" : "fp32") + " tensor of " +
                  std::to_string(numel_) + " elements on " + device_.str() + ", got " +
                  (t.defined() ? std::string(c10::toString(t.scalar_type())) + " of " +
                                     std::to_string(t.numel()) + " elements on " + t.device().str()
                               : std::string("none")));
  };
  check(master, "master", false);
  check(exp_avg, "exp_avg", false);
  check(exp_avg_sq, "exp_avg_sq", false);
  check(grad, "the gradient", true);
  if (params_out) check(*params_out, "params_out", true);
  if (h.t < 1) throw Error("fused AdamW: step count t must be >= 1, got " + std::to_string(h.t));
#if CIUIC_KIT_CUDA_KERNELS
  auto dtype = [](at::ScalarType t) {
    return t == at::kFloat      ? kit::cuda::DType::kFloat
           : t == at::kBFloat16 ? kit::cuda::DType::kBFloat16
                                : kit::cuda::DType::kHalf;
  };
  const double bc1 = 1.0 - std::pow(h.beta1, static_cast<double>(h.t));
  const double bc2 = 1.0 - std::pow(h.beta2, static_cast<double>(h.t));
  kit::cuda::AdamWScalars s;
  s.lr = static_cast<float>(h.lr);
  s.beta1 = static_cast<float>(h.beta1);
  s.beta2 = static_cast<float>(h.beta2);
  s.eps = static_cast<float>(h.eps);
  s.one_minus_beta1 = static_cast<float>(1.0 - h.beta1);
  s.one_minus_beta2 = static_cast<float>(1.0 - h.beta2);
  s.lr_weight_decay = static_cast<float>(h.lr * h.weight_decay);
  s.step_size = static_cast<float>(h.lr / bc1);
  s.bias_correction2_sqrt = static_cast<float>(std::sqrt(bc2));
  s.grad_scale = static_cast<float>(h.grad_scale);
  const c10::cuda::CUDAGuard guard(device_);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device_.index()).stream();
  const char* err = kit::cuda::adamw_shard(
      reinterpret_cast<const kit::cuda::Tile*>(tiles_.data_ptr<int64_t>()), num_tiles_,
      master.data_ptr<float>(), grad.data_ptr(), dtype(grad.scalar_type()),
      exp_avg.data_ptr<float>(), exp_avg_sq.data_ptr<float>(),
      params_out ? params_out->data_ptr() : nullptr,
      params_out ? dtype(params_out->scalar_type()) : kit::cuda::DType::kFloat, s, stream);
  if (err) throw Error(std::string("fused AdamW: kernel launch failed: ") + err);
#else
  throw Error("fused AdamW: this build of ciuic has no CUDA kernels");
#endif
}

}  // namespace ciuic::kit
