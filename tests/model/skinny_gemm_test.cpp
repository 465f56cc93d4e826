// The CPU skinny GEMM (model/cpu_skinny_gemm.h) against at::linear: every ISA this CPU supports
// (scalar forced too), rows 1..kSkinnyMaxRows, K and N around and far from the vector widths, with
// and without bias, on 1 and 2 threads; the tensor checks and decode_linear's fallbacks.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>

#include <ciuic/error.h>

#include "model/cpu_skinny_gemm.h"

namespace ciuic::model {
namespace {

std::vector<SkinnyIsa> supported_isas() {
  std::vector<SkinnyIsa> out;
  for (SkinnyIsa i : {SkinnyIsa::kScalar, SkinnyIsa::kAvx2, SkinnyIsa::kAvx512})
    if (skinny_isa_supported(i)) out.push_back(i);
  return out;
}

struct Threads {  // at::set_num_threads for a scope
  explicit Threads(int n) : saved(at::get_num_threads()) { at::set_num_threads(n); }
  ~Threads() { at::set_num_threads(saved); }
  int saved;
};

// |x| |w|^T + |bias|: the sum of the terms' magnitudes per output, what rounding scales with (a
// plain |ref| would be near zero for some outputs).
at::Tensor magnitude(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias) {
  return at::linear(at::abs(x), at::abs(w), bias.defined() ? at::abs(bias) : bias) + 1e-30;
}
double rel_err(const at::Tensor& y, const at::Tensor& ref, const at::Tensor& scale) {
  return ((y - ref).abs() / scale).max().item<double>();
}
double rel_err(const at::Tensor& y, const at::Tensor& ref, const at::Tensor& x, const at::Tensor& w,
               const at::Tensor& bias) {
  return rel_err(y, ref, magnitude(x, w, bias));
}

TEST(SkinnyGemm, EqualsAtLinearOnEveryIsaShapeAndThreadCount) {
  at::NoGradGuard no_grad;
  const std::vector<SkinnyIsa> isas = supported_isas();
  ASSERT_FALSE(isas.empty());
  EXPECT_TRUE(skinny_isa_supported(SkinnyIsa::kScalar));
  EXPECT_TRUE(skinny_isa_supported(skinny_isa_best()));
  std::string ran;
  for (SkinnyIsa i : isas) ran += std::string(skinny_isa_name(i)) + " ";
  std::printf("skinny GEMM ISAs tested here: %s(best: %s)\n", ran.c_str(),
              skinny_isa_name(skinny_isa_best()));
  int cases = 0;
  for (int64_t k : {37, 768, 1000}) {
    for (int64_t n : {1, 5, 2048, 32001}) {
      const at::Tensor w = at::randn({n, k});
      const at::Tensor bias = at::randn({n});
      for (int64_t m : {1, 2, 3, 7, 8, 9, 16}) {
        const at::Tensor x = at::randn({m, k});
        for (bool with_bias : {false, true}) {
          const at::Tensor b = with_bias ? bias : at::Tensor();
          const at::Tensor ref = at::linear(x, w, b), scale = magnitude(x, w, b);
          for (SkinnyIsa isa : isas) {
            for (int threads : {1, 2}) {
              const Threads t(threads);
              ASSERT_TRUE(skinny_linear_applies(x, w, b));
              const at::Tensor y = skinny_linear(x, w, b, isa);
              ASSERT_EQ(y.sizes(), ref.sizes());
              EXPECT_LT(rel_err(y, ref, scale), 1e-5)
                  << skinny_isa_name(isa) << " M=" << m << " K=" << k << " N=" << n
                  << " bias=" << with_bias << " threads=" << threads;
              ++cases;
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(cases, 3 * 4 * 7 * 2 * 2 * static_cast<int>(isas.size()));
}

TEST(SkinnyGemm, UpToMaxRowsEqualsAtLinear) {
  // Prefill-sized products: several tiles of 8 rows over the same chunk of W.
  at::NoGradGuard no_grad;
  for (int64_t k : {37, 768}) {
    for (int64_t n : {5, 2048}) {
      const at::Tensor w = at::randn({n, k}), bias = at::randn({n});
      for (int64_t m : {int64_t{17}, int64_t{20}, int64_t{33}, kSkinnyMaxRows}) {
        const at::Tensor x = at::randn({m, k});
        const at::Tensor ref = at::linear(x, w, bias), scale = magnitude(x, w, bias);
        for (SkinnyIsa isa : supported_isas())
          for (int threads : {1, 2}) {
            const Threads t(threads);
            EXPECT_LT(rel_err(skinny_linear(x, w, bias, isa), ref, scale), 1e-5)
                << skinny_isa_name(isa) << " M=" << m << " K=" << k << " N=" << n
                << " threads=" << threads;
          }
      }
    }
  }
}

TEST(SkinnyGemm, StridedAndBatchedInputsKeepTheirLeadingShape) {
  at::NoGradGuard no_grad;
  const at::Tensor w = at::randn({300, 130});
  // One position selected out of [B, T, K]: rows T * K apart, read in place.
  const at::Tensor seq = at::randn({5, 3, 130});
  const at::Tensor last = seq.select(1, 2);
  ASSERT_FALSE(last.is_contiguous());
  for (SkinnyIsa isa : supported_isas()) {
    EXPECT_LT(rel_err(skinny_linear(last, w, {}, isa), at::linear(last, w), last, w, {}), 1e-5);
    // [B, T, K] with B * T <= kSkinnyMaxRows rows: [B, T, N] back.
    const at::Tensor x3 = at::randn({2, 4, 130});
    const at::Tensor y3 = skinny_linear(x3, w, {}, isa);
    EXPECT_EQ(y3.sizes(), (std::vector<int64_t>{2, 4, 300}));
    EXPECT_LT(rel_err(y3, at::linear(x3, w), x3, w, {}), 1e-5);
    // A column slice of x (stride 2 in K) is copied first.
    const at::Tensor wide = at::randn({3, 260});
    const at::Tensor sliced = wide.slice(1, 0, 260, 2);
    EXPECT_LT(rel_err(skinny_linear(sliced, w, {}, isa), at::linear(sliced, w), sliced, w, {}),
              1e-5);
    // A weight whose rows are further apart than K (a row slice of a wider matrix).
    const at::Tensor wbig = at::randn({300, 200});
    const at::Tensor wpart = wbig.narrow(1, 10, 130);
    EXPECT_LT(
        rel_err(skinny_linear(last, wpart, {}, isa), at::linear(last, wpart), last, wpart, {}),
        1e-5);
  }
}

TEST(SkinnyGemm, AppliesOnlyToSmallFp32CpuProductsWithoutAutograd) {
  const at::Tensor w = at::randn({64, 32});
  {
    at::NoGradGuard no_grad;
    EXPECT_TRUE(skinny_linear_applies(at::randn({kSkinnyMaxRows, 32}), w));
    EXPECT_FALSE(skinny_linear_applies(at::randn({kSkinnyMaxRows + 1, 32}), w));  // at::linear
    EXPECT_FALSE(skinny_linear_applies(at::randn({0, 32}), w));
    EXPECT_FALSE(skinny_linear_applies(at::randn({2, 31}), w));
    EXPECT_FALSE(skinny_linear_applies(at::randn({2, 32}).to(at::kDouble), w));
    EXPECT_FALSE(skinny_linear_applies(at::randn({2, 32}), w.to(at::kBFloat16)));
    EXPECT_FALSE(skinny_linear_applies(at::randn({2, 32}), w.t().contiguous().t()));
    EXPECT_FALSE(skinny_linear_applies(at::randn({2, 32}), w, at::randn({63})));
    EXPECT_THROW(skinny_linear(at::randn({kSkinnyMaxRows + 1, 32}), w), Error);
    // decode_linear falls back to at::linear where the kernel does not apply.
    const at::Tensor big = at::randn({kSkinnyMaxRows + 1, 32});
    EXPECT_TRUE(decode_linear(big, w).equal(at::linear(big, w)));
  }
  // Autograd recording a product that needs a gradient: not taken (training keeps at::linear).
  const at::Tensor wg = at::randn({64, 32}).requires_grad_(true);
  EXPECT_FALSE(skinny_linear_applies(at::randn({2, 32}), wg));
  EXPECT_TRUE(skinny_linear_applies(at::randn({2, 32}), w));  // nothing needs a gradient
  const at::Tensor x = at::randn({2, 32});
  const at::Tensor y = decode_linear(x, wg);
  EXPECT_TRUE(y.requires_grad());
}

}  // namespace
}  // namespace ciuic::model
