// Page-locking host memory allocated elsewhere (kit/src/cuda/host_pin.h).
#include "cuda/host_pin.h"

#include <cuda_runtime_api.h>

namespace ciuic::kit::cuda {

const char* pin_host(void* p, size_t bytes) {
  const cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterPortable);
  if (e == cudaSuccess) return nullptr;
  cudaGetLastError();  // not sticky: clear it so that later calls do not report it
  return cudaGetErrorString(e);
}

const char* unpin_host(void* p) {
  const cudaError_t e = cudaHostUnregister(p);
  if (e == cudaSuccess) return nullptr;
  cudaGetLastError();
  return cudaGetErrorString(e);
}

}  // namespace ciuic::kit::cuda
