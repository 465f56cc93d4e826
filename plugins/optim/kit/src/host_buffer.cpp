// Host memory for an optimizer's large buffers (ciuic/kit/host_buffer.h).
#include <ciuic/kit/host_buffer.h>

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/zeros.h>

#include <ciuic/error.h>

#if CIUIC_KIT_CUDA_KERNELS
#include "cuda/host_pin.h"
#endif

namespace ciuic::kit {
namespace {

constexpr size_t kHuge = size_t{2} << 20;  // the x86-64 / arm64 transparent huge page

std::string size_text(uint64_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%llu bytes (%.2f GiB)", static_cast<unsigned long long>(bytes),
                static_cast<double>(bytes) / (1u << 30));
  return buf;
}

// An anonymous private mapping of `len` bytes (a multiple of the page size), aligned to kHuge when
// it is at least that long, with huge pages advised. Returns nullptr (errno set) on failure.
void* map_pages(size_t len) {
  if (len < kHuge) {
    void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? nullptr : p;
  }
  // Over-map by one huge page and trim both ends, so the buffer starts on a huge-page boundary.
  const size_t span = len + kHuge;
  void* raw = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const auto base = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t start = (base + kHuge - 1) & ~(uintptr_t{kHuge} - 1);
  if (start > base) munmap(raw, start - base);
  const uintptr_t end = start + len;
  if (base + span > end) munmap(reinterpret_cast<void*>(end), base + span - end);
#ifdef MADV_HUGEPAGE
  madvise(reinterpret_cast<void*>(start), len, MADV_HUGEPAGE);  // advice only: may be refused
#endif
  return reinterpret_cast<void*>(start);
}

}  // namespace

bool host_buffer_pins_exactly() {
#if CIUIC_KIT_CUDA_KERNELS
  return true;
#else
  return false;
#endif
}

at::Tensor host_buffer(int64_t numel, at::ScalarType dtype, const HostBufferOptions& o,
                       const std::string& what) {
  if (numel < 0)
    throw ciuic::Error(what + ": host buffer of " + std::to_string(numel) +
                       " elements (expected a count >= 0)");
  const auto opts = at::TensorOptions().dtype(dtype).device(at::kCPU);
  const size_t esize = c10::elementSize(dtype);
  if (numel == 0) return at::empty({0}, opts);
  if (static_cast<uint64_t>(numel) > (uint64_t{1} << 62) / esize)
    throw ciuic::Error(what + ": host buffer of " + std::to_string(numel) + " elements of " +
                       c10::toString(dtype) + " is larger than any host memory");
  const uint64_t bytes = static_cast<uint64_t>(numel) * esize;
  if (o.pin && !host_buffer_pins_exactly()) {
    try {
      return at::zeros({numel}, opts.pinned_memory(true));
    } catch (const std::exception& e) {
      throw ciuic::Error(what + ": could not allocate " + size_text(bytes) +
                         " of pinned host memory (pin_memory = false avoids pinning): " + e.what());
    }
  }
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t len = (bytes + page - 1) / page * page;
  void* p = map_pages(len);
  if (!p)
    throw ciuic::Error(what + ": could not map " + size_text(bytes) +
                       " of host memory: " + std::strerror(errno));
  // First touch, piece by piece: the page whose first byte lies in piece i is touched by member i
  // (no page is written by two threads); the kernel zero-fills it on the fault.
  auto* bytes_at = static_cast<volatile char*>(p);
  auto touch = [&](int parts, int i) {
    const auto [b, e] = ciuic::ThreadPool::piece(0, numel, parts, i, o.align);
    const size_t first = (static_cast<size_t>(b) * esize + page - 1) / page * page;
    const size_t end = static_cast<size_t>(e) * esize;
    for (size_t at = first; at < end; at += page) bytes_at[at] = 0;
  };
  if (o.team)
    o.team->run([&](int i) { touch(o.team->size(), i); });
  else
    touch(1, 0);
  bool pinned = false;
#if CIUIC_KIT_CUDA_KERNELS
  if (o.pin) {
    if (const char* err = cuda::pin_host(p, len)) {
      munmap(p, len);
      throw ciuic::Error(what + ": could not page-lock " + size_text(bytes) +
                         " of host memory for CUDA copies: " + err +
                         " (the host's RAM, or a container's locked-memory limit; "
                         "pin_memory = false avoids pinning)");
    }
    pinned = true;
  }
#endif
  auto release = [len, pinned](void* ptr) {
#if CIUIC_KIT_CUDA_KERNELS
    if (pinned) cuda::unpin_host(ptr);  // an error here (CUDA already shut down) changes nothing
#else
    (void)pinned;
#endif
    munmap(ptr, len);
  };
  return at::from_blob(p, {numel}, release, opts);
}

}  // namespace ciuic::kit
