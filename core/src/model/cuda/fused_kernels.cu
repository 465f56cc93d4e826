// The model's fused CUDA kernels (model/cuda/fused_kernels.h). Memory-bound elementwise work:
// each kernel reads its inputs once and writes its outputs once, computing in fp32.
#include "model/cuda/fused_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "base/cuda/float_convert.cuh"

namespace ciuic::model::cuda {
namespace {

using ciuic::cuda::from_f;
using ciuic::cuda::to_f;

const char* launched() {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

constexpr int kThreads = 256;

int64_t blocks_for(int64_t work, int64_t per_thread = 1) {
  const int64_t threads = (work + per_thread - 1) / per_thread;
  const int64_t b = (threads + kThreads - 1) / kThreads;
  return b < 1 ? 1 : (b > 65535 * 32 ? 65535 * 32 : b);  // grid-stride loops cover the rest
}

// ---- rotary embedding ------------------------------------------------------------------------
// One block per position (b, t); its threads take the (head, i < half) pairs of that position:
// read x[i], x[i + half] and the four table entries, write out[i], out[i + half]. 32-bit index
// arithmetic inside the position (heads * half < 2^31 always holds for a real model).
template <typename T>
__global__ void rope_kernel(const T* __restrict__ x, const T* __restrict__ cos,
                            const T* __restrict__ sin, T* __restrict__ out, int seq, int heads,
                            int half, int64_t batch_stride, int64_t seq_stride, int64_t head_stride,
                            bool backward) {
  const int64_t r = blockIdx.x;  // position b * seq + t
  const T* xr = x + (r / seq) * batch_stride + (r % seq) * seq_stride;
  const T* cp = cos + r * 2 * half;
  const T* sp = sin + r * 2 * half;
  T* orow = out + r * static_cast<int64_t>(heads) * 2 * half;
  const int pairs = heads * half;
  for (int j = threadIdx.x; j < pairs; j += blockDim.x) {
    const int h = j / half;
    const int i = j - h * half;
    const T* xp = xr + h * head_stride;
    const float x1 = to_f(xp[i]), x2 = to_f(xp[i + half]);
    const float c1 = to_f(cp[i]), c2 = to_f(cp[i + half]);
    const float s1 = to_f(sp[i]), s2 = to_f(sp[i + half]);
    float o1, o2;
    if (!backward) {
      o1 = x1 * c1 + x2 * s1;
      o2 = x2 * c2 + x1 * s2;
    } else {
      o1 = x1 * c1 + x2 * s2;
      o2 = x2 * c2 + x1 * s1;
    }
    T* op = orow + h * 2 * half;
    op[i] = from_f<T>(o1);
    op[i + half] = from_f<T>(o2);
  }
}

template <typename T>
const char* rope_t(const void* x, const void* cos, const void* sin, void* out, int64_t batch,
                   int64_t seq, int64_t heads, int64_t half, int64_t batch_stride,
                   int64_t seq_stride, int64_t head_stride, bool backward, cudaStream_t stream) {
  const int64_t rows = batch * seq;
  if (rows == 0 || heads * half == 0) return nullptr;
  if (rows > 2147483647LL || heads * half > 2147483647LL / 2)
    return "rope: too many positions or heads for one launch";
  const int pairs = static_cast<int>(heads * half);
  const int threads = pairs >= 256 ? 256 : ((pairs + 31) / 32) * 32;
  rope_kernel<T><<<static_cast<unsigned>(rows), threads, 0, stream>>>(
      static_cast<const T*>(x), static_cast<const T*>(cos), static_cast<const T*>(sin),
      static_cast<T*>(out), static_cast<int>(seq), static_cast<int>(heads), static_cast<int>(half),
      batch_stride, seq_stride, head_stride, backward);
  return launched();
}

// ---- gated MLP activations: SwiGLU and GeGLU (tanh GELU) -------------------------------------
__device__ __forceinline__ float sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

// act(g) and act'(g) for the two activations. GELU's tanh form as PyTorch's gelu(approximate =
// "tanh") computes it: 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))).
template <Glu A>
struct Act;
template <>
struct Act<Glu::kSilu> {
  static __device__ __forceinline__ float f(float g) { return g * sigmoid(g); }
  static __device__ __forceinline__ float df(float g) {
    const float s = sigmoid(g);
    return s * (1.0f + g * (1.0f - s));
  }
};
template <>
struct Act<Glu::kGeluTanh> {
  static constexpr float kBeta = 0.7978845608028654f;  // sqrt(2 / pi)
  static constexpr float kKappa = 0.044715f;
  static __device__ __forceinline__ float f(float g) {
    return 0.5f * g * (1.0f + tanhf(kBeta * (g + kKappa * g * g * g)));
  }
  static __device__ __forceinline__ float df(float g) {
    const float t = tanhf(kBeta * (g + kKappa * g * g * g));
    return 0.5f * (1.0f + t) + 0.5f * g * (1.0f - t * t) * kBeta * (1.0f + 3.0f * kKappa * g * g);
  }
};

// V elements loaded and stored as one access: aligned to their own size (16 bytes for the vector
// path, the element's for V = 1).
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

// V elements per thread and iteration (16-byte loads when V = 16 / sizeof(T)).
template <typename T, int V, Glu A>
__global__ void glu_fwd_kernel(const T* __restrict__ gate, const T* __restrict__ up,
                               T* __restrict__ out, int64_t packs) {
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < packs;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const Pack<T, V> g = reinterpret_cast<const Pack<T, V>*>(gate)[p];
    const Pack<T, V> u = reinterpret_cast<const Pack<T, V>*>(up)[p];
    Pack<T, V> o;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float gf = to_f(g.v[k]);
      o.v[k] = from_f<T>(Act<A>::f(gf) * to_f(u.v[k]));
    }
    reinterpret_cast<Pack<T, V>*>(out)[p] = o;
  }
}

template <typename T, int V, Glu A>
__global__ void glu_bwd_kernel(const T* __restrict__ gate, const T* __restrict__ up,
                               const T* __restrict__ grad, T* __restrict__ d_gate,
                               T* __restrict__ d_up, int64_t packs) {
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < packs;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const Pack<T, V> g = reinterpret_cast<const Pack<T, V>*>(gate)[p];
    const Pack<T, V> u = reinterpret_cast<const Pack<T, V>*>(up)[p];
    const Pack<T, V> dy = reinterpret_cast<const Pack<T, V>*>(grad)[p];
    Pack<T, V> dg, du;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float gf = to_f(g.v[k]), uf = to_f(u.v[k]), df = to_f(dy.v[k]);
      du.v[k] = from_f<T>(df * Act<A>::f(gf));
      dg.v[k] = from_f<T>(df * uf * Act<A>::df(gf));
    }
    reinterpret_cast<Pack<T, V>*>(d_gate)[p] = dg;
    reinterpret_cast<Pack<T, V>*>(d_up)[p] = du;
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

template <typename T, Glu A>
const char* glu_fwd_t(const void* gate, const void* up, void* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return nullptr;
  constexpr int kV = 16 / sizeof(T);
  if (n % kV == 0 && aligned16(gate) && aligned16(up) && aligned16(out)) {
    glu_fwd_kernel<T, kV, A><<<static_cast<unsigned>(blocks_for(n / kV)), kThreads, 0, stream>>>(
        static_cast<const T*>(gate), static_cast<const T*>(up), static_cast<T*>(out), n / kV);
  } else {
    glu_fwd_kernel<T, 1, A><<<static_cast<unsigned>(blocks_for(n)), kThreads, 0, stream>>>(
        static_cast<const T*>(gate), static_cast<const T*>(up), static_cast<T*>(out), n);
  }
  return launched();
}

template <typename T, Glu A>
const char* glu_bwd_t(const void* gate, const void* up, const void* grad, void* d_gate, void* d_up,
                      int64_t n, cudaStream_t stream) {
  if (n == 0) return nullptr;
  constexpr int kV = 16 / sizeof(T);
  if (n % kV == 0 && aligned16(gate) && aligned16(up) && aligned16(grad) && aligned16(d_gate) &&
      aligned16(d_up)) {
    glu_bwd_kernel<T, kV, A><<<static_cast<unsigned>(blocks_for(n / kV)), kThreads, 0, stream>>>(
        static_cast<const T*>(gate), static_cast<const T*>(up), static_cast<const T*>(grad),
        static_cast<T*>(d_gate), static_cast<T*>(d_up), n / kV);
  } else {
    glu_bwd_kernel<T, 1, A><<<static_cast<unsigned>(blocks_for(n)), kThreads, 0, stream>>>(
        static_cast<const T*>(gate), static_cast<const T*>(up), static_cast<const T*>(grad),
        static_cast<T*>(d_gate), static_cast<T*>(d_up), n);
  }
  return launched();
}

// ---- RMSNorm and the per-head q/k norm + rotary embedding -------------------------------------
// transformers' rounding points: LlamaRMSNorm/Qwen3RMSNorm cast the normalised x * rstd to the
// input dtype and multiply by the weight in that dtype (y = round(w * round(n))); Gemma3RMSNorm
// multiplies by (1 + w) in fp32 and rounds once (y = round(n (1 + w))). Both are
// y = round(normed(n) * scale) with normed() below; normed(n) is also d_w's factor of dy.
template <typename T>
__device__ __forceinline__ float normed(float n, bool gemma) {
  return gemma ? n : to_f(from_f<T>(n));
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the block (blockDim.x a multiple of 32), returned to every thread; `red` holds 32.
__device__ __forceinline__ float block_sum(float v, float* red) {
  v = warp_sum(v);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();  // red is free (an earlier call's reads are done)
  if (lane == 0) red[warp] = v;
  __syncthreads();
  return warp_sum(lane < static_cast<int>(blockDim.x >> 5) ? red[lane] : 0.0f);
}

constexpr int64_t kNormParts = 1024;  // most blocks of a backward: rows of the d_w partials

// Hidden-size rows: one block per row (grid-stride over rows); thread c takes columns c,
// c + blockDim.x, ... in both passes (the second re-reads x from cache).
template <typename T>
__global__ void rms_norm_fwd_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                    T* __restrict__ y, int64_t rows, int d, float eps, bool gemma) {
  __shared__ float red[32];
  const float off = gemma ? 1.0f : 0.0f;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * d;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
      const float v = to_f(xr[c]);
      ss += v * v;
    }
    const float r = rsqrtf(block_sum(ss, red) / static_cast<float>(d) + eps);
    T* yr = y + row * d;
    for (int c = threadIdx.x; c < d; c += blockDim.x)
      yr[c] = from_f<T>(normed<T>(to_f(xr[c]) * r, gemma) * (to_f(w[c]) + off));
  }
}

