// The profile table's kernel categories (train/profile.h) on kernel names as CUPTI reports them
// on an H200 with torch 2.11 (copied from the 2026-12-01 profiles in docs/performance/model.md).
// The names are templates with many substrings in common: "unrolled_elementwise_kernel" holds
// "roll", a copy kernel's functor may hold "norm"; the order of the rules decides.
#include <gtest/gtest.h>

#include "train/profile.h"

namespace ciuic::train {
namespace {

TEST(Profile, KernelCategoriesFromCuptiNames) {
  const std::pair<const char*, const char*> cases[] = {
      {"nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_NTN", "matmul"},
      {"sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64", "matmul"},
      {"cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x128_1x4x1_cga1x1",
       "attention"},
      {"void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>",
       "attention"},
      {"void "
       "at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::"
       "TensorIteratorBase&)",
       "copies, casts"},
      {"void at::native::vectorized_elementwise_kernel<8, "
       "at::native::bfloat16_copy_kernel_cuda(at::TensorIter",
       "copies, casts"},
      {"void at::native::roll_cuda_kernel<c10::BFloat16>(c10::BFloat16 const*, c10::BFloat16*, "
       "long, long, long)",
       "rope"},
      {"void ciuic::model::cuda::(anonymous namespace)::rope_kernel<__nv_bfloat16>(__nv_bfloat16 "
       "const*)",
       "rope"},
      {"void ciuic::model::cuda::(anonymous namespace)::swiglu_bwd_kernel<__nv_bfloat16, "
       "8>(__nv_bfloat16)",
       "activation"},
      {"void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float, "
       "true>",
       "norm"},
      {"void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous "
       "namespace)::"
       "TensorListMetadata<5>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 5>",
       "optimizer"},
      {"ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
       "communication"},
      {"Memcpy DtoD (Device -> Device)", "copies (memcpy)"},
      {"void at::native::vectorized_elementwise_kernel<4, "
       "at::native::exp_kernel_cuda(at::TensorIteratorBase&)",
       "loss"},
      {"void at::native::vectorized_elementwise_kernel<8, "
       "at::native::CUDAFunctor_add<c10::BFloat16>>",
       "other elementwise"},
  };
  for (const auto& [name, want] : cases) EXPECT_EQ(kernel_category(name), want) << name;
}

}  // namespace
}  // namespace ciuic::train
