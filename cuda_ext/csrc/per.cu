// Prioritized-replay kernels (per_push, per_tree_rebuild, per_sample, per_update). Torch-free device
// code; the launch functions are declared in per_kernels.cuh. Arithmetic mirrors
// cuda_ext/reference/per.py exactly: float32 priorities with explicit round-to-nearest multiply and add
// (no fused multiply-add), float64 leaves `pow(p, alpha)`, every tree node `left + right`.
#include <cstdint>

#include <cuda_runtime.h>

#include "common.h"
#include "per_kernels.cuh"

namespace cuda_ext {
namespace per {
namespace {

constexpr int kScanThreads = 1024;
constexpr int kRowThreads = 256;
constexpr int kUpdateThreads = 256;
constexpr int kSampleThreads = 1024;
constexpr int kSamplesPerThread = 4;       // descents interleaved per thread, to hide memory latency
constexpr int64_t kCachedNodes = 2048;     // top tree nodes (heap indices < 2048) kept in shared memory
constexpr int64_t kMinSubtreeLeaves = 2048;
constexpr int64_t kTopLeaves = 4096;       // subtree roots reduced by the single top block, preferred
constexpr int64_t kMaxSubtreeLeaves = 16384;  // 128 KiB of shared memory per block

// ---------------------------------------------------------------- per_push

__global__ void push_slots_kernel(const bool* __restrict__ wants, const float* __restrict__ new_priority,
                                  const float* __restrict__ max_multiplier,
                                  const float* __restrict__ max_priority, int64_t* __restrict__ head_size,
                                  double* __restrict__ tree, int64_t* __restrict__ slots, int64_t n,
                                  int64_t capacity, int64_t n_leaves, double alpha) {
  // Each thread owns a contiguous chunk of rows, so the exclusive prefix of the chunk's first row is
  // the block scan of the chunk counts.
  const int64_t chunk = (n + blockDim.x - 1) / blockDim.x;
  const int64_t begin = min(n, static_cast<int64_t>(threadIdx.x) * chunk);
  const int64_t end = min(n, begin + chunk);
  int64_t local = 0;
  for (int64_t i = begin; i < end; ++i) local += wants[i] ? 1 : 0;
  int64_t total = 0;
  int64_t prefix = block_exclusive_scan(local, &total);  // ends with __syncthreads
  const int64_t head = head_size[0];
  const int64_t size = head_size[1];
  const float running_max = max_priority[0];
  const int64_t first_kept = total - capacity;  // rows with prefix < first_kept are overwritten
  for (int64_t i = begin; i < end; ++i) {
    int64_t slot = -1;
    if (wants[i]) {
      if (prefix >= first_kept) {
        slot = (head + prefix) % capacity;
        const float raw = __fadd_rn(new_priority[i], __fmul_rn(max_multiplier[i], running_max));
        tree[n_leaves + slot] = pow(static_cast<double>(raw), alpha);
      }
      ++prefix;
    }
    slots[i] = slot;
  }
  __syncthreads();  // every thread has read head_size
  if (threadIdx.x == 0) {
    head_size[0] = (head + total) % capacity;
    head_size[1] = min(size + total, capacity);
  }
}

__global__ void push_rows_kernel(const int64_t* __restrict__ slots, const float* __restrict__ new_obs,
                                 const float* __restrict__ new_next_obs,
                                 const int64_t* __restrict__ new_action, const float* __restrict__ new_reward,
                                 const float* __restrict__ new_done, const int8_t* __restrict__ new_kind,
                                 float* __restrict__ obs, float* __restrict__ next_obs,
                                 int64_t* __restrict__ action, float* __restrict__ reward,
                                 float* __restrict__ done, int8_t* __restrict__ kind, int64_t n,
                                 int64_t obs_dim, int64_t n_branches) {
  int64_t width = obs_dim > n_branches ? obs_dim : n_branches;
  if (width < 1) width = 1;
  const int64_t total = n * width;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = e / width;
    const int64_t col = e - row * width;
    const int64_t slot = slots[row];
    if (slot < 0) continue;
    if (col < obs_dim) {
      obs[slot * obs_dim + col] = new_obs[row * obs_dim + col];
      next_obs[slot * obs_dim + col] = new_next_obs[row * obs_dim + col];
    }
    if (col < n_branches) action[slot * n_branches + col] = new_action[row * n_branches + col];
    if (col == 0) {
      reward[slot] = new_reward[row];
      done[slot] = new_done[row];
      kind[slot] = new_kind[row];
    }
  }
}

// push_rows with 32-bit indexing (n * width < 2^31): one thread per (row, unit), a unit being 4 floats of
// obs/next_obs when VEC4 (obs_dim % 4 == 0, 16-byte aligned rows) or 1 float otherwise.
template <bool VEC4>
__global__ void push_rows_fast_kernel(const int64_t* __restrict__ slots, const float* __restrict__ new_obs,
                                      const float* __restrict__ new_next_obs,
                                      const int64_t* __restrict__ new_action,
                                      const float* __restrict__ new_reward, const float* __restrict__ new_done,
                                      const int8_t* __restrict__ new_kind, float* __restrict__ obs,
                                      float* __restrict__ next_obs, int64_t* __restrict__ action,
                                      float* __restrict__ reward, float* __restrict__ done,
                                      int8_t* __restrict__ kind, int n, int obs_dim, int n_branches) {
  const int units = VEC4 ? obs_dim >> 2 : obs_dim;
  int width = units > n_branches ? units : n_branches;
  if (width < 1) width = 1;
  const int total = n * width;
  for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < total; e += gridDim.x * blockDim.x) {
    const int row = e / width;
    const int col = e - row * width;
    const int64_t slot = slots[row];
    if (slot < 0) continue;
    if (col < units) {
      if (VEC4) {
        const int64_t to = slot * (obs_dim >> 2) + col;
        const int64_t from = static_cast<int64_t>(row) * (obs_dim >> 2) + col;
        reinterpret_cast<float4*>(obs)[to] = reinterpret_cast<const float4*>(new_obs)[from];
        reinterpret_cast<float4*>(next_obs)[to] = reinterpret_cast<const float4*>(new_next_obs)[from];
      } else {
        obs[slot * obs_dim + col] = new_obs[static_cast<int64_t>(row) * obs_dim + col];
        next_obs[slot * obs_dim + col] = new_next_obs[static_cast<int64_t>(row) * obs_dim + col];
      }
    }
    if (col < n_branches) action[slot * n_branches + col] = new_action[static_cast<int64_t>(row) * n_branches + col];
    if (col == 0) {
      reward[slot] = new_reward[row];
      done[slot] = new_done[row];
      kind[slot] = new_kind[row];
    }
  }
}

// ---------------------------------------------------------------- per_tree_rebuild

// Reduce the `width` nodes [first, first + width) (first a multiple of width) up to their common
// ancestor, writing every node on the way; the block's shared heap `local[1 .. width)` holds the
// levels. `coherent` reads the bottom level from L2 (nodes another block wrote in this launch).
__device__ void reduce_nodes(double* tree, int64_t first, int64_t width, double* local, bool coherent) {
  const int64_t half = width / 2;
  int64_t parent_first = first / 2;
  for (int64_t j = threadIdx.x; j < half; j += blockDim.x) {
    const double* pair = tree + first + 2 * j;
    const double sum = coherent ? __ldcg(pair) + __ldcg(pair + 1) : pair[0] + pair[1];
    local[half + j] = sum;
    tree[parent_first + j] = sum;
  }
  __syncthreads();
  for (int64_t count = half / 2; count >= 1; count /= 2) {
    parent_first /= 2;
    for (int64_t j = threadIdx.x; j < count; j += blockDim.x) {
      const int64_t h = count + j;
      const double sum = local[2 * h] + local[2 * h + 1];
      local[h] = sum;
      tree[parent_first + j] = sum;
    }
    __syncthreads();
  }
}

// Whole tree of n_leaves <= width in one block.
__global__ void small_tree_kernel(double* tree, int64_t n_leaves) {
  extern __shared__ double local[];
  reduce_nodes(tree, n_leaves, n_leaves, local, false);
}

// Block b rebuilds the subtree over leaves [b * width, (b + 1) * width) (with `leaf_idx` non-null,
// only if one of them is listed); the last block to finish then reduces the gridDim.x subtree roots
// to the root. The arrival counter is the low 32 bits of tree[0] (unused by the tree, kept 0
// between calls: atomicInc wraps it back to 0 on the last arrival).
__global__ void tree_rebuild_kernel(double* tree, int64_t n_leaves, int64_t width,
                                    const int64_t* __restrict__ leaf_idx, int64_t m) {
  extern __shared__ double local[];
  __shared__ int is_last;
  bool listed = true;
  if (leaf_idx != nullptr) {
    const int64_t lo = blockIdx.x * width;
    const int64_t hi = lo + width;
    int found = 0;
    for (int64_t i = threadIdx.x; i < m; i += blockDim.x) {
      const int64_t leaf = leaf_idx[i];
      found |= (leaf >= lo && leaf < hi) ? 1 : 0;
    }
    listed = __syncthreads_or(found) != 0;
  }
  if (listed) reduce_nodes(tree, n_leaves + blockIdx.x * width, width, local, false);
  __threadfence();  // this thread's node writes are visible device-wide before the block arrives
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned int arrived = atomicInc(reinterpret_cast<unsigned int*>(tree), gridDim.x - 1);
    is_last = arrived == gridDim.x - 1 ? 1 : 0;
  }
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  reduce_nodes(tree, gridDim.x, gridDim.x, local, true);
}