// dx = rstd (dn - n mean(dn n)) with n = x rstd, dn = dy scale; d_w = sum over rows of
// dy normed(n), accumulated per block in shared memory (or, past 48 KiB of columns, in the
// block's own row of d_w_parts), each column owned by one thread: no atomics.
template <typename T>
__global__ void rms_norm_bwd_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                    const T* __restrict__ grad, T* __restrict__ dx,
                                    float* __restrict__ d_w_parts, int64_t rows, int d, float eps,
                                    bool gemma, bool shared_acc) {
  extern __shared__ float smem[];
  __shared__ float red[32];
  const float off = gemma ? 1.0f : 0.0f;
  float* acc = d_w_parts == nullptr ? nullptr
               : shared_acc         ? smem
                                    : d_w_parts + static_cast<int64_t>(blockIdx.x) * d;
  if (acc)
    for (int c = threadIdx.x; c < d; c += blockDim.x) acc[c] = 0.0f;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * d;
    const T* gr = grad + row * d;
    float ss = 0.0f, gx = 0.0f;
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
      const float v = to_f(xr[c]);
      ss += v * v;
      gx += to_f(gr[c]) * (to_f(w[c]) + off) * v;
    }
    ss = block_sum(ss, red);
    gx = block_sum(gx, red);
    const float r = rsqrtf(ss / static_cast<float>(d) + eps);
    const float m = r * gx / static_cast<float>(d);  // mean(dn n)
    T* dxr = dx + row * d;
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
      const float n = to_f(xr[c]) * r, dy = to_f(gr[c]);
      if (acc) acc[c] += dy * normed<T>(n, gemma);
      dxr[c] = from_f<T>(r * (dy * (to_f(w[c]) + off) - n * m));
    }
  }
  if (acc && shared_acc)
    for (int c = threadIdx.x; c < d; c += blockDim.x)
      d_w_parts[static_cast<int64_t>(blockIdx.x) * d + c] = smem[c];
}

