// quant/nf4.h against bitsandbytes 0.50.2 on CPU (tests/fixtures/quant/nf4.safetensors, written by
// tests/fixtures/gen_nf4.py): packing and absmax bit-identical, dequantization exactly equal, the
// double quantization's absmax2 and offset identical and its codes at least as near as bnb's.
#include <bit>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <ciuic/error.h>

#include "model/safetensors.h"
#include "quant/nf4.h"

namespace {

using ciuic::quant::Nf4Tensor;

const std::string kCases[] = {"block",    "odd",           "rect",     "cube",
                              "big_fp32", "big_bf16",      "big_fp16", "zeros",
                              "outliers", "outliers_bf16", "rect_fp16"};

std::shared_ptr<const ciuic::model::SafetensorsFile> fixture() {
  static const auto f =
      ciuic::model::SafetensorsFile::open(CIUIC_FIXTURES_DIR + "/quant/nf4.safetensors");
  return f;
}
at::Tensor T(const std::string& name) { return fixture()->tensor(name).clone(); }

// bnb's offset is a mean taken on one thread (the generator's set_num_threads(1)).
struct OneThread : ::testing::Test {
  void SetUp() override { at::set_num_threads(1); }
};
using Nf4 = OneThread;

TEST_F(Nf4, CodeIsBitsandbytesTable) {
  const Nf4Tensor q = ciuic::quant::quantize_nf4(T("rect.input"));
  EXPECT_TRUE(at::equal(q.code, T("nf4.code")));
  EXPECT_TRUE(at::equal(q.code2, T("rect.code2")));  // create_dynamic_map()
}

TEST_F(Nf4, PackingAndAbsmaxAreBitIdentical) {
  for (const std::string& c : kCases) {
    SCOPED_TRACE(c);
    const at::Tensor x = T(c + ".input");
    const Nf4Tensor q = ciuic::quant::quantize_nf4(x, 64, false);
    EXPECT_TRUE(at::equal(q.packed, T(c + ".packed")));
    EXPECT_TRUE(at::equal(q.absmax, T(c + ".absmax")));
    EXPECT_EQ(q.shape, x.sizes().vec());
    EXPECT_EQ(q.dtype, x.scalar_type());
    const at::Tensor d = ciuic::quant::dequantize_nf4(q, x.scalar_type());
    // bnb's CPU kernel returns a 1-D tensor of even length as [1, n]: compare the values.
    EXPECT_TRUE(at::equal(d, T(c + ".dequant").reshape(x.sizes())));
    EXPECT_EQ(q.bytes(), ciuic::quant::nf4_bytes(x.numel(), 64, false));
  }
}

TEST_F(Nf4, DoubleQuantizationMatchesBitsandbytes) {
  for (const std::string& c : kCases) {
    SCOPED_TRACE(c);
    const at::Tensor x = T(c + ".input");
    const Nf4Tensor q = ciuic::quant::quantize_nf4(x);  // blocksize 64, double quantization
    ASSERT_TRUE(q.double_quant());
    EXPECT_TRUE(at::equal(q.packed, T(c + ".packed_dq")));
    EXPECT_EQ(q.offset, T(c + ".offset").item<float>());
    EXPECT_TRUE(at::equal(q.absmax2, T(c + ".absmax2")));
    EXPECT_EQ(q.bytes(), ciuic::quant::nf4_bytes(x.numel(), 64, true));
    // The codes: bnb's native CPU search picks a neighbour for ~1% of the values; ours is the
    // nearest code (bnb's reference backend), so never farther from the true absmax than bnb's.
    const at::Tensor absmax = T(c + ".absmax");
    const at::Tensor ours = ciuic::quant::nf4_absmax(q);
    Nf4Tensor theirs = q;
    theirs.absmax = T(c + ".qabsmax");
    const at::Tensor bnb = ciuic::quant::nf4_absmax(theirs);
    const at::Tensor ours_err = (ours - absmax).abs(), bnb_err = (bnb - absmax).abs();
    EXPECT_TRUE((ours_err <= bnb_err + 1e-7 * absmax.abs().max()).all().item<bool>())
        << "max ours " << ours_err.max().item<float>() << " bnb " << bnb_err.max().item<float>();
    const double agree = (q.absmax == theirs.absmax).to(at::kFloat).mean().item<double>();
    EXPECT_GE(agree, c == "block" || c == "odd" ? 0.0 : 0.9);
  }
}

// Dequantizing bnb's own nested state (its codes) gives bnb's dequantize_4bit exactly.
TEST_F(Nf4, DequantizesBitsandbytesStateExactly) {
  for (const std::string& c : kCases) {
    SCOPED_TRACE(c);
    const at::Tensor x = T(c + ".input");
    Nf4Tensor q = ciuic::quant::quantize_nf4(x);
    q.packed = T(c + ".packed_dq");
    q.absmax = T(c + ".qabsmax");
    q.code2 = T(c + ".code2");
    q.absmax2 = T(c + ".absmax2");
    q.offset = T(c + ".offset").item<float>();
    EXPECT_TRUE(at::equal(ciuic::quant::dequantize_nf4(q, x.scalar_type()),
                          T(c + ".dequant_dq").reshape(x.sizes())));
  }
}

TEST_F(Nf4, StateDictInTransformersLayout) {
  for (const std::string c : {"rect", "big_bf16"}) {
    SCOPED_TRACE(c);
    const std::string name = "sd_" + c + ".weight";
    std::map<std::string, at::Tensor> bnb;
    for (const auto& e : fixture()->entries())
      if (e.name.rfind(name, 0) == 0) bnb[e.name] = T(e.name);
    ASSERT_EQ(bnb.size(), 6u);
    const Nf4Tensor loaded = ciuic::quant::nf4_from_state_dict(name, bnb);
    const at::Tensor x = T(c + ".input");
    EXPECT_EQ(loaded.shape, x.sizes().vec());
    EXPECT_EQ(loaded.dtype, x.scalar_type());
    EXPECT_TRUE(
        at::equal(ciuic::quant::dequantize_nf4(loaded, x.scalar_type()), T(c + ".dequant_dq")));
    // Ours writes the same names, shapes and dtypes, and reads back to itself.
    const Nf4Tensor q = ciuic::quant::quantize_nf4(x);
    const auto sd = ciuic::quant::nf4_state_dict(name, q);
    ASSERT_EQ(sd.size(), bnb.size());
    for (const auto& [k, v] : sd) {
      ASSERT_TRUE(bnb.count(k)) << k;
      if (k.find("quant_state") == std::string::npos) {
        EXPECT_EQ(v.sizes(), bnb[k].sizes()) << k;
        EXPECT_EQ(v.scalar_type(), bnb[k].scalar_type()) << k;
      }
    }
    const Nf4Tensor back = ciuic::quant::nf4_from_state_dict(name, sd);
    EXPECT_TRUE(at::equal(ciuic::quant::dequantize_nf4(back, at::kFloat),
                          ciuic::quant::dequantize_nf4(q, at::kFloat)));
    EXPECT_EQ(back.offset, q.offset);
  }
}

TEST_F(Nf4, StateDictErrorsNameTheTensor) {
  const Nf4Tensor q = ciuic::quant::quantize_nf4(T("rect.input"));
  auto sd = ciuic::quant::nf4_state_dict("w", q);
  sd.erase("w.nested_absmax");
  try {
    ciuic::quant::nf4_from_state_dict("w", sd);
    FAIL() << "no error";
  } catch (const ciuic::Error& e) {
    EXPECT_NE(std::string(e.what()).find("w.nested_absmax"), std::string::npos) << e.what();
  }
  sd = ciuic::quant::nf4_state_dict("w", q);
  sd["w.absmax"] = sd["w.absmax"].narrow(0, 0, 3);
  EXPECT_THROW(ciuic::quant::nf4_from_state_dict("w", sd), ciuic::Error);
}

TEST_F(Nf4, RefusesBadInput) {
  EXPECT_THROW(ciuic::quant::quantize_nf4(at::zeros({8}, at::kInt)), ciuic::Error);
  EXPECT_THROW(ciuic::quant::quantize_nf4(at::zeros({8}), 48), ciuic::Error);
  EXPECT_THROW(ciuic::quant::quantize_nf4(at::zeros({0})), ciuic::Error);
  at::Tensor nan = at::zeros({8});
  nan[3] = std::nanf("");
  EXPECT_THROW(ciuic::quant::quantize_nf4(nan), ciuic::Error);
  const Nf4Tensor q = ciuic::quant::quantize_nf4(at::randn({4, 6}));
  EXPECT_THROW(ciuic::quant::dequantize_nf4(q, at::kInt), ciuic::Error);
  EXPECT_THROW(ciuic::quant::nf4_linear(at::randn({2, 5}), q), ciuic::Error);
  EXPECT_THROW(ciuic::quant::nf4_linear(at::randn({2, 6}), q, at::zeros({5})), ciuic::Error);
}

// nf4_linear equals at::linear over the dequantized weight, forward and backward; the weight gets
// no gradient, the bias one when it requires it.
TEST_F(Nf4, LinearForwardAndBackward) {
  for (const auto dt : {at::kFloat, at::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dt));
    const Nf4Tensor q = ciuic::quant::quantize_nf4(T("rect_fp16.input").reshape({70, 13}));
    const at::Tensor W = ciuic::quant::dequantize_nf4(q, dt);
    const at::Tensor x0 = at::randn({2, 3, 13}).to(dt), b0 = at::randn({70}).to(dt),
                     g = at::randn({2, 3, 70}).to(dt);
    const at::Tensor x = x0.clone().requires_grad_(true), b = b0.clone().requires_grad_(true);
    const at::Tensor y = ciuic::quant::nf4_linear(x, q, b);
    const at::Tensor xr = x0.clone().requires_grad_(true), br = b0.clone().requires_grad_(true);
    const at::Tensor yr = at::linear(xr, W, br);
    const double tol = dt == at::kFloat ? 1e-5 : 2e-2;  // matmul + add vs addmm: rounding
    EXPECT_TRUE(at::allclose(y, yr, tol, tol));
    const auto gs = torch::autograd::grad({y}, {x, b}, {g});
    const auto gr = torch::autograd::grad({yr}, {xr, br}, {g});
    EXPECT_TRUE(at::allclose(gs[0], gr[0], tol, tol));
    EXPECT_TRUE(at::allclose(gs[1], gr[1], tol, tol));
  }
  // Without a bias, and an input that needs no gradient: a plain product.
  const Nf4Tensor q = ciuic::quant::quantize_nf4(at::randn({8, 64}), 64, false);
  const at::Tensor x = at::randn({5, 64});
  EXPECT_TRUE(at::equal(ciuic::quant::nf4_linear(x, q),
                        at::linear(x, ciuic::quant::dequantize_nf4(q, at::kFloat))));
}