// Fast path for 2^12 <= P <= 2^23: subtrees of kFastSubtreeLeaves leaves, kFastThreads threads each
// summing 8 leaves in registers (16-byte loads), then warp shuffles; one barrier per subtree. With
// `filtered`, a block rebuilds its subtree only if mark_dirty_kernel set the subtree root to kDirtyMarker
// (a clean root cannot hold a stale value; a legitimate sum that happens to equal the marker is just
// rebuilt again). The last block to arrive reduces the gridDim.x subtree roots to the root.
constexpr int kFastThreads = 256;
constexpr int64_t kFastSubtreeLeaves = 8 * kFastThreads;  // 2048: the subtree root is 11 levels up
constexpr int64_t kFastMaxLeaves = int64_t{1} << 23;       // at most 4096 subtree roots for the top block
constexpr unsigned long long kDirtyMarker = 0x7FF4C0FFEE0DDBA1ULL;  // a signaling-NaN bit pattern

__global__ void mark_dirty_kernel(double* __restrict__ tree, const int64_t* __restrict__ leaf_idx, int64_t m,
                                  int64_t n_leaves, int64_t n_subtrees) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < m;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t leaf = leaf_idx[i];
    if (leaf >= 0 && leaf < n_leaves) {
      reinterpret_cast<unsigned long long*>(tree)[n_subtrees + leaf / kFastSubtreeLeaves] = kDirtyMarker;
    }
  }
}