constexpr int kSharedAccBytes = 48 * 1024;

int norm_threads(int64_t d) { return d >= 256 ? 256 : static_cast<int>(((d + 31) / 32) * 32); }

template <typename T>
const char* rms_norm_fwd_t(const void* x, const void* w, void* y, int64_t rows, int64_t d,
                           float eps, bool gemma, cudaStream_t stream) {
  if (rows == 0 || d == 0) return nullptr;
  if (d > 2147483647LL) return "rms_norm: rows too long";
  const int64_t blocks = rows < 65535 * 32 ? rows : 65535 * 32;
  rms_norm_fwd_kernel<T><<<static_cast<unsigned>(blocks), norm_threads(d), 0, stream>>>(
      static_cast<const T*>(x), static_cast<const T*>(w), static_cast<T*>(y), rows,
      static_cast<int>(d), eps, gemma);
  return launched();
}

template <typename T>
const char* rms_norm_bwd_t(const void* x, const void* w, const void* grad, void* dx,
                           float* d_w_parts, int64_t rows, int64_t d, float eps, bool gemma,
                           cudaStream_t stream) {
  if (rows == 0 || d == 0) return nullptr;
  if (d > 2147483647LL) return "rms_norm: rows too long";
  const bool shared_acc = d_w_parts != nullptr && d * 4 <= kSharedAccBytes;
  const size_t smem = shared_acc ? static_cast<size_t>(d) * 4 : 0;
  rms_norm_bwd_kernel<T>
      <<<static_cast<unsigned>(rms_norm_backward_blocks(rows)), norm_threads(d), smem, stream>>>(
          static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const T*>(grad),
          static_cast<T*>(dx), d_w_parts, rows, static_cast<int>(d), eps, gemma, shared_acc);
  return launched();
}

