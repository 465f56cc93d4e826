// NF4 quantization and dequantization (quant/nf4.h): the CPU loops, the CUDA dispatch of the
// dequantization, and the bitsandbytes state-dict layout.
#include "quant/nf4.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <string>

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/linspace.h>
#include <ATen/ops/mean.h>
#include <ATen/ops/zeros.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <nlohmann/json.hpp>

#include <ciuic/error.h>
#include <ciuic/json.h>

#ifdef CIUIC_FUSED_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "quant/cuda/nf4_kernels.h"
#endif

namespace ciuic::quant {
namespace {

// bitsandbytes' get_4bit_type("nf4"): quantiles of N(0, 1), normalised to [-1, 1] (QLoRA, App. E).
constexpr std::array<float, 16> kNf4 = {-1.0f,
                                        -0.6961928009986877f,
                                        -0.5250730514526367f,
                                        -0.39491748809814453f,
                                        -0.28444138169288635f,
                                        -0.18477343022823334f,
                                        -0.09105003625154495f,
                                        0.0f,
                                        0.07958029955625534f,
                                        0.16093020141124725f,
                                        0.24611230194568634f,
                                        0.33791524171829224f,
                                        0.44070982933044434f,
                                        0.5626170039176941f,
                                        0.7229568362236023f,
                                        1.0f};

constexpr float kMinAbsmax = 1e-38f;  // bitsandbytes' clamp(min=1e-38)

// The midpoints between neighbouring code values, in fp32 as bitsandbytes computes them.
template <size_t N>
std::array<float, N - 1> midpoints(const float* code) {
  std::array<float, N - 1> m{};
  for (size_t i = 0; i + 1 < N; ++i) m[i] = (code[i] + code[i + 1]) / 2.0f;
  return m;
}

// The index of the nearest code value to s (a tie takes the lower): the number of midpoints < s
// (torch.bucketize(s, midpoints), right=False).
template <size_t M>
inline uint8_t nearest(const std::array<float, M>& mids, float s) {
  return static_cast<uint8_t>(std::lower_bound(mids.begin(), mids.end(), s) - mids.begin());
}

inline float clamp1(float s) { return s < -1.0f ? -1.0f : (s > 1.0f ? 1.0f : s); }

// bitsandbytes' create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8): for each
// exponent i in 0..6, the midpoints of linspace(0.1, 1, 2^i + 1) (fp32) times +-10^(i-6), then 0
// and 1, sorted.
at::Tensor dynamic_map() {
  std::vector<float> data;
  for (int i = 0; i < 7; ++i) {
    const at::Tensor b =
        at::linspace(0.1, 1.0, (int64_t{1} << i) + 1, at::TensorOptions().dtype(at::kFloat));
    const float* p = b.data_ptr<float>();
    const float scale = static_cast<float>(std::pow(10.0, i - 6));
    for (int64_t j = 0; j + 1 < b.numel(); ++j) {
      const float mean = (p[j] + p[j + 1]) / 2.0f;
      data.push_back(scale * mean);
      data.push_back(-scale * mean);
    }
  }
  data.push_back(0.0f);
  data.push_back(1.0f);
  std::sort(data.begin(), data.end());
  at::Tensor t = at::empty({256}, at::TensorOptions().dtype(at::kFloat));
  std::memcpy(t.data_ptr<float>(), data.data(), 256 * sizeof(float));
  return t;
}

at::Tensor nf4_code() {
  at::Tensor t = at::empty({16}, at::TensorOptions().dtype(at::kFloat));
  std::memcpy(t.data_ptr<float>(), kNf4.data(), sizeof kNf4);
  return t;
}

bool valid_blocksize(int64_t b) {
  for (int64_t v = 32; v <= 4096; v *= 2)
    if (b == v) return true;
  return false;
}

bool float_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf;
}

int64_t product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// A consistent Nf4Tensor, or an Error saying what is not.
void check(const Nf4Tensor& q) {
  const std::string what = "NF4 tensor: ";
  if (!q.packed.defined() || !q.absmax.defined() || !q.code.defined())
    throw Error(what + "packed, absmax and code must be set");
  if (!valid_blocksize(q.blocksize))
    throw Error(what + "block size " + std::to_string(q.blocksize) +
                " is not one of 32, 64, ..., 4096");
  const int64_t n = q.numel();
  if (n <= 0) throw Error(what + "empty shape");
  if (q.packed.scalar_type() != at::kByte || q.packed.numel() != (n + 1) / 2)
    throw Error(what + "packed must be uint8 with " + std::to_string((n + 1) / 2) +
                " elements, has " + std::to_string(q.packed.numel()));
  if (q.code.scalar_type() != at::kFloat || q.code.numel() != 16)
    throw Error(what + "code must be fp32 [16]");
  const int64_t blocks = q.blocks();
  if (q.absmax.numel() != blocks)
    throw Error(what + "absmax has " + std::to_string(q.absmax.numel()) + " elements, " +
                std::to_string(blocks) + " blocks expected");
  if (q.double_quant()) {
    const int64_t blocks2 = (blocks + kNf4NestedBlocksize - 1) / kNf4NestedBlocksize;
    if (q.absmax.scalar_type() != at::kByte)
      throw Error(what + "double-quantized absmax must be uint8");
    if (q.code2.scalar_type() != at::kFloat || q.code2.numel() != 256)
      throw Error(what + "code2 must be fp32 [256]");
    if (!q.absmax2.defined() || q.absmax2.scalar_type() != at::kFloat ||
        q.absmax2.numel() != blocks2)
      throw Error(what + "absmax2 must be fp32 [" + std::to_string(blocks2) + "]");
  } else if (q.absmax.scalar_type() != at::kFloat) {
    throw Error(what + "absmax must be fp32 without double quantization");
  }
}

template <typename T>
void dequantize_cpu(const uint8_t* packed, const float* absmax, const float* code, T* out,
                    int64_t n, int64_t blocksize) {
  const int64_t blocks = (n + blocksize - 1) / blocksize;
  at::parallel_for(0, blocks, 16, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const float scale = absmax[b];
      const int64_t end = std::min(n, (b + 1) * blocksize);
      for (int64_t i = b * blocksize; i < end; ++i) {
        const uint8_t byte = packed[i >> 1];
        const uint8_t nib = (i & 1) ? (byte & 0x0F) : (byte >> 4);
        out[i] = static_cast<T>(code[nib] * scale);
      }
    }
  });
}

}  // namespace