__global__ void __launch_bounds__(kFastThreads) fast_rebuild_kernel(double* tree, int64_t n_leaves,
                                                                    bool filtered) {
  extern __shared__ double local[];  // gridDim.x doubles (>= 32) for the top reduction
  __shared__ double warp_roots[kFastThreads / 32];
  __shared__ int is_last;
  const int64_t n_subtrees = gridDim.x;
  const int64_t b = blockIdx.x;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  bool dirty = true;
  if (filtered) {
    dirty = reinterpret_cast<const unsigned long long*>(tree)[n_subtrees + b] == kDirtyMarker;
  }
  if (dirty) {
    const int64_t t = threadIdx.x;
    const double2* leaves = reinterpret_cast<const double2*>(tree + n_leaves + b * kFastSubtreeLeaves + 8 * t);
    const double2 p0 = leaves[0];
    const double2 p1 = leaves[1];
    const double2 p2 = leaves[2];
    const double2 p3 = leaves[3];
    const double a0 = p0.x + p0.y, a1 = p1.x + p1.y, a2 = p2.x + p2.y, a3 = p3.x + p3.y;  // level 1
    double2* level1 = reinterpret_cast<double2*>(tree + (n_leaves >> 1) + b * (kFastSubtreeLeaves >> 1) + 4 * t);
    level1[0] = make_double2(a0, a1);
    level1[1] = make_double2(a2, a3);
    const double c0 = a0 + a1, c1 = a2 + a3;  // level 2
    reinterpret_cast<double2*>(tree + (n_leaves >> 2) + b * (kFastSubtreeLeaves >> 2) + 2 * t)[0] =
        make_double2(c0, c1);
    double v = c0 + c1;  // level 3: node t of the subtree
    tree[(n_leaves >> 3) + b * (kFastSubtreeLeaves >> 3) + t] = v;
    // Levels 4..8 inside each warp: 32 nodes -> 1.
#pragma unroll
    for (int level = 4; level <= 8; ++level) {
      const int active = 32 >> (level - 3);
      const double left = __shfl_sync(0xffffffffu, v, (2 * lane) & 31);
      const double right = __shfl_sync(0xffffffffu, v, (2 * lane + 1) & 31);
      v = left + right;
      if (lane < active) tree[(n_leaves >> level) + b * (kFastSubtreeLeaves >> level) + warp * active + lane] = v;
    }
    if (lane == 0) warp_roots[warp] = v;
    __syncthreads();
    if (warp == 0) {  // levels 9..11: 8 nodes -> the subtree root
      v = lane < kFastThreads / 32 ? warp_roots[lane] : 0.0;
#pragma unroll
      for (int level = 9; level <= 11; ++level) {
        const int active = (kFastThreads / 32) >> (level - 8);
        const double left = __shfl_sync(0xffffffffu, v, (2 * lane) & 31);
        const double right = __shfl_sync(0xffffffffu, v, (2 * lane + 1) & 31);
        v = left + right;
        if (lane < active) tree[(n_leaves >> level) + b * (kFastSubtreeLeaves >> level) + lane] = v;
      }
    }
  }
  __threadfence();  // this thread's node writes are visible device-wide before the block arrives
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned int arrived = atomicInc(reinterpret_cast<unsigned int*>(tree), gridDim.x - 1);
    is_last = arrived == gridDim.x - 1 ? 1 : 0;
  }
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  reduce_nodes(tree, n_subtrees, n_subtrees, local, true);
}