// Head rows (q/k norm + rope): one warp per row (b, t, head), grid-stride over rows. Lane l takes
// the rotary pairs (i, i + half) for i = l, l + 32, ... (P of them at most: 32 P >= half), so a
// pair's rotation stays in the lane and only the two row sums cross lanes.
constexpr int kWarpsPerBlock = 8;

struct HeadRows {
  int seq, heads, half;
  int64_t sb, st, sh;  // element strides of batch, position, head
  __device__ __forceinline__ int64_t offset(int64_t pos, int h) const {
    return (pos / seq) * sb + (pos % seq) * st + h * sh;
  }
};

template <typename T, int P>
__global__ void qk_norm_rope_fwd_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                        const T* __restrict__ cos, const T* __restrict__ sin,
                                        T* __restrict__ out, int64_t rows, HeadRows xs, float eps,
                                        bool gemma) {
  const int lane = threadIdx.x & 31, half = xs.half, d = 2 * half;
  const float off = gemma ? 1.0f : 0.0f;
  float w1[P], w2[P];
#pragma unroll
  for (int k = 0; k < P; ++k) {
    const int i = lane + 32 * k;
    w1[k] = i < half ? to_f(w[i]) + off : 0.0f;
    w2[k] = i < half ? to_f(w[i + half]) + off : 0.0f;
  }
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x >> 5);
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
       row < rows; row += warps) {
    const int64_t pos = row / xs.heads;
    const T* xp = x + xs.offset(pos, static_cast<int>(row - pos * xs.heads));
    float x1[P], x2[P], ss = 0.0f;
#pragma unroll
    for (int k = 0; k < P; ++k) {
      const int i = lane + 32 * k;
      x1[k] = i < half ? to_f(xp[i]) : 0.0f;
      x2[k] = i < half ? to_f(xp[i + half]) : 0.0f;
      ss += x1[k] * x1[k] + x2[k] * x2[k];
    }
    const float r = rsqrtf(warp_sum(ss) / static_cast<float>(d) + eps);
    const T* cp = cos + pos * d;
    const T* sp = sin + pos * d;
    T* op = out + row * d;
#pragma unroll
    for (int k = 0; k < P; ++k) {
      const int i = lane + 32 * k;
      if (i >= half) break;
      // The norm's output in the dtype, then the rotation from it.
      const float y1 = to_f(from_f<T>(normed<T>(x1[k] * r, gemma) * w1[k]));
      const float y2 = to_f(from_f<T>(normed<T>(x2[k] * r, gemma) * w2[k]));
      op[i] = from_f<T>(y1 * to_f(cp[i]) + y2 * to_f(sp[i]));
      op[i + half] = from_f<T>(y2 * to_f(cp[i + half]) + y1 * to_f(sp[i + half]));
    }
  }
}

