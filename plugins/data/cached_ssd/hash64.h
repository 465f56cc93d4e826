// hash64.h — XXH64 (Yann Collet's 64-bit xxHash, as specified in xxhash's doc/xxhash_spec.md),
// written here from the specification. Used for shard checksums and for the content hash of the
// sources in the cache manifest. Checked against the Python `xxhash` package's values
// (tests/fixtures/data/xxh64.json, made by tests/fixtures/gen_data.py).
//
// Hash64 is the streaming form (feed any number of byte ranges, then digest()); xxh64() hashes one
// buffer. Neither allocates; both are pure functions of the bytes and the seed, on any platform.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace ciuic::data {

class Hash64 {
 public:
  explicit Hash64(uint64_t seed = 0) : seed_(seed) {
    v_[0] = seed + kP1 + kP2;
    v_[1] = seed + kP2;
    v_[2] = seed;
    v_[3] = seed - kP1;
  }

  void update(const void* data, size_t n) {
    if (n == 0) return;  // `data` may be null then, and memcpy's pointers must not be (UBSan)
    const auto* p = static_cast<const uint8_t*>(data);
    total_ += n;
    if (buffered_ + n < 32) {
      std::memcpy(buf_ + buffered_, p, n);
      buffered_ += n;
      return;
    }
    if (buffered_ > 0) {
      const size_t fill = 32 - buffered_;
      std::memcpy(buf_ + buffered_, p, fill);
      stripe(buf_);
      p += fill;
      n -= fill;
      buffered_ = 0;
    }
    while (n >= 32) {
      stripe(p);
      p += 32;
      n -= 32;
    }
    std::memcpy(buf_, p, n);
    buffered_ = n;
  }
  void update(std::string_view s) { update(s.data(), s.size()); }
  template <class T>
  void update_pod(const T& v) {
    update(&v, sizeof(T));
  }

  uint64_t digest() const {
    uint64_t h;
    if (total_ >= 32) {
      h = rotl(v_[0], 1) + rotl(v_[1], 7) + rotl(v_[2], 12) + rotl(v_[3], 18);
      for (uint64_t v : v_) h = merge(h, v);
    } else {
      h = seed_ + kP5;
    }
    h += total_;
    const uint8_t* p = buf_;
    size_t n = buffered_;
    while (n >= 8) {
      h ^= round(0, load64(p));
      h = rotl(h, 27) * kP1 + kP4;
      p += 8;
      n -= 8;
    }
    if (n >= 4) {
      h ^= static_cast<uint64_t>(load32(p)) * kP1;
      h = rotl(h, 23) * kP2 + kP3;
      p += 4;
      n -= 4;
    }
    while (n > 0) {
      h ^= static_cast<uint64_t>(*p) * kP5;
      h = rotl(h, 11) * kP1;
      ++p;
      --n;
    }
    h ^= h >> 33;
    h *= kP2;
    h ^= h >> 29;
    h *= kP3;
    h ^= h >> 32;
    return h;
  }

 private:
  static constexpr uint64_t kP1 = 0x9E3779B185EBCA87ULL;
  static constexpr uint64_t kP2 = 0xC2B2AE3D27D4EB4FULL;
  static constexpr uint64_t kP3 = 0x165667B19E3779F9ULL;
  static constexpr uint64_t kP4 = 0x85EBCA77C2B2AE63ULL;
  static constexpr uint64_t kP5 = 0x27D4EB2F165667C5ULL;

  static uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
  static uint64_t load64(const uint8_t* p) {
    uint64_t v;
    std::memcpy(&v, p, 8);  // little-endian hosts only (x86-64, aarch64)
    return v;
  }
  static uint32_t load32(const uint8_t* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
  }
  static uint64_t round(uint64_t acc, uint64_t lane) {
    acc += lane * kP2;
    acc = rotl(acc, 31);
    return acc * kP1;
  }
  static uint64_t merge(uint64_t h, uint64_t v) {
    h ^= round(0, v);
    return h * kP1 + kP4;
  }
  void stripe(const uint8_t* p) {
    v_[0] = round(v_[0], load64(p));
    v_[1] = round(v_[1], load64(p + 8));
    v_[2] = round(v_[2], load64(p + 16));
    v_[3] = round(v_[3], load64(p + 24));
  }

  uint64_t seed_;
  uint64_t v_[4];
  uint8_t buf_[32] = {};
  size_t buffered_ = 0;
  uint64_t total_ = 0;
};

inline uint64_t xxh64(const void* data, size_t n, uint64_t seed = 0) {
  Hash64 h(seed);
  h.update(data, n);
  return h.digest();
}

// 16 lowercase hex digits.
inline std::string hex64(uint64_t v) {
  static const char* kDigits = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[i] = kDigits[v & 15];
  return s;
}

}  // namespace ciuic::data