cudaError_t set_shared_limit(const void* kernel, size_t shared_bytes) {
  if (shared_bytes <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(shared_bytes));
}

// ---------------------------------------------------------------- per_sample

__device__ inline double read_node(const double* __restrict__ tree, const double* cached, int64_t node,
                                   int64_t n_cached) {
  return node < n_cached ? cached[node] : tree[node];
}

__global__ void sample_kernel(const double* __restrict__ tree, const int64_t* __restrict__ head_size,
                              const double* __restrict__ uniforms, int64_t* __restrict__ indices,
                              float* __restrict__ weights, int64_t batch, int64_t n_leaves, double beta) {
  __shared__ double cached[kCachedNodes];
  __shared__ double reduce_buffer[kSampleThreads / 32];
  __shared__ double block_extreme;
  const int64_t n_cached = (2 * n_leaves < kCachedNodes) ? 2 * n_leaves : kCachedNodes;
  for (int64_t i = threadIdx.x; i < n_cached; i += blockDim.x) cached[i] = tree[i];
  __syncthreads();

  const double total = cached[1];
  int depth = 0;
  while ((int64_t{1} << depth) < n_leaves) ++depth;
  // Pass 1: descend, write indices, track the extreme leaf that gives the largest weight.
  const bool want_min = beta >= 0.0;
  double extreme = want_min ? __longlong_as_double(0x7ff0000000000000LL) : 0.0;  // +inf or 0
  const int64_t per_round = static_cast<int64_t>(blockDim.x) * kSamplesPerThread;
  for (int64_t round = 0; round < batch; round += per_round) {
    double target[kSamplesPerThread];
    int64_t node[kSamplesPerThread];
#pragma unroll
    for (int k = 0; k < kSamplesPerThread; ++k) {
      const int64_t i = round + k * static_cast<int64_t>(blockDim.x) + threadIdx.x;
      const int64_t safe_i = i < batch ? i : batch - 1;
      target[k] = (static_cast<double>(safe_i) + uniforms[safe_i]) / static_cast<double>(batch) * total;
      node[k] = 1;
    }
    for (int level = 0; level < depth; ++level) {
#pragma unroll
      for (int k = 0; k < kSamplesPerThread; ++k) {
        const double left = read_node(tree, cached, 2 * node[k], n_cached);
        const double right = read_node(tree, cached, 2 * node[k] + 1, n_cached);
        const bool go_left = (target[k] < left && left > 0.0) || right == 0.0;
        if (!go_left) target[k] -= left;
        node[k] = 2 * node[k] + (go_left ? 0 : 1);
      }
    }
#pragma unroll
    for (int k = 0; k < kSamplesPerThread; ++k) {
      const int64_t i = round + k * static_cast<int64_t>(blockDim.x) + threadIdx.x;
      if (i < batch) {
        indices[i] = node[k] - n_leaves;
        const double leaf = read_node(tree, cached, node[k], n_cached);
        extreme = want_min ? fmin(extreme, leaf) : fmax(extreme, leaf);
      }
    }
  }
  // Block reduction of the extreme leaf.
  for (int offset = 16; offset > 0; offset >>= 1) {
    const double other = __shfl_down_sync(0xffffffffu, extreme, offset);
    extreme = want_min ? fmin(extreme, other) : fmax(extreme, other);
  }
  if ((threadIdx.x & 31) == 0) reduce_buffer[threadIdx.x >> 5] = extreme;
  __syncthreads();
  if (threadIdx.x < 32) {
    const int n_warps = blockDim.x >> 5;
    extreme = threadIdx.x < n_warps ? reduce_buffer[threadIdx.x] : reduce_buffer[0];
    for (int offset = 16; offset > 0; offset >>= 1) {
      const double other = __shfl_down_sync(0xffffffffu, extreme, offset);
      extreme = want_min ? fmin(extreme, other) : fmax(extreme, other);
    }
    if (threadIdx.x == 0) block_extreme = extreme;
  }
  __syncthreads();
  const double size = static_cast<double>(head_size[1]);
  const double max_weight = pow(size * (block_extreme / total), -beta);
  // Pass 2: weights (each thread re-reads the indices it wrote itself).
  for (int64_t round = 0; round < batch; round += per_round) {
#pragma unroll
    for (int k = 0; k < kSamplesPerThread; ++k) {
      const int64_t i = round + k * static_cast<int64_t>(blockDim.x) + threadIdx.x;
      if (i < batch) {
        const double leaf = read_node(tree, cached, n_leaves + indices[i], n_cached);
        weights[i] = static_cast<float>(pow(size * (leaf / total), -beta) / max_weight);
      }
    }
  }
}