// dy = rope's backward of the incoming gradient (in fp32, not rounded), then the norm's as in
// rms_norm_bwd_kernel; d_w per lane in registers, summed over the block's warps at the end.
template <typename T, int P>
__global__ void qk_norm_rope_bwd_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                        const T* __restrict__ cos, const T* __restrict__ sin,
                                        const T* __restrict__ grad, T* __restrict__ dx,
                                        float* __restrict__ d_w_parts, int64_t rows, HeadRows xs,
                                        HeadRows gs, float eps, bool gemma) {
  __shared__ float red[kWarpsPerBlock][64 * P];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, half = xs.half, d = 2 * half;
  const float off = gemma ? 1.0f : 0.0f;
  float w1[P], w2[P], a1[P], a2[P];
#pragma unroll
  for (int k = 0; k < P; ++k) {
    const int i = lane + 32 * k;
    w1[k] = i < half ? to_f(w[i]) + off : 0.0f;
    w2[k] = i < half ? to_f(w[i + half]) + off : 0.0f;
    a1[k] = a2[k] = 0.0f;
  }
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp; row < rows;
       row += warps) {
    const int64_t pos = row / xs.heads;
    const int h = static_cast<int>(row - pos * xs.heads);
    const T* xp = x + xs.offset(pos, h);
    const T* gp = grad + gs.offset(pos, h);
    const T* cp = cos + pos * d;
    const T* sp = sin + pos * d;
    float n1[P], n2[P], dy1[P], dy2[P], ss = 0.0f;
#pragma unroll
    for (int k = 0; k < P; ++k) {
      const int i = lane + 32 * k;
      n1[k] = n2[k] = dy1[k] = dy2[k] = 0.0f;
      if (i < half) {
        n1[k] = to_f(xp[i]);
        n2[k] = to_f(xp[i + half]);
        const float g1 = to_f(gp[i]), g2 = to_f(gp[i + half]);
        dy1[k] = g1 * to_f(cp[i]) + g2 * to_f(sp[i + half]);
        dy2[k] = g2 * to_f(cp[i + half]) + g1 * to_f(sp[i]);
      }
      ss += n1[k] * n1[k] + n2[k] * n2[k];
    }
    const float r = rsqrtf(warp_sum(ss) / static_cast<float>(d) + eps);
    float dot = 0.0f;
#pragma unroll
    for (int k = 0; k < P; ++k) {
      n1[k] *= r;
      n2[k] *= r;
      a1[k] += dy1[k] * normed<T>(n1[k], gemma);
      a2[k] += dy2[k] * normed<T>(n2[k], gemma);
      dy1[k] *= w1[k];  // now dn
      dy2[k] *= w2[k];
      dot += dy1[k] * n1[k] + dy2[k] * n2[k];
    }
    const float m = warp_sum(dot) / static_cast<float>(d);
    T* dp = dx + row * d;
#pragma unroll
    for (int k = 0; k < P; ++k) {
      const int i = lane + 32 * k;
      if (i >= half) break;
      dp[i] = from_f<T>(r * (dy1[k] - n1[k] * m));
      dp[i + half] = from_f<T>(r * (dy2[k] - n2[k] * m));
    }
  }
  if (d_w_parts == nullptr) return;