int64_t Nf4Tensor::numel() const { return product(shape); }

int64_t Nf4Tensor::bytes() const {
  int64_t b = packed.nbytes() + code.nbytes() + absmax.nbytes();
  if (double_quant()) b += code2.nbytes() + absmax2.nbytes() + static_cast<int64_t>(sizeof offset);
  return b;
}

bool nf4_quantizes_on(c10::Device device) {
#ifdef CIUIC_FUSED_KERNELS
  return device.is_cuda();
#else
  (void)device;
  return false;
#endif
}

namespace {
// The double quantization's offset: ATen's fp32 mean of the absmax on the CPU (the CUDA path
// copies its absmax here, so both paths round the same sum).
float absmax_offset(const at::Tensor& cpu_absmax) { return at::mean(cpu_absmax).item<float>(); }

#ifdef CIUIC_FUSED_KERNELS
cuda::DType cuda_dtype(at::ScalarType t) {
  return t == at::kFloat      ? cuda::DType::kFloat
         : t == at::kBFloat16 ? cuda::DType::kBFloat16
                              : cuda::DType::kHalf;
}

// quantize_nf4 on w's CUDA device (quant/cuda/nf4_kernels.h): the same bits as the CPU loops. One
// synchronisation: the non-finite flag (and, with double quantization, the absmax for the offset).
Nf4Tensor quantize_cuda(const at::Tensor& w, int64_t blocksize, bool double_quant) {
  const c10::cuda::CUDAGuard guard(w.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const at::Tensor x = w.detach().contiguous();
  const int64_t n = x.numel(), blocks = (n + blocksize - 1) / blocksize;
  const auto dev = at::TensorOptions().device(x.device());
  Nf4Tensor q;
  q.shape = w.sizes().vec();
  q.dtype = w.scalar_type();
  q.blocksize = blocksize;
  q.code = nf4_code().to(x.device());
  q.packed = at::empty({(n + 1) / 2}, dev.dtype(at::kByte));
  at::Tensor absmax = at::empty({blocks}, dev.dtype(at::kFloat));
  at::Tensor flag = at::zeros({1}, dev.dtype(at::kInt));
  cuda::Nf4Mids mids{};
  const auto m = midpoints<16>(kNf4.data());
  std::copy(m.begin(), m.end(), mids.m);
  if (const char* err = cuda::nf4_quantize(x.data_ptr(), cuda_dtype(x.scalar_type()), n, blocksize,
                                           mids, q.packed.data_ptr<uint8_t>(),
                                           absmax.data_ptr<float>(), flag.data_ptr<int>(), stream))
    throw Error(std::string("quantize_nf4: CUDA launch failed: ") + err);
  if (flag.item<int>() != 0) throw Error("quantize_nf4: the tensor holds NaN or infinite values");
  if (!double_quant) {
    q.absmax = absmax;
    return q;
  }
  q.offset = absmax_offset(absmax.cpu());
  q.code2 = dynamic_map();
  std::array<float, 256> code2{};
  std::memcpy(code2.data(), q.code2.data_ptr<float>(), sizeof code2);
  const auto mids2 = midpoints<256>(code2.data());
  at::Tensor mids2_t = at::empty({255}, at::TensorOptions().dtype(at::kFloat));
  std::memcpy(mids2_t.data_ptr<float>(), mids2.data(), sizeof mids2);
  mids2_t = mids2_t.to(x.device());
  q.code2 = q.code2.to(x.device());
  q.absmax = at::empty({blocks}, dev.dtype(at::kByte));
  q.absmax2 =
      at::empty({(blocks + kNf4NestedBlocksize - 1) / kNf4NestedBlocksize}, dev.dtype(at::kFloat));
  if (const char* err = cuda::nf4_double_quantize(
          absmax.data_ptr<float>(), blocks, q.offset, mids2_t.data_ptr<float>(),
          q.absmax.data_ptr<uint8_t>(), q.absmax2.data_ptr<float>(), stream))
    throw Error(std::string("quantize_nf4: CUDA launch failed: ") + err);
  return q;
}
#endif
}  // namespace

Nf4Tensor quantize_nf4(const at::Tensor& w, int64_t blocksize, bool double_quant) {
  if (!w.defined()) throw Error("quantize_nf4: undefined tensor");
  if (!float_dtype(w.scalar_type()))
    throw Error(std::string("quantize_nf4: dtype ") + c10::toString(w.scalar_type()) +
                " is not fp32, bf16 or fp16");
  if (!valid_blocksize(blocksize))
    throw Error("quantize_nf4: block size " + std::to_string(blocksize) +
                " is not one of 32, 64, ..., 4096");
  const int64_t n = w.numel();
  if (n == 0) throw Error("quantize_nf4: empty tensor");
#ifdef CIUIC_FUSED_KERNELS
  if (w.is_cuda()) return quantize_cuda(w, blocksize, double_quant);
#endif
  const at::Tensor x = w.detach().to(at::kCPU).to(at::kFloat).contiguous().reshape({-1});
  if (!at::isfinite(x).all().item<bool>())
    throw Error("quantize_nf4: the tensor holds NaN or infinite values");

  Nf4Tensor q;
  q.shape = w.sizes().vec();
  q.dtype = w.scalar_type();
  q.blocksize = blocksize;
  q.code = nf4_code();
  const int64_t blocks = (n + blocksize - 1) / blocksize;
  const auto u8 = at::TensorOptions().dtype(at::kByte);
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  q.packed = at::empty({(n + 1) / 2}, u8);
  at::Tensor absmax = at::empty({blocks}, f32);
  const float* xp = x.data_ptr<float>();
  uint8_t* pp = q.packed.data_ptr<uint8_t>();
  float* ap = absmax.data_ptr<float>();
  const auto mids = midpoints<16>(kNf4.data());
  at::parallel_for(0, blocks, 16, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t start = b * blocksize, end = std::min(n, start + blocksize);
      float am = 0.0f;
      for (int64_t i = start; i < end; ++i) am = std::max(am, std::fabs(xp[i]));
      ap[b] = am;
      const float c = std::max(am, kMinAbsmax);
      const bool full = end - start == blocksize;
      const float r = 1.0f / c;
      // start is even (blocksize is), so the block owns its bytes; an odd n pads index 7 (0.0).
      for (int64_t i = start; i < end; i += 2) {
        const float s0 = clamp1(full ? xp[i] * r : xp[i] / c);
        const uint8_t hi = nearest(mids, s0);
        uint8_t lo = 7;
        if (i + 1 < end) lo = nearest(mids, clamp1(full ? xp[i + 1] * r : xp[i + 1] / c));
        pp[i >> 1] = static_cast<uint8_t>((hi << 4) | lo);
      }
    }
  });

  if (!double_quant) {
    q.absmax = absmax;
  } else {
    q.offset = absmax_offset(absmax);
    q.code2 = dynamic_map();
    const int64_t blocks2 = (blocks + kNf4NestedBlocksize - 1) / kNf4NestedBlocksize;
    q.absmax = at::empty({blocks}, u8);
    q.absmax2 = at::empty({blocks2}, f32);
    uint8_t* qp = q.absmax.data_ptr<uint8_t>();
    float* a2 = q.absmax2.data_ptr<float>();
    std::array<float, 256> code2{};
    std::memcpy(code2.data(), q.code2.data_ptr<float>(), sizeof code2);
    const auto mids2 = midpoints<256>(code2.data());
    for (int64_t b = 0; b < blocks2; ++b) {
      const int64_t start = b * kNf4NestedBlocksize,
                    end = std::min(blocks, start + kNf4NestedBlocksize);
      float am = 0.0f;
      for (int64_t i = start; i < end; ++i) am = std::max(am, std::fabs(ap[i] - q.offset));
      a2[b] = am;
      const float c = std::max(am, kMinAbsmax);
      for (int64_t i = start; i < end; ++i) qp[i] = nearest(mids2, clamp1((ap[i] - q.offset) / c));
    }
  }
  if (!w.device().is_cpu()) {
    const auto to = [&](at::Tensor& t) {
      if (t.defined()) t = t.to(w.device());
    };
    to(q.packed), to(q.code), to(q.absmax), to(q.code2), to(q.absmax2);
  }
  return q;
}

