// The fused CUDA kernels (model/fused_ops.h) against the ATen compositions they replace, forward
// and backward, in fp32, bf16 and fp16, at odd sizes (head_dim not a multiple of 128, GQA,
// element counts not a multiple of the vector width, unaligned views, strided gradients), and
// the model with them on against it with them off. Skipped without a CUDA device.
#include <string>

#include <ATen/Context.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/addcmul.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/roll.h>
#include <ATen/ops/silu.h>
#include <gtest/gtest.h>

#include "model/fused_ops.h"
#include "model/llama.h"
#include "model_test_util.h"

namespace ciuic::model {
namespace {

using testing::max_rel_diff;

#define SKIP_WITHOUT_KERNELS()                                                       \
  if (!at::hasCUDA())                                                                \
    GTEST_SKIP() << "no CUDA device: the fused kernels' tests need one (label gpu)"; \
  if (!fused_kernels_built()) GTEST_SKIP() << "built without CUDA kernels"

c10::Device cuda() { return c10::Device(c10::kCUDA, 0); }

// Tolerances against the fp32 reference of the same (rounded) inputs: one rounding of the result
// for the fused kernel; the composition rounds more often, so it is held to twice as much.
double tol(at::ScalarType t) { return t == at::kFloat ? 2e-6 : t == at::kHalf ? 1.5e-3 : 1e-2; }

struct Case {
  int64_t b, t, heads, d;
};

TEST(FusedOps, RopeMatchesComposition) {
  SKIP_WITHOUT_KERNELS();
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16, at::kHalf}) {
    for (Case c : {Case{2, 33, 4, 64}, Case{1, 17, 3, 96}, Case{3, 8, 2, 30}, Case{1, 5, 1, 2}}) {
      SCOPED_TRACE(std::string(c10::toString(dt)) + " d=" + std::to_string(c.d) +
                   " heads=" + std::to_string(c.heads));
      at::manual_seed(11);
      LlamaConfig cfg;
      cfg.hidden_size = c.heads * c.d;
      cfg.num_attention_heads = c.heads;
      cfg.num_key_value_heads = c.heads;
      cfg.head_dim = c.d;
      const at::Tensor pos = at::randint(0, 4096, {c.b, c.t}, at::kLong).to(cuda());
      const RopeTables r = rope_tables(rope_inv_freq(cfg), pos, dt);
      const at::Tensor x =
          at::randn({c.b, c.t, c.heads, c.d}, at::TensorOptions().device(cuda())).to(dt);
      const at::Tensor g =
          at::randn({c.b, c.t, c.heads, c.d}, at::TensorOptions().device(cuda())).to(dt);
      // fp32 reference from the rounded inputs and tables.
      at::Tensor xr = x.to(at::kFloat).detach().clone().requires_grad_(true);
      const RopeTables rr{r.cos.to(at::kFloat), r.sin_signed.to(at::kFloat)};
      const at::Tensor ref = at::addcmul(xr * rr.cos, at::roll(xr, {c.d / 2}, {-1}), rr.sin_signed);
      ref.backward(g.to(at::kFloat));
      // Fused, with a gradient arriving as a transposed view (what attention hands back).
      at::Tensor xf = x.detach().clone().requires_grad_(true);
      const at::Tensor y = fused_rope(xf, r);
      EXPECT_TRUE(y.is_contiguous());
      EXPECT_EQ(y.scalar_type(), dt);
      EXPECT_LE(max_rel_diff(y, ref), tol(dt));
      const at::Tensor g_strided = g.transpose(1, 2).contiguous().transpose(1, 2);
      y.backward(g_strided);
      EXPECT_LE(max_rel_diff(xf.grad(), xr.grad()), tol(dt));
      // The composition in dt is no closer to the reference than twice the fused kernel's bound.
      at::Tensor xc = x.detach().clone().requires_grad_(true);
      const at::Tensor yc = at::addcmul(xc * r.cos, at::roll(xc, {c.d / 2}, {-1}), r.sin_signed);
      EXPECT_LE(max_rel_diff(yc, ref), 2 * tol(dt));
    }
  }
}