// ---------------------------------------------------------------- per_update

__global__ void update_kernel(double* __restrict__ tree, float* __restrict__ max_priority,
                              const int64_t* __restrict__ indices, const float* __restrict__ td_abs,
                              int64_t batch, int64_t n_leaves, double alpha, float eps) {
  __shared__ int64_t tile[kUpdateThreads];
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t mine = i < batch ? indices[i] : -1;
  bool last = i < batch;
  // Last occurrence wins: look for the same index at a later position (tiles from this block on).
  for (int64_t tile_start = blockIdx.x * static_cast<int64_t>(blockDim.x); tile_start < batch;
       tile_start += blockDim.x) {
    const int64_t j_load = tile_start + threadIdx.x;
    tile[threadIdx.x] = j_load < batch ? indices[j_load] : -1;
    __syncthreads();
    const int64_t tile_len = (batch - tile_start < blockDim.x) ? batch - tile_start : blockDim.x;
    for (int64_t t = 0; t < tile_len; ++t) {
      if (tile_start + t > i && tile[t] == mine) last = false;
    }
    __syncthreads();
  }
  if (i >= batch) return;
  const float raw = __fadd_rn(td_abs[i], eps);
  // max_priority >= 0 always (starts at 1, only rises), so the int order of the bits is the float order.
  atomicMax(reinterpret_cast<int*>(max_priority), __float_as_int(raw));
  if (last && mine >= 0 && mine < n_leaves) tree[n_leaves + mine] = pow(static_cast<double>(raw), alpha);
}