#pragma unroll
  for (int k = 0; k < P; ++k) {
    const int i = lane + 32 * k;
    if (i < half) {
      red[warp][i] = a1[k];
      red[warp][i + half] = a2[k];
    }
  }
  __syncthreads();
  for (int c = threadIdx.x; c < d; c += blockDim.x) {
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < kWarpsPerBlock; ++k) s += red[k][c];
    d_w_parts[static_cast<int64_t>(blockIdx.x) * d + c] = s;
  }
}

HeadRows head_rows(int64_t seq, int64_t heads, int64_t half, const int64_t strides[3]) {
  return HeadRows{static_cast<int>(seq),
                  static_cast<int>(heads),
                  static_cast<int>(half),
                  strides[0],
                  strides[1],
                  strides[2]};
}

const char* qk_check(int64_t batch, int64_t seq, int64_t heads, int64_t half) {
  if (half > 256) return "qk_norm_rope: head_dim over 512";
  if (seq > 2147483647LL || heads > 2147483647LL || batch * seq * heads > (int64_t{1} << 62))
    return "qk_norm_rope: too many positions or heads for one launch";
  return nullptr;
}

template <typename T, int P>
const char* qk_fwd_p(const void* x, const void* w, const void* cos, const void* sin, void* out,
                     int64_t rows, HeadRows xs, float eps, bool gemma, cudaStream_t stream) {
  const int64_t need = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  const int64_t blocks = need < 65535 * 32 ? need : 65535 * 32;
  qk_norm_rope_fwd_kernel<T, P><<<static_cast<unsigned>(blocks), 32 * kWarpsPerBlock, 0, stream>>>(
      static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const T*>(cos),
      static_cast<const T*>(sin), static_cast<T*>(out), rows, xs, eps, gemma);
  return launched();
}

template <typename T>
const char* qk_fwd_t(const void* x, const void* w, const void* cos, const void* sin, void* out,
                     int64_t batch, int64_t seq, int64_t heads, int64_t half,
                     const int64_t strides[3], float eps, bool gemma, cudaStream_t stream) {
  const int64_t rows = batch * seq * heads;
  if (rows == 0 || half == 0) return nullptr;
  if (const char* e = qk_check(batch, seq, heads, half)) return e;
  const HeadRows xs = head_rows(seq, heads, half, strides);
  if (half <= 32) return qk_fwd_p<T, 1>(x, w, cos, sin, out, rows, xs, eps, gemma, stream);
  if (half <= 64) return qk_fwd_p<T, 2>(x, w, cos, sin, out, rows, xs, eps, gemma, stream);
  if (half <= 128) return qk_fwd_p<T, 4>(x, w, cos, sin, out, rows, xs, eps, gemma, stream);
  return qk_fwd_p<T, 8>(x, w, cos, sin, out, rows, xs, eps, gemma, stream);
}

template <typename T, int P>
const char* qk_bwd_p(const void* x, const void* w, const void* cos, const void* sin,
                     const void* grad, void* dx, float* d_w_parts, int64_t rows, HeadRows xs,
                     HeadRows gs, float eps, bool gemma, cudaStream_t stream) {
  qk_norm_rope_bwd_kernel<T, P>
      <<<static_cast<unsigned>(qk_norm_rope_backward_blocks(rows)), 32 * kWarpsPerBlock, 0,
         stream>>>(static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const T*>(cos),
                   static_cast<const T*>(sin), static_cast<const T*>(grad), static_cast<T*>(dx),
                   d_w_parts, rows, xs, gs, eps, gemma);
  return launched();
}

