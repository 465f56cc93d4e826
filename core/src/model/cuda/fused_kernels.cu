// The model's fused CUDA kernels (model/cuda/fused_kernels.h). Memory-bound elementwise work:
// each kernel reads its inputs once and writes its outputs once, computing in fp32.
#include "model/cuda/fused_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace ciuic::model::cuda {
namespace {

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
template <typename T>
__device__ __forceinline__ T from_f(float x);
template <>
__device__ __forceinline__ float from_f<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half from_f<__half>(float x) {
  return __float2half_rn(x);
}

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

}  // namespace ciuic::model::cuda