// Large batches: "last occurrence wins" without scratch memory, in two passes over the batch.
// Pass 1 claims each listed leaf with atomicMax of a marker above every non-negative double's bit
// pattern plus the position, so the leaf ends up holding the marker of its last occurrence. Pass 2:
// each entry's compare-and-swap of its own marker with its leaf value succeeds only for that last
// occurrence (a loser sees the winner's marker or the winner's value, never its own marker).
constexpr unsigned long long kClaimMarker = 0xFFF0000000000001ULL;  // above -inf; a NaN pattern

__global__ void update_claim_kernel(double* __restrict__ tree, float* __restrict__ max_priority,
                                    const int64_t* __restrict__ indices, const float* __restrict__ td_abs,
                                    int64_t batch, int64_t n_leaves, float eps) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= batch) return;
  const float raw = __fadd_rn(td_abs[i], eps);
  atomicMax(reinterpret_cast<int*>(max_priority), __float_as_int(raw));
  const int64_t leaf = indices[i];
  if (leaf < 0 || leaf >= n_leaves) return;
  atomicMax(reinterpret_cast<unsigned long long*>(tree + n_leaves + leaf),
            kClaimMarker + static_cast<unsigned long long>(i));
}

__global__ void update_write_kernel(double* __restrict__ tree, const int64_t* __restrict__ indices,
                                    const float* __restrict__ td_abs, int64_t batch, int64_t n_leaves,
                                    double alpha, float eps) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= batch) return;
  const int64_t leaf = indices[i];
  if (leaf < 0 || leaf >= n_leaves) return;
  const float raw = __fadd_rn(td_abs[i], eps);
  const double value = pow(static_cast<double>(raw), alpha);
  atomicCAS(reinterpret_cast<unsigned long long*>(tree + n_leaves + leaf),
            kClaimMarker + static_cast<unsigned long long>(i),
            static_cast<unsigned long long>(__double_as_longlong(value)));
}

}  // namespace

cudaError_t launch_push_slots(const bool* wants, const float* new_priority, const float* max_multiplier,
                              const float* max_priority, int64_t* head_size, double* tree, int64_t* slots,
                              int64_t n, int64_t capacity, int64_t n_leaves, double alpha,
                              cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  push_slots_kernel<<<1, kScanThreads, 0, stream>>>(wants, new_priority, max_multiplier, max_priority,
                                                    head_size, tree, slots, n, capacity, n_leaves, alpha);
  return cudaGetLastError();
}

cudaError_t launch_push_rows(const int64_t* slots, const float* new_obs, const float* new_next_obs,
                             const int64_t* new_action, const float* new_reward, const float* new_done,
                             const int8_t* new_kind, float* obs, float* next_obs, int64_t* action,
                             float* reward, float* done, int8_t* kind, int64_t n, int64_t obs_dim,
                             int64_t n_branches, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  int64_t width = obs_dim > n_branches ? obs_dim : n_branches;
  if (width < 1) width = 1;
  const int64_t total = n * width;
  if (total < (int64_t{1} << 31)) {
    const auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; };
    const bool vec4 = obs_dim % 4 == 0 && aligned(new_obs) && aligned(new_next_obs) && aligned(obs) &&
                      aligned(next_obs);
    const int64_t units = vec4 ? obs_dim / 4 : obs_dim;
    int64_t fast_width = units > n_branches ? units : n_branches;
    if (fast_width < 1) fast_width = 1;
    const int blocks = grid_for(n * fast_width, kRowThreads);
    if (vec4) {
      push_rows_fast_kernel<true><<<blocks, kRowThreads, 0, stream>>>(
          slots, new_obs, new_next_obs, new_action, new_reward, new_done, new_kind, obs, next_obs, action, reward,
          done, kind, static_cast<int>(n), static_cast<int>(obs_dim), static_cast<int>(n_branches));
    } else {
      push_rows_fast_kernel<false><<<blocks, kRowThreads, 0, stream>>>(
          slots, new_obs, new_next_obs, new_action, new_reward, new_done, new_kind, obs, next_obs, action, reward,
          done, kind, static_cast<int>(n), static_cast<int>(obs_dim), static_cast<int>(n_branches));
    }
    return cudaGetLastError();
  }
  push_rows_kernel<<<grid_for(total, kRowThreads), kRowThreads, 0, stream>>>(
      slots, new_obs, new_next_obs, new_action, new_reward, new_done, new_kind, obs, next_obs, action,
      reward, done, kind, n, obs_dim, n_branches);
  return cudaGetLastError();
}