at::Tensor nf4_absmax(const Nf4Tensor& q) {
  check(q);
  if (!q.double_quant()) return q.absmax;
  // bitsandbytes: dequantize_blockwise (code2[c] * absmax2 in fp32), then += offset in fp32.
  const at::Tensor c = q.absmax.to(at::kCPU).contiguous(),
                   code2 = q.code2.to(at::kCPU).contiguous(),
                   a2 = q.absmax2.to(at::kCPU).contiguous();
  at::Tensor out = at::empty({c.numel()}, at::TensorOptions().dtype(at::kFloat));
  const uint8_t* cp = c.data_ptr<uint8_t>();
  const float* k = code2.data_ptr<float>();
  const float* ap = a2.data_ptr<float>();
  float* op = out.data_ptr<float>();
  for (int64_t i = 0; i < c.numel(); ++i) {
    const float v = k[cp[i]] * ap[i / kNf4NestedBlocksize];
    op[i] = v + q.offset;
  }
  return q.absmax.device().is_cpu() ? out : out.to(q.absmax.device());
}

at::Tensor dequantize_nf4(const Nf4Tensor& q, at::ScalarType dtype) {
  check(q);
  if (!float_dtype(dtype))
    throw Error(std::string("dequantize_nf4: dtype ") + c10::toString(dtype) +
                " is not fp32, bf16 or fp16");
  const int64_t n = q.numel();
#ifdef CIUIC_FUSED_KERNELS
  if (q.packed.is_cuda()) {
    const c10::cuda::CUDAGuard guard(q.packed.device());
    const auto dev = at::TensorOptions().device(q.packed.device());
    at::Tensor out = at::empty(q.shape, dev.dtype(dtype));
    const at::Tensor packed = q.packed.contiguous(),
                     code = q.code.to(q.packed.device()).contiguous();
    const at::Tensor absmax = q.absmax.to(q.packed.device()).contiguous();
    at::Tensor code2, absmax2;
    if (q.double_quant()) {
      code2 = q.code2.to(q.packed.device()).contiguous();
      absmax2 = q.absmax2.to(q.packed.device()).contiguous();
    }
    const cuda::DType dt = cuda_dtype(dtype);
    const char* err =
        cuda::nf4_dequantize(packed.data_ptr<uint8_t>(), code.data_ptr<float>(),
                             q.double_quant() ? nullptr : absmax.data_ptr<float>(),
                             q.double_quant() ? absmax.data_ptr<uint8_t>() : nullptr,
                             q.double_quant() ? code2.data_ptr<float>() : nullptr,
                             q.double_quant() ? absmax2.data_ptr<float>() : nullptr, q.offset,
                             out.data_ptr(), n, q.blocksize, dt, c10::cuda::getCurrentCUDAStream());
    if (err) throw Error(std::string("dequantize_nf4: CUDA launch failed: ") + err);
    return out;
  }
#endif
  const at::Tensor packed = q.packed.to(at::kCPU).contiguous(),
                   code = q.code.to(at::kCPU).contiguous();
  const at::Tensor absmax = nf4_absmax(q).to(at::kCPU).contiguous();
  at::Tensor out = at::empty(q.shape, at::TensorOptions().dtype(dtype));
  const uint8_t* pp = packed.data_ptr<uint8_t>();
  const float* ap = absmax.data_ptr<float>();
  const float* cp = code.data_ptr<float>();
  if (dtype == at::kFloat)
    dequantize_cpu(pp, ap, cp, out.data_ptr<float>(), n, q.blocksize);
  else if (dtype == at::kBFloat16)
    dequantize_cpu(pp, ap, cp, out.data_ptr<c10::BFloat16>(), n, q.blocksize);
  else
    dequantize_cpu(pp, ap, cp, out.data_ptr<c10::Half>(), n, q.blocksize);
  return q.packed.device().is_cpu() ? out : out.to(q.packed.device());
}