// The reference activation in fp32: silu, or PyTorch's tanh GELU (GeGLU, gemma3_text).
at::Tensor act_ref(const at::Tensor& g, Activation act) {
  return act == Activation::kGeluTanh ? at::gelu(g, "tanh") : at::silu(g);
}
const char* act_name(Activation act) { return act == Activation::kGeluTanh ? "GeGLU" : "SwiGLU"; }

TEST(FusedOps, GatedActivationMatchesComposition) {
  SKIP_WITHOUT_KERNELS();
  for (Activation act : {Activation::kSilu, Activation::kGeluTanh})
    for (at::ScalarType dt : {at::kFloat, at::kBFloat16, at::kHalf}) {
      for (int64_t n : {int64_t{4096} * 8, int64_t{1001}, int64_t{7}}) {
        for (bool unaligned : {false, true}) {
          SCOPED_TRACE(std::string(act_name(act)) + " " + c10::toString(dt) +
                       " n=" + std::to_string(n) + (unaligned ? " unaligned" : ""));
          at::manual_seed(5);
          const auto opts = at::TensorOptions().device(cuda());
          // Unaligned: views starting one element into their storage (no 16-byte loads).
          auto make = [&](double scale) { return (at::randn({n + 1}, opts) * scale).to(dt); };
          const at::Tensor gate_base = make(3.0), up_base = make(1.0), dy_base = make(1.0);
          auto view = [&](const at::Tensor& t) { return t.narrow(0, unaligned ? 1 : 0, n); };
          at::Tensor gr = view(gate_base).to(at::kFloat).clone().requires_grad_(true);
          at::Tensor ur = view(up_base).to(at::kFloat).clone().requires_grad_(true);
          const at::Tensor ref = act_ref(gr, act) * ur;
          ref.backward(view(dy_base).to(at::kFloat));
          at::Tensor gb = gate_base.clone().requires_grad_(true),
                     ub = up_base.clone().requires_grad_(true);
          const at::Tensor y = fused_glu(view(gb), view(ub), act);
          EXPECT_LE(max_rel_diff(y, ref), tol(dt));
          y.backward(view(dy_base));
          EXPECT_LE(max_rel_diff(view(gb.grad()), gr.grad()), tol(dt));
          EXPECT_LE(max_rel_diff(view(ub.grad()), ur.grad()), tol(dt));
        }
      }
    }
}

TEST(FusedOps, GatedDownMatchesComposition) {
  SKIP_WITHOUT_KERNELS();
  for (Activation act : {Activation::kSilu, Activation::kGeluTanh})
    for (at::ScalarType dt : {at::kFloat, at::kBFloat16, at::kHalf}) {
      SCOPED_TRACE(std::string(act_name(act)) + " " + c10::toString(dt));
      at::manual_seed(8);
      const auto opts = at::TensorOptions().device(cuda());
      const int64_t b = 3, t = 7, inter = 333,
                    hidden = 52;  // nothing a multiple of the vector width
      const at::Tensor gate = (at::randn({b, t, inter}, opts) * 2).to(dt),
                       up = at::randn({b, t, inter}, opts).to(dt);
      const at::Tensor w = (at::randn({hidden, inter}, opts) * 0.05).to(dt);
      const at::Tensor dy = at::randn({b, t, hidden}, opts).to(dt);
      at::Tensor gr = gate.to(at::kFloat).clone().requires_grad_(true),
                 ur = up.to(at::kFloat).clone().requires_grad_(true),
                 wr = w.to(at::kFloat).clone().requires_grad_(true);
      const at::Tensor ref = at::linear(act_ref(gr, act) * ur, wr);
      ref.backward(dy.to(at::kFloat));
      at::Tensor gf = gate.clone().requires_grad_(true), uf = up.clone().requires_grad_(true),
                 wf = w.clone().requires_grad_(true);
      const at::Tensor y = fused_glu_down(gf, uf, wf, act);
      y.backward(dy);
      // A matmul over `inter` terms in the dtype: a looser bound than one rounding.
      const double t_mm = dt == at::kFloat ? 1e-5 : 2e-2;
      EXPECT_LE(max_rel_diff(y, ref), t_mm);
      EXPECT_LE(max_rel_diff(gf.grad(), gr.grad()), t_mm);
      EXPECT_LE(max_rel_diff(uf.grad(), ur.grad()), t_mm);
      EXPECT_LE(max_rel_diff(wf.grad(), wr.grad()), t_mm);
    }
}