// On a CUDA device (label unit; skipped without one): quantizing a CUDA tensor gives the CPU's
// packed bits (CudaQuantizeEqualsCpu checks every field), and the CUDA dequantize kernel gives the
// CPU loops' values — exactly where the arithmetic is one product, within one rounding of the
// output dtype where nvcc may contract the double quantization's scale * code + offset into an FMA.
TEST_F(Nf4, CudaDequantizeEqualsCpu) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  for (const std::string& c : kCases) {
    for (bool dq : {false, true}) {
      SCOPED_TRACE(c + (dq ? " double-quantized" : ""));
      const at::Tensor x = T(c + ".input");
      const Nf4Tensor qc = ciuic::quant::quantize_nf4(x, 64, dq);
      const Nf4Tensor qg = ciuic::quant::quantize_nf4(x.to(at::kCUDA), 64, dq);
      ASSERT_TRUE(qg.packed.is_cuda());
      EXPECT_TRUE(at::equal(qg.packed.cpu(), qc.packed));
      for (const auto dt : {at::kFloat, at::kBFloat16, at::kHalf}) {
        const at::Tensor want = ciuic::quant::dequantize_nf4(qc, dt).to(at::kFloat);
        const at::Tensor got = ciuic::quant::dequantize_nf4(qg, dt).cpu().to(at::kFloat);
        const double rel = dt == at::kFloat ? 1e-6 : 1e-2;
        EXPECT_TRUE(at::allclose(got, want, rel, 0.0))
            << c10::toString(dt) << " max diff " << (got - want).abs().max().item<double>();
        if (!dq) EXPECT_TRUE(at::equal(got, want)) << c10::toString(dt);
      }
    }
  }
  const Nf4Tensor q =
      ciuic::quant::quantize_nf4(T("rect_fp16.input").reshape({70, 13}).to(at::kCUDA));
  const at::Tensor x = at::randn({2, 3, 13}).to(at::kBFloat16);
  const at::Tensor y = ciuic::quant::nf4_linear(x.to(at::kCUDA), q).cpu().to(at::kFloat);
  const at::Tensor yr =
      at::linear(x, ciuic::quant::dequantize_nf4(q, at::kBFloat16).cpu()).to(at::kFloat);
  EXPECT_TRUE(at::allclose(y, yr, 2e-2, 2e-2));
}

