// Shared helpers for cuda_ext device code. Torch-free: only the CUDA runtime and the C++ standard
// library, so every .cu file that includes it compiles with plain nvcc.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace cuda_ext {

// Blocks for a grid-stride loop over `n` items, at least 1, at most `max_blocks`.
inline int grid_for(int64_t n, int threads, int max_blocks = 4096) {
  int64_t blocks = (n + threads - 1) / threads;
  if (blocks < 1) blocks = 1;
  if (blocks > max_blocks) blocks = max_blocks;
  return static_cast<int>(blocks);
}

#ifdef __CUDACC__

// Exclusive prefix sum of one int64 value per thread over the whole block (blockDim.x a multiple of
// 32, at most 1024). Writes the block total to `*total`. Every thread of the block must call it.
__device__ inline int64_t block_exclusive_scan(int64_t value, int64_t* total) {
  __shared__ int64_t warp_totals[32];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int n_warps = (blockDim.x + 31) >> 5;
  int64_t inclusive = value;
  for (int offset = 1; offset < 32; offset <<= 1) {
    const int64_t up = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += up;
  }
  if (lane == 31) warp_totals[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    int64_t warp_sum = lane < n_warps ? warp_totals[lane] : 0;
    for (int offset = 1; offset < 32; offset <<= 1) {
      const int64_t up = __shfl_up_sync(0xffffffffu, warp_sum, offset);
      if (lane >= offset) warp_sum += up;
    }
    if (lane < n_warps) warp_totals[lane] = warp_sum;  // inclusive over warps
  }
  __syncthreads();
  const int64_t before_warp = warp == 0 ? 0 : warp_totals[warp - 1];
  *total = warp_totals[n_warps - 1];
  __syncthreads();  // warp_totals may be reused by the next call
  return before_warp + inclusive - value;
}

#endif  // __CUDACC__

}  // namespace cuda_ext