// ---- bitsandbytes' state-dict layout
// -------------------------------------------------------------

namespace {
const char* dtype_name(at::ScalarType t) {
  return t == at::kFloat ? "float32" : t == at::kBFloat16 ? "bfloat16" : "float16";
}
const std::string kQuantStateKey = ".quant_state.bitsandbytes__nf4";
}  // namespace

std::map<std::string, at::Tensor> nf4_state_dict(const std::string& name, const Nf4Tensor& q) {
  check(q);
  std::map<std::string, at::Tensor> out;
  out[name] = q.packed.to(at::kCPU).reshape({-1, 1});
  out[name + ".absmax"] = q.absmax.to(at::kCPU);
  out[name + ".quant_map"] = q.code.to(at::kCPU);
  nlohmann::ordered_json meta = {{"quant_type", "nf4"},
                                 {"blocksize", q.blocksize},
                                 {"dtype", dtype_name(q.dtype)},
                                 {"shape", q.shape}};
  if (q.double_quant()) {
    out[name + ".nested_absmax"] = q.absmax2.to(at::kCPU);
    out[name + ".nested_quant_map"] = q.code2.to(at::kCPU);
    meta["nested_blocksize"] = kNf4NestedBlocksize;
    meta["nested_dtype"] = "float32";
    meta["nested_offset"] = static_cast<double>(q.offset);
  }
  const std::string text = meta.dump();
  at::Tensor bytes =
      at::empty({static_cast<int64_t>(text.size())}, at::TensorOptions().dtype(at::kByte));
  std::memcpy(bytes.data_ptr<uint8_t>(), text.data(), text.size());
  out[name + kQuantStateKey] = bytes;
  return out;
}