// Bit for bit: a float tensor compared through its int32 view, others with at::equal.
void expect_bits(const at::Tensor& got, const at::Tensor& want, const char* what) {
  ASSERT_EQ(got.scalar_type(), want.scalar_type()) << what;
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const at::Tensor g = got.cpu().contiguous(), w = want.cpu().contiguous();
  if (g.scalar_type() == at::kFloat)
    EXPECT_TRUE(at::equal(g.view(at::kInt), w.view(at::kInt))) << what;
  else
    EXPECT_TRUE(at::equal(g, w)) << what;
}

void expect_same_nf4(const Nf4Tensor& g, const Nf4Tensor& c) {
  EXPECT_TRUE(g.packed.is_cuda());
  EXPECT_TRUE(g.absmax.is_cuda());
  EXPECT_EQ(g.shape, c.shape);
  EXPECT_EQ(g.dtype, c.dtype);
  EXPECT_EQ(g.blocksize, c.blocksize);
  ASSERT_EQ(g.double_quant(), c.double_quant());
  expect_bits(g.packed, c.packed, "packed");
  expect_bits(g.code, c.code, "code");
  expect_bits(g.absmax, c.absmax, "absmax");
  if (c.double_quant()) {
    EXPECT_EQ(std::bit_cast<uint32_t>(g.offset), std::bit_cast<uint32_t>(c.offset)) << "offset";
    expect_bits(g.code2, c.code2, "code2");
    expect_bits(g.absmax2, c.absmax2, "absmax2");
  }
}