TEST(FusedOps, ModelWithKernelsMatchesModelWithout) {
  SKIP_WITHOUT_KERNELS();
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dt));
    LlamaConfig cfg;
    cfg.hidden_size = 192;  // heads of 48: not a multiple of 128
    cfg.num_attention_heads = 4;
    cfg.num_key_value_heads = 2;  // GQA
    cfg.head_dim = 48;
    cfg.intermediate_size = 333;
    cfg.num_hidden_layers = 2;
    cfg.vocab_size = 211;
    cfg.max_position_embeddings = 64;
    cfg.tie_word_embeddings = false;
    LlamaModel m(cfg, dt, cuda());
    m.init_random(7, 0.05);
    EXPECT_TRUE(m.fused_kernels());
    const at::Tensor ids = at::randint(0, cfg.vocab_size, {2, 40}, at::kLong).to(cuda());
    const at::Tensor labels = ids.roll({-1}, {1});
    std::vector<std::vector<at::Tensor>> grads;
    std::vector<at::Tensor> losses;
    for (bool fused : {true, false}) {
      m.set_fused_kernels(fused);
      ASSERT_EQ(m.fused_kernels(), fused);
      for (auto& p : m.parameters()) p.mutable_grad() = at::Tensor();
      const at::Tensor loss = m.loss_sum(ids, labels, {}, false);
      loss.backward();
      losses.push_back(loss.detach());
      grads.emplace_back();
      for (auto& p : m.parameters()) grads.back().push_back(p.grad().clone());
    }
    const double t = dt == at::kFloat ? 1e-5 : 3e-2;
    EXPECT_LE(max_rel_diff(losses[0], losses[1]), dt == at::kFloat ? 1e-6 : 1e-2);
    for (size_t i = 0; i < grads[0].size(); ++i)
      EXPECT_LE(max_rel_diff(grads[0][i], grads[1][i]), t) << "parameter " << i;
  }
}

TEST(FusedOps, LossModesAgreeOnCudaInBfloat16) {
  SKIP_WITHOUT_KERNELS();
  at::manual_seed(9);
  const auto opts = at::TensorOptions().device(cuda());
  const int64_t n = 300, h = 136, v = 1000;
  const at::Tensor hidden = at::randn({n, h}, opts).to(at::kBFloat16);
  const at::Tensor weight = (at::randn({v, h}, opts) * 0.1).to(at::kBFloat16);
  const at::Tensor labels = at::randint(0, v, {n}, at::kLong).to(cuda());
  std::vector<at::Tensor> gh, gw, loss;
  // Recompute, in-forward with one chunk, in-forward with 7 token chunks (fp32 accumulation).
  for (auto [mode, chunk] : {std::pair{LossBackward::kRecompute, int64_t{1} << 26},
                             std::pair{LossBackward::kInForward, int64_t{1} << 26},
                             std::pair{LossBackward::kInForward, int64_t{50} * v}}) {
    at::Tensor xh = hidden.clone().requires_grad_(true), xw = weight.clone().requires_grad_(true);
    const at::Tensor l = linear_cross_entropy_sum(xh, xw, labels, chunk, mode);
    l.backward(at::full({}, 0.5f, opts));
    loss.push_back(l.detach());
    gh.push_back(xh.grad());
    gw.push_back(xw.grad());
  }
  for (size_t i = 1; i < loss.size(); ++i) {
    EXPECT_LE(max_rel_diff(loss[i], loss[0]), 1e-5) << i;
    EXPECT_LE(max_rel_diff(gh[i], gh[0]), 1e-2) << i;
    EXPECT_LE(max_rel_diff(gw[i], gw[0]), 1e-2) << i;
  }
}

}  // namespace
}  // namespace ciuic::model