template <typename T>
const char* qk_bwd_t(const void* x, const void* w, const void* cos, const void* sin,
                     const void* grad, void* dx, float* d_w_parts, int64_t batch, int64_t seq,
                     int64_t heads, int64_t half, const int64_t x_strides[3],
                     const int64_t g_strides[3], float eps, bool gemma, cudaStream_t stream) {
  const int64_t rows = batch * seq * heads;
  if (rows == 0 || half == 0) return nullptr;
  if (const char* e = qk_check(batch, seq, heads, half)) return e;
  const HeadRows xs = head_rows(seq, heads, half, x_strides);
  const HeadRows gs = head_rows(seq, heads, half, g_strides);
  if (half <= 32)
    return qk_bwd_p<T, 1>(x, w, cos, sin, grad, dx, d_w_parts, rows, xs, gs, eps, gemma, stream);
  if (half <= 64)
    return qk_bwd_p<T, 2>(x, w, cos, sin, grad, dx, d_w_parts, rows, xs, gs, eps, gemma, stream);
  if (half <= 128)
    return qk_bwd_p<T, 4>(x, w, cos, sin, grad, dx, d_w_parts, rows, xs, gs, eps, gemma, stream);
  return qk_bwd_p<T, 8>(x, w, cos, sin, grad, dx, d_w_parts, rows, xs, gs, eps, gemma, stream);
}

}  // namespace

const char* rope(const void* x, const void* cos, const void* sin_signed, void* out, int64_t batch,
                 int64_t seq, int64_t heads, int64_t half, const int64_t x_strides[3],
                 bool backward, DType dtype, cudaStream_t stream) {
  const int64_t sb = x_strides[0], st = x_strides[1], sh = x_strides[2];
  switch (dtype) {
    case DType::kFloat:
      return rope_t<float>(x, cos, sin_signed, out, batch, seq, heads, half, sb, st, sh, backward,
                           stream);
    case DType::kBFloat16:
      return rope_t<__nv_bfloat16>(x, cos, sin_signed, out, batch, seq, heads, half, sb, st, sh,
                                   backward, stream);
    case DType::kHalf:
      return rope_t<__half>(x, cos, sin_signed, out, batch, seq, heads, half, sb, st, sh, backward,
                            stream);
  }
  return "rope: unknown dtype";
}

template <Glu A>
const char* glu_forward_a(const void* gate, const void* up, void* out, int64_t n, DType dtype,
                          cudaStream_t stream) {
  switch (dtype) {
    case DType::kFloat: return glu_fwd_t<float, A>(gate, up, out, n, stream);
    case DType::kBFloat16: return glu_fwd_t<__nv_bfloat16, A>(gate, up, out, n, stream);
    case DType::kHalf: return glu_fwd_t<__half, A>(gate, up, out, n, stream);
  }
  return "glu_forward: unknown dtype";
}

template <Glu A>
const char* glu_backward_a(const void* gate, const void* up, const void* grad, void* d_gate,
                           void* d_up, int64_t n, DType dtype, cudaStream_t stream) {
  switch (dtype) {
    case DType::kFloat: return glu_bwd_t<float, A>(gate, up, grad, d_gate, d_up, n, stream);
    case DType::kBFloat16:
      return glu_bwd_t<__nv_bfloat16, A>(gate, up, grad, d_gate, d_up, n, stream);
    case DType::kHalf: return glu_bwd_t<__half, A>(gate, up, grad, d_gate, d_up, n, stream);
  }
  return "glu_backward: unknown dtype";
}

const char* glu_forward(const void* gate, const void* up, void* out, int64_t n, Glu act,
                        DType dtype, cudaStream_t stream) {
  return act == Glu::kGeluTanh ? glu_forward_a<Glu::kGeluTanh>(gate, up, out, n, dtype, stream)
                               : glu_forward_a<Glu::kSilu>(gate, up, out, n, dtype, stream);
}

const char* glu_backward(const void* gate, const void* up, const void* grad, void* d_gate,
                         void* d_up, int64_t n, Glu act, DType dtype, cudaStream_t stream) {
  return act == Glu::kGeluTanh
             ? glu_backward_a<Glu::kGeluTanh>(gate, up, grad, d_gate, d_up, n, dtype, stream)
             : glu_backward_a<Glu::kSilu>(gate, up, grad, d_gate, d_up, n, dtype, stream);
}