// On a CUDA device in a CUDA build (skipped otherwise): quantize_nf4 of a CUDA tensor runs the
// quant/cuda kernels and gives the CPU loops' bits — packed nibbles, the fp32 absmax, and with
// double quantization the offset, the 8-bit codes and absmax2 — for every fixture case and block
// size, each input dtype, tensors of several nested blocks with a short last block, an odd count,
// all-zero blocks and outliers; a non-finite element is refused as on the CPU.
TEST_F(Nf4, CudaQuantizeEqualsCpu) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  if (!ciuic::quant::nf4_quantizes_on(at::kCUDA))
    GTEST_SKIP() << "a CPU build: quantize_nf4 runs on the CPU for CUDA tensors";
  std::vector<std::pair<std::string, at::Tensor>> inputs;
  for (const std::string& c : kCases) inputs.emplace_back(c, T(c + ".input"));
  at::manual_seed(7);
  at::Tensor big = at::randn({1000, 777}) * 0.02;  // 12141 blocks of 64 (the last 40 long)
  big.narrow(0, 10, 3).zero_();                    // whole zero blocks
  big[500][3] = 60.0;                              // an outlier block
  big[900][700] = -3e-30;
  for (const auto dt : {at::kFloat, at::kBFloat16, at::kHalf})
    inputs.emplace_back(std::string("big ") + c10::toString(dt), big.to(dt));
  inputs.emplace_back("odd 12345", at::randn({12345}));
  inputs.emplace_back("nested exactly", at::randn({256 * 64 * 3}));  // 3 full nested blocks
  for (const auto& [name, x] : inputs)
    for (const int64_t bs : {32, 64, 128, 4096})
      for (const bool dq : {false, true}) {
        SCOPED_TRACE(name + " blocksize " + std::to_string(bs) + (dq ? " double-quantized" : ""));
        expect_same_nf4(ciuic::quant::quantize_nf4(x.to(at::kCUDA), bs, dq),
                        ciuic::quant::quantize_nf4(x, bs, dq));
      }
  at::Tensor bad = at::randn({300});
  bad[299] = std::numeric_limits<float>::infinity();
  EXPECT_THROW(ciuic::quant::quantize_nf4(bad.to(at::kCUDA)), ciuic::Error);
  bad[299] = std::nanf("");
  EXPECT_THROW(ciuic::quant::quantize_nf4(bad.to(at::kCUDA).to(at::kBFloat16), 64, false),
               ciuic::Error);
}

TEST(Nf4Size, CountsThePlannerBytes) {
  // 4096 x 4096: 8 Mi packed bytes, 262144 blocks -> 262144 uint8 codes + 1024 fp32 absmax2.
  EXPECT_EQ(ciuic::quant::nf4_bytes(4096 * 4096), 8388608 + 64 + 262144 + 1024 * 4 + 1024 + 4);
  EXPECT_EQ(ciuic::quant::nf4_bytes(4096 * 4096, 64, false), 8388608 + 64 + 262144 * 4);
  EXPECT_EQ(ciuic::quant::nf4_bytes(0), 0);
  EXPECT_EQ(ciuic::quant::nf4_bytes(33), 17 + 64 + 1 + 4 + 1024 + 4);
}

}  // namespace
