// kit/src/cuda/host_pin.h — page-locking host memory that was allocated elsewhere, for the CUDA
// copy engines (internal to the optim kit; the C++ side is ciuic/kit/host_buffer.h).
//
// Compiled by nvcc into the kit in CUDA builds only (CIUIC_KIT_CUDA_KERNELS). Both calls return
// nullptr on success, else the CUDA runtime's error string.
#pragma once

#include <cstddef>

namespace ciuic::kit::cuda {

// cudaHostRegister(p, bytes, portable): the pages of [p, p + bytes) become page-locked and mapped
// for every CUDA context of the process; copies from or to them run asynchronously on the copy
// engines. p and bytes: multiples of the page size.
const char* pin_host(void* p, size_t bytes);
// cudaHostUnregister(p): the inverse, for a p that pin_host() accepted.
const char* unpin_host(void* p);

}  // namespace ciuic::kit::cuda
