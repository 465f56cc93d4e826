// quant/nf4_size.h — how many bytes an NF4 tensor (quant/nf4.h) holds, for the memory planner.
// Plain C++, no LibTorch: plan/ can include it without the quantization code.
#pragma once

#include <cstdint>

namespace ciuic::quant {

// The nested (double-quantization) block size bitsandbytes uses for the absmax: 256.
inline constexpr int64_t kNf4NestedBlocksize = 256;

// Bytes of Nf4Tensor for `numel` weights in blocks of `blocksize` (> 0): the packed nibbles
// ceil(numel / 2), the 16-entry fp32 NF4 code, and the scales — with double quantization one uint8
// code per block, one fp32 absmax per 256 blocks, the 256-entry fp32 code and the fp32 offset;
// without it one fp32 absmax per block. Exact: it counts what quantize_nf4 allocates. numel <= 0:
// 0. For a 7B model (6.5e9 weights in linear layers), blocksize 64 with double quantization this is
// about 0.507 bytes per weight (4.127 bits), 0.531 bytes (4.25 bits) without.
constexpr int64_t nf4_bytes(int64_t numel, int64_t blocksize = 64, bool double_quant = true) {
  if (numel <= 0 || blocksize <= 0) return 0;
  const int64_t blocks = (numel + blocksize - 1) / blocksize;
  const int64_t packed = (numel + 1) / 2;
  const int64_t code = 16 * 4;
  if (!double_quant) return packed + code + blocks * 4;
  const int64_t blocks2 = (blocks + kNf4NestedBlocksize - 1) / kNf4NestedBlocksize;
  return packed + code + blocks + blocks2 * 4 + 256 * 4 + 4;
}

}  // namespace ciuic::quant