int64_t rms_norm_backward_blocks(int64_t rows) {
  return rows < 1 ? 1 : (rows < kNormParts ? rows : kNormParts);
}

int64_t qk_norm_rope_backward_blocks(int64_t rows) {
  const int64_t need = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  return need < 1 ? 1 : (need < kNormParts ? need : kNormParts);
}

const char* rms_norm_forward(const void* x, const void* w, void* y, int64_t rows, int64_t dim,
                             float eps, bool gemma, DType dtype, cudaStream_t stream) {
  switch (dtype) {
    case DType::kFloat: return rms_norm_fwd_t<float>(x, w, y, rows, dim, eps, gemma, stream);
    case DType::kBFloat16:
      return rms_norm_fwd_t<__nv_bfloat16>(x, w, y, rows, dim, eps, gemma, stream);
    case DType::kHalf: return rms_norm_fwd_t<__half>(x, w, y, rows, dim, eps, gemma, stream);
  }
  return "rms_norm: unknown dtype";
}

const char* rms_norm_backward(const void* x, const void* w, const void* grad, void* dx,
                              float* d_w_parts, int64_t rows, int64_t dim, float eps, bool gemma,
                              DType dtype, cudaStream_t stream) {
  switch (dtype) {
    case DType::kFloat:
      return rms_norm_bwd_t<float>(x, w, grad, dx, d_w_parts, rows, dim, eps, gemma, stream);
    case DType::kBFloat16:
      return rms_norm_bwd_t<__nv_bfloat16>(x, w, grad, dx, d_w_parts, rows, dim, eps, gemma,
                                           stream);
    case DType::kHalf:
      return rms_norm_bwd_t<__half>(x, w, grad, dx, d_w_parts, rows, dim, eps, gemma, stream);
  }
  return "rms_norm: unknown dtype";
}

const char* qk_norm_rope_forward(const void* x, const void* w, const void* cos,
                                 const void* sin_signed, void* out, int64_t batch, int64_t seq,
                                 int64_t heads, int64_t half, const int64_t x_strides[3], float eps,
                                 bool gemma, DType dtype, cudaStream_t stream) {
  switch (dtype) {
    case DType::kFloat:
      return qk_fwd_t<float>(x, w, cos, sin_signed, out, batch, seq, heads, half, x_strides, eps,
                             gemma, stream);
    case DType::kBFloat16:
      return qk_fwd_t<__nv_bfloat16>(x, w, cos, sin_signed, out, batch, seq, heads, half, x_strides,
                                     eps, gemma, stream);
    case DType::kHalf:
      return qk_fwd_t<__half>(x, w, cos, sin_signed, out, batch, seq, heads, half, x_strides, eps,
                              gemma, stream);
  }
  return "qk_norm_rope: unknown dtype";
}

const char* qk_norm_rope_backward(const void* x, const void* w, const void* cos,
                                  const void* sin_signed, const void* grad, void* dx,
                                  float* d_w_parts, int64_t batch, int64_t seq, int64_t heads,
                                  int64_t half, const int64_t x_strides[3],
                                  const int64_t g_strides[3], float eps, bool gemma, DType dtype,
                                  cudaStream_t stream) {
  switch (dtype) {
    case DType::kFloat:
      return qk_bwd_t<float>(x, w, cos, sin_signed, grad, dx, d_w_parts, batch, seq, heads, half,
                             x_strides, g_strides, eps, gemma, stream);
    case DType::kBFloat16:
      return qk_bwd_t<__nv_bfloat16>(x, w, cos, sin_signed, grad, dx, d_w_parts, batch, seq, heads,
                                     half, x_strides, g_strides, eps, gemma, stream);
    case DType::kHalf:
      return qk_bwd_t<__half>(x, w, cos, sin_signed, grad, dx, d_w_parts, batch, seq, heads, half,
                              x_strides, g_strides, eps, gemma, stream);
  }
  return "qk_norm_rope: unknown dtype";
}

}  // namespace ciuic::model::cuda