cudaError_t launch_tree_rebuild(double* tree, const int64_t* leaf_idx, int64_t m, int64_t n_leaves,
                                cudaStream_t stream) {
  if (n_leaves < 2) return cudaSuccess;
  if (n_leaves <= kMinSubtreeLeaves) {
    const int threads = static_cast<int>(n_leaves / 2 < 1024 ? n_leaves / 2 : 1024);
    small_tree_kernel<<<1, threads, static_cast<size_t>(n_leaves) * sizeof(double), stream>>>(tree, n_leaves);
    return cudaGetLastError();
  }
  if (n_leaves <= kFastMaxLeaves && (reinterpret_cast<uintptr_t>(tree) & 15u) == 0) {
    const int64_t n_subtrees = n_leaves / kFastSubtreeLeaves;
    // Many listed leaves: rebuild everything (marking would cost more than it skips).
    const bool filtered = m <= n_leaves / 8;
    if (filtered) {
      if (m == 0) return cudaSuccess;
      mark_dirty_kernel<<<grid_for(m, 256, 1024), 256, 0, stream>>>(tree, leaf_idx, m, n_leaves, n_subtrees);
      const cudaError_t err = cudaGetLastError();
      if (err != cudaSuccess) return err;
    }
    const size_t shared_bytes = static_cast<size_t>(n_subtrees < 32 ? 32 : n_subtrees) * sizeof(double);
    fast_rebuild_kernel<<<static_cast<unsigned>(n_subtrees), kFastThreads, shared_bytes, stream>>>(tree, n_leaves,
                                                                                                 filtered);
    return cudaGetLastError();
  }
  int64_t width = n_leaves / kTopLeaves;
  if (width < kMinSubtreeLeaves) width = kMinSubtreeLeaves;
  if (width > kMaxSubtreeLeaves) width = kMaxSubtreeLeaves;  // then n_leaves / width <= 16384 too
  const int64_t blocks = n_leaves / width;
  const size_t shared_bytes = static_cast<size_t>(width > blocks ? width : blocks) * sizeof(double);
  const cudaError_t err = set_shared_limit(reinterpret_cast<const void*>(tree_rebuild_kernel), shared_bytes);
  if (err != cudaSuccess) return err;
  // Few listed leaves: skip the subtrees that hold none (each block scans the m indices).
  const int64_t* filter = m < blocks ? leaf_idx : nullptr;
  tree_rebuild_kernel<<<static_cast<unsigned>(blocks), 1024, shared_bytes, stream>>>(tree, n_leaves, width,
                                                                                     filter, m);
  return cudaGetLastError();
}

cudaError_t launch_sample(const double* tree, const int64_t* head_size, const double* uniforms,
                          int64_t* indices, float* weights, int64_t batch, int64_t n_leaves, double beta,
                          cudaStream_t stream) {
  if (batch == 0) return cudaSuccess;
  sample_kernel<<<1, kSampleThreads, 0, stream>>>(tree, head_size, uniforms, indices, weights, batch,
                                                  n_leaves, beta);
  return cudaGetLastError();
}

cudaError_t launch_update(double* tree, float* max_priority, const int64_t* indices, const float* td_abs,
                          int64_t batch, int64_t n_leaves, double alpha, float eps, cudaStream_t stream) {
  if (batch == 0) return cudaSuccess;
  if (batch <= kUpdateThreads) {  // one block: duplicates found by comparing in shared memory
    update_kernel<<<1, kUpdateThreads, 0, stream>>>(tree, max_priority, indices, td_abs, batch, n_leaves,
                                                    alpha, eps);
    return cudaGetLastError();
  }
  const int blocks = static_cast<int>((batch + kUpdateThreads - 1) / kUpdateThreads);
  update_claim_kernel<<<blocks, kUpdateThreads, 0, stream>>>(tree, max_priority, indices, td_abs, batch,
                                                             n_leaves, eps);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  update_write_kernel<<<blocks, kUpdateThreads, 0, stream>>>(tree, indices, td_abs, batch, n_leaves, alpha,
                                                             eps);
  return cudaGetLastError();
}

}  // namespace per
}  // namespace cuda_ext
