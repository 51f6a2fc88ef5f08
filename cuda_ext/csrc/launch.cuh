// Kernel launches with programmatic dependent launch (PDL, Hopper sm_90+). Torch-free.
//
// A kernel launched by `launch_kernel` may be scheduled while the previous kernel on the stream is still
// running; its blocks then wait in `pdl_wait_then_release()` (its first statement) until that kernel has
// finished and its memory writes are visible, so stream order is kept exactly. What the overlap saves is
// the launch latency and block scheduling between back-to-back kernels, which is most of the cost of a
// chain of small kernels such as one replay cycle (benchmarks/RESULTS.md). Every kernel launched here MUST
// call pdl_wait_then_release() before it touches global memory. The overlap is also recorded in CUDA graphs.
//
// FOXHUNT_CUDA_PDL=0 in the environment turns the attribute off (plain stream-ordered launches). It is read
// at every launch (a getenv is far cheaper than a launch), so a benchmark can compare both in one process.
#pragma once

#include <cstdlib>
#include <cstring>

#include <cuda_runtime.h>

namespace cuda_ext {

#ifdef __CUDACC__
// Wait for the previous kernel in the stream (and its memory), then let the next kernel start launching.
__device__ __forceinline__ void pdl_wait_then_release() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
#endif

// Whether launches carry the programmatic-serialization attribute (FOXHUNT_CUDA_PDL unset or not "0").
inline bool pdl_enabled() {
  const char* value = std::getenv("FOXHUNT_CUDA_PDL");
  return value == nullptr || std::strcmp(value, "0") != 0;
}

// Launch `kernel<<<grid, block, shared_bytes, stream>>>(args...)`, with PDL when enabled and `allow_pdl`.
template <typename... Params, typename... Args>
cudaError_t launch_kernel_pdl(bool allow_pdl, void (*kernel)(Params...), dim3 grid, dim3 block,
                              size_t shared_bytes, cudaStream_t stream, Args... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute = {};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  if (allow_pdl && pdl_enabled()) {
    config.attrs = &attribute;
    config.numAttrs = 1;
  }
  const cudaError_t status = cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
  return status != cudaSuccess ? status : cudaGetLastError();
}

template <typename... Params, typename... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                          cudaStream_t stream, Args... args) {
  return launch_kernel_pdl(true, kernel, grid, block, shared_bytes, stream, args...);
}

}  // namespace cuda_ext

// Launch with launch_kernel and return its error from the enclosing launcher (which returns cudaError_t).
#define CUDA_EXT_LAUNCH(...)                                                      \
  do {                                                                            \
    const cudaError_t cuda_ext_launch_status = ::cuda_ext::launch_kernel(__VA_ARGS__); \
    if (cuda_ext_launch_status != cudaSuccess) return cuda_ext_launch_status;     \
  } while (0)

// The same without the PDL attribute: the kernel starts only once the previous one has finished (its own
// griddepcontrol.wait is then a no-op; its successor may still launch early).
#define CUDA_EXT_LAUNCH_NO_PDL(...)                                                          \
  do {                                                                                       \
    const cudaError_t cuda_ext_launch_status = ::cuda_ext::launch_kernel_pdl(false, __VA_ARGS__); \
    if (cuda_ext_launch_status != cudaSuccess) return cuda_ext_launch_status;                \
  } while (0)