Nf4Tensor nf4_from_state_dict(const std::string& name,
                              const std::map<std::string, at::Tensor>& tensors) {
  const auto get = [&](const std::string& key, bool required) -> at::Tensor {
    const auto it = tensors.find(key);
    if (it == tensors.end()) {
      if (required) throw Error("NF4 weight " + name + ": missing tensor " + key);
      return {};
    }
    return it->second.to(at::kCPU).contiguous();
  };
  const at::Tensor state = get(name + kQuantStateKey, true);
  if (state.scalar_type() != at::kByte)
    throw Error("NF4 weight " + name + ": " + name + kQuantStateKey + " is not uint8");
  const std::string text(reinterpret_cast<const char*>(state.data_ptr<uint8_t>()),
                         static_cast<size_t>(state.numel()));
  check_json_depth(text, name + kQuantStateKey);
  Nf4Tensor q;
  try {
    const nlohmann::json meta = nlohmann::json::parse(text);
    if (meta.at("quant_type").get<std::string>() != "nf4")
      throw Error("quant_type " + meta.at("quant_type").get<std::string>() + " is not nf4");
    q.blocksize = meta.at("blocksize").get<int64_t>();
    const std::string dt = meta.at("dtype").get<std::string>();
    q.dtype = dt == "float32"    ? at::kFloat
              : dt == "bfloat16" ? at::kBFloat16
              : dt == "float16"
                  ? at::kHalf
                  : throw Error("dtype " + dt + " is not float32, bfloat16 or float16");
    q.shape = meta.at("shape").get<std::vector<int64_t>>();
    if (meta.contains("nested_offset")) {
      if (meta.value("nested_blocksize", int64_t{0}) != kNf4NestedBlocksize)
        throw Error("nested_blocksize is not 256");
      q.offset = static_cast<float>(meta.at("nested_offset").get<double>());
      q.absmax2 = get(name + ".nested_absmax", true);
      q.code2 = get(name + ".nested_quant_map", true);
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error("NF4 weight " + name + ": " + name + kQuantStateKey + ": " + e.what());
  } catch (const Error& e) {
    throw e.with_context("NF4 weight " + name + ": " + name + kQuantStateKey);
  }
  q.packed = get(name, true).reshape({-1});
  q.absmax = get(name + ".absmax", true);
  q.code = get(name + ".quant_map", true);
  try {
    check(q);
  } catch (const Error& e) {
    throw e.with_context("NF4 weight " + name);
  }
  return q;
}

}  // namespace ciuic::quant
