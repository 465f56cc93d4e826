// model/cpu_skinny_gemm_body.h — the loops of the skinny GEMM kernels, generic over an `Ops` type
// of SIMD operations (internal; included once per ISA inside that ISA's target region, in an
// anonymous namespace of its own, so every instantiation is the including file's own).
//
// Ops provides: V (the vector type), kLanes (floats per V), kPrefetch (whether prefetch(p) brings
// p's cache line into L2), zero(), load(p) (kLanes floats),
// load_tail(p, n) (n < kLanes floats, the rest zero, nothing read past p + n), fma(a, b, c)
// (a * b + c), reduce(v) (the sum of v's lanes), in_register(v) (v, kept in a register: without
// it GCC folds each x load into NB FMAs' memory operands, which made an 8-row tile bound by loads,
// 305 vs 240 us hot for 8 x 768 x 2048), and block<MT>() (W rows per register tile of MT
// rows of x: a divisor of kRowChunk, chosen so that the MT x block accumulators, block W vectors
// and one x vector fit the ISA's registers).
//
// Per register tile (MT rows of x, NB rows of W): for each kLanes-wide column slice, the NB W
// vectors are loaded once and each of the MT x vectors is multiplied into its NB accumulators;
// the accumulators are reduced once, at the end of the row. W is read exactly once per tile of x
// rows: 16 rows of x are two tiles of 8, the second reading each chunk of kRowChunk W rows again
// from the cache, not from memory.
#pragma once

#include <algorithm>
#include <cstdint>

#include "model/cpu_skinny_gemm_kernel.h"

#if defined(__clang__)
#define CIUIC_SKINNY_UNROLL _Pragma("unroll")
#else
#define CIUIC_SKINNY_UNROLL _Pragma("GCC unroll 32")
#endif

namespace ciuic::model::skinny {
namespace {

// How far ahead of a tile's rows W is prefetched: 20 KB, about the bytes in flight at this VM's
// 27 GB/s and a loaded memory latency of a few hundred ns (16-24 KB measured best in
// bench/model/skinny_bench.cpp, one thread; without prefetching up to 2x slower at 8 rows).
constexpr int64_t kPrefetchFloats = 5120;

template <class Ops, int MT, int NB>
inline void skinny_tile(const Args& a, int64_t m0, int64_t n0) {
  using V = typename Ops::V;
  constexpr int L = Ops::kLanes;
  V acc[NB][MT];
  CIUIC_SKINNY_UNROLL
  for (int j = 0; j < NB; ++j) {
    CIUIC_SKINNY_UNROLL
    for (int i = 0; i < MT; ++i) acc[j][i] = Ops::zero();
  }
  const float* w[NB];
  const float* x[MT];
  CIUIC_SKINNY_UNROLL
  for (int j = 0; j < NB; ++j) w[j] = a.w + (n0 + j) * a.ldw;
  CIUIC_SKINNY_UNROLL
  for (int i = 0; i < MT; ++i) x[i] = a.x + (m0 + i) * a.ldx;
  const int64_t kv = a.k / L * L;
  int64_t k = 0;
  // W read ahead into L2: each step prefetches the same columns of the rows `ahead` floats further
  // on (the first whole tile at least kPrefetchFloats ahead). The hardware prefetchers alone left
  // the 8-row products' reads unoverlapped with the arithmetic (the 32000 x 768 head took 10.7 ms
  // cold, 5.5 ms with this). Past W's end the prefetches are harmless (they never fault).
  const int64_t tile_floats = NB * a.ldw;
  const int64_t ahead = (kPrefetchFloats + tile_floats - 1) / tile_floats * tile_floats;
  for (; k < kv; k += L) {
    if constexpr (Ops::kPrefetch) {
      CIUIC_SKINNY_UNROLL
      for (int j = 0; j < NB; ++j) Ops::prefetch(w[j] + ahead + k);
    }
    V wv[NB];
    CIUIC_SKINNY_UNROLL
    for (int j = 0; j < NB; ++j) wv[j] = Ops::load(w[j] + k);
    CIUIC_SKINNY_UNROLL
    for (int i = 0; i < MT; ++i) {
      const V xv = Ops::in_register(Ops::load(x[i] + k));
      CIUIC_SKINNY_UNROLL
      for (int j = 0; j < NB; ++j) acc[j][i] = Ops::fma(wv[j], xv, acc[j][i]);
    }
  }
  if (k < a.k) {
    const int rest = static_cast<int>(a.k - k);
    V wv[NB];
    CIUIC_SKINNY_UNROLL
    for (int j = 0; j < NB; ++j) wv[j] = Ops::load_tail(w[j] + k, rest);
    CIUIC_SKINNY_UNROLL
    for (int i = 0; i < MT; ++i) {
      const V xv = Ops::load_tail(x[i] + k, rest);
      CIUIC_SKINNY_UNROLL
      for (int j = 0; j < NB; ++j) acc[j][i] = Ops::fma(wv[j], xv, acc[j][i]);
    }
  }
  CIUIC_SKINNY_UNROLL
  for (int i = 0; i < MT; ++i) {
    float* y = a.y + (m0 + i) * a.ldy + n0;
    CIUIC_SKINNY_UNROLL
    for (int j = 0; j < NB; ++j) {
      const float s = Ops::reduce(acc[j][i]);
      y[j] = a.bias ? s + a.bias[n0 + j] : s;
    }
  }
}

// MT rows of x from m0 against W rows [n_begin, n_end): full blocks, then single rows.
template <class Ops, int MT>
inline void skinny_rows(const Args& a, int64_t m0, int64_t n_begin, int64_t n_end) {
  constexpr int NB = Ops::template block<MT>();
  static_assert(kRowChunk % NB == 0, "block must divide kRowChunk");
  int64_t n = n_begin;
  for (; n + NB <= n_end; n += NB) skinny_tile<Ops, MT, NB>(a, m0, n);
  for (; n < n_end; ++n) skinny_tile<Ops, MT, 1>(a, m0, n);
}

// The whole kernel on one thread: W rows [n_begin, n_end) in chunks of kRowChunk, each against
// every tile of x (ceil(rows / 8) tiles of balanced sizes: 9 rows are 4 + 5, 16 are 8 + 8).
template <class Ops>
inline void skinny_run(const Args& a, int64_t n_begin, int64_t n_end) {
  const int64_t tiles = (a.rows + 7) / 8;
  for (int64_t c = n_begin; c < n_end; c += kRowChunk) {
    const int64_t ce = std::min(c + kRowChunk, n_end);
    int64_t m0 = 0;
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t mt = (a.rows - m0) / (tiles - t);
      switch (mt) {
        case 1: skinny_rows<Ops, 1>(a, m0, c, ce); break;
        case 2: skinny_rows<Ops, 2>(a, m0, c, ce); break;
        case 3: skinny_rows<Ops, 3>(a, m0, c, ce); break;
        case 4: skinny_rows<Ops, 4>(a, m0, c, ce); break;
        case 5: skinny_rows<Ops, 5>(a, m0, c, ce); break;
        case 6: skinny_rows<Ops, 6>(a, m0, c, ce); break;
        case 7: skinny_rows<Ops, 7>(a, m0, c, ce); break;
        default: skinny_rows<Ops, 8>(a, m0, c, ce); break;
      }
      m0 += mt;
    }
  }
}

}  // namespace
}  // namespace ciuic::model::skinny
