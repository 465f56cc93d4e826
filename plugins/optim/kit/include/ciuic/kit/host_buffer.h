// ciuic/kit/host_buffer.h — part of the optim kit (libciuic_optim_kit.a; a static library linked
// into each plugin that uses it, not part of the SDK's ABI).
//
// Host memory for an optimizer's few large buffers: a shard's master weights and moments, its
// gradient, the landing zone of reduced chunks. LibTorch's allocators are built for many small,
// reused tensors and are wrong for these twice over:
//   - its page-locked ("pinned") allocator rounds every request up to a power of two and keeps
//     what it pinned until the process ends: the 9.2 GB fp32 shard of a 7B model on 3 ranks pins
//     16 GiB (+87%); the 27.6 GB one of one rank pins 32 GiB;
//   - its CPU allocator leaves the first touch of each page — the page's placement on a
//     multi-socket host, and the zeroing cost — to whoever writes it first, one thread.
// host_buffer() maps exactly the pages asked for (anonymous mmap, 2 MiB-aligned with transparent
// huge pages advised for buffers of 2 MiB and more), first-touches them in parallel with `team`,
// split as ThreadPool::piece splits [0, numel) with `align` (so the thread that will update a
// piece owns its pages), and, when `pin` is set and the build has CUDA, page-locks the mapping for
// the CUDA copy engines (cudaHostRegister). The contents are zero. The returned CPU tensor owns
// the mapping: its deleter unpins and unmaps, so the memory goes back to the system as soon as
// the last reference goes (not at process exit).
//
// A build without CUDA cannot pin this way: there `pin` falls back to LibTorch's pinned allocator
// (with its rounding), and a CPU-only LibTorch fails as at::empty(pinned_memory) fails.
//
// Threading: any thread; `team` (if given) must not be running another job. Failure: ciuic::Error
// naming `what`, the size, and the cause (mmap's error; the CUDA runtime's error for pinning, with
// the hint that pin_memory = false avoids it). Nothing stays allocated after a failure.
#pragma once

#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

#include <ciuic/thread_pool.h>

namespace ciuic::kit {

struct HostBufferOptions {
  bool pin = false;                   // page-lock for CUDA copies (CUDA builds)
  ciuic::ThreadPool* team = nullptr;  // first-touches the pages in parallel (null: this thread)
  int64_t align = 64;                 // piece boundaries of the touch, in elements
};

// A contiguous 1-D CPU tensor of `numel` zeros of `dtype` (numel >= 0).
at::Tensor host_buffer(int64_t numel, at::ScalarType dtype, const HostBufferOptions& options,
                       const std::string& what);

// Whether host_buffer() pins by registering its own mapping (exact size) in this build; false:
// `pin` uses LibTorch's pinned allocator.
bool host_buffer_pins_exactly();

}  // namespace ciuic::kit
