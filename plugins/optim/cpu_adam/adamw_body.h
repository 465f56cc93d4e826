// The AdamW loop of adamw_kernel.h, written once over an instruction-set "Ops" type. Each
// kernel_<isa>.cpp includes this file inside its target region (so every function here is
// compiled for that instruction set) with its own Ops:
//
//   struct Ops {
//     using V = ...;                 // W fp32 lanes
//     static constexpr int W;
//     static V set1(float), load(const float*), add(V,V), mul(V,V), div(V,V), sqrt(V),
//              fma(V a, V b, V c) /* a*b+c, one rounding */;
//     static void store(float*, V);
//     template <Dtype D> static V load_grad(const void*);   // W elements of D -> fp32
//     template <Dtype D> static void store_out(void*, V);   // fp32 -> W elements of D (RNE)
//   };
//
// The ragged end of a range (fewer than W elements) goes through the same vector code on padded
// local copies, so every element sees the same instruction sequence.
#pragma once

#include <cstring>

#include "adamw_kernel.h"

namespace ciuic_cpu_adam {
namespace {

template <class Ops>
struct AdamWLoop {
  using V = typename Ops::V;
  static constexpr int W = Ops::W;

  struct Consts {
    V grad_scale, decay, beta1, one_minus_beta1, beta2, one_minus_beta2, bc2_sqrt, eps, neg_step;
  };

  static Consts consts(const KernelArgs& a) {
    const Coefficients& c = a.c;
    return {Ops::set1(c.grad_scale),
            Ops::set1(a.decay),
            Ops::set1(c.beta1),
            Ops::set1(c.one_minus_beta1),
            Ops::set1(c.beta2),
            Ops::set1(c.one_minus_beta2),
            Ops::set1(c.bias_correction2_sqrt),
            Ops::set1(c.eps),
            Ops::set1(c.neg_step_size)};
  }

  // W elements. OutD < 0: no copy-back.
  template <Dtype G, int OutD>
  static inline void block(const Consts& k, float* p, float* m, float* v, const void* g,
                           void* out) {
    const V gv = Ops::mul(Ops::template load_grad<G>(g), k.grad_scale);
    V pv = Ops::mul(Ops::load(p), k.decay);
    const V mv = Ops::fma(gv, k.one_minus_beta1, Ops::mul(Ops::load(m), k.beta1));
    const V vv = Ops::fma(Ops::mul(k.one_minus_beta2, gv), gv, Ops::mul(Ops::load(v), k.beta2));
    const V denom = Ops::add(Ops::div(Ops::sqrt(vv), k.bc2_sqrt), k.eps);
    pv = Ops::add(pv, Ops::div(Ops::mul(k.neg_step, mv), denom));
    Ops::store(p, pv);
    Ops::store(m, mv);
    Ops::store(v, vv);
    if constexpr (OutD >= 0) Ops::template store_out<static_cast<Dtype>(OutD)>(out, pv);
  }

  template <Dtype G, int OutD>
  static void range(const KernelArgs& a) {
    const Consts k = consts(a);
    constexpr int64_t gs = G == Dtype::kF32 ? 4 : 2;
    constexpr int64_t os = OutD == static_cast<int>(Dtype::kF32) ? 4 : 2;
    const char* g = static_cast<const char*>(a.grad);
    char* out = static_cast<char*>(a.out);
    int64_t i = 0;
    for (; i + W <= a.n; i += W)
      block<G, OutD>(k, a.p + i, a.m + i, a.v + i, g + i * gs, OutD >= 0 ? out + i * os : nullptr);
    if constexpr (W == 1) {
      return;
    } else {
      tail<G, OutD>(k, a, i, g, out);
    }
  }

  // Elements [i, n), fewer than W, through padded local copies.
  template <Dtype G, int OutD>
  static void tail(const Consts& k, const KernelArgs& a, int64_t i, const char* g, char* out) {
    constexpr int64_t gs = G == Dtype::kF32 ? 4 : 2;
    constexpr int64_t os = OutD == static_cast<int>(Dtype::kF32) ? 4 : 2;
    const int64_t rest = a.n - i;
    if (rest <= 0 || rest >= W) return;  // (never: the vector loop left 0 < rest < W)
    alignas(64) float p[W] = {}, m[W] = {}, v[W] = {};
    alignas(64) char gb[W * 4] = {}, ob[W * 4] = {};
    std::memcpy(p, a.p + i, rest * 4);
    std::memcpy(m, a.m + i, rest * 4);
    std::memcpy(v, a.v + i, rest * 4);
    std::memcpy(gb, g + i * gs, rest * gs);
    block<G, OutD>(k, p, m, v, gb, ob);
    std::memcpy(a.p + i, p, rest * 4);
    std::memcpy(a.m + i, m, rest * 4);
    std::memcpy(a.v + i, v, rest * 4);
    if constexpr (OutD >= 0) std::memcpy(out + i * os, ob, rest * os);
  }

  template <Dtype G>
  static void with_grad(const KernelArgs& a) {
    if (!a.out) return range<G, -1>(a);
    switch (a.out_dtype) {
      case Dtype::kF32: return range<G, static_cast<int>(Dtype::kF32)>(a);
      case Dtype::kBF16: return range<G, static_cast<int>(Dtype::kBF16)>(a);
      case Dtype::kF16: return range<G, static_cast<int>(Dtype::kF16)>(a);
    }
  }

  static void run(const KernelArgs& a) {
    switch (a.grad_dtype) {
      case Dtype::kF32: return with_grad<Dtype::kF32>(a);
      case Dtype::kBF16: return with_grad<Dtype::kBF16>(a);
      case Dtype::kF16: return with_grad<Dtype::kF16>(a);
    }
  }
};

}  // namespace
}  // namespace ciuic_cpu_adam
