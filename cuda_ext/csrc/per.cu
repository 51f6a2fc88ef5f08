// Prioritized-replay kernels (per_push, per_tree_rebuild, per_sample, per_update). Torch-free device
// code; the launch functions are declared in per_kernels.cuh. Arithmetic mirrors
// cuda_ext/reference/per.py exactly: float32 priorities with explicit round-to-nearest multiply and add
// (no fused multiply-add), float64 leaves `pow(p, alpha)`, every tree node `left + right`.
#include <climits>
#include <cstdint>

#include <cuda_runtime.h>

#include "common.h"
#include "launch.cuh"
#include "per_kernels.cuh"
#include "philox.cuh"

namespace cuda_ext {
namespace per {
namespace {

constexpr int kUpdateThreads = 256;
constexpr int kSampleThreads = 1024;
constexpr int kSamplesPerThread = 4;       // descents interleaved per thread, to hide memory latency
constexpr int64_t kCachedNodes = 2048;     // top tree nodes (heap indices < 2048) kept in shared memory
constexpr int64_t kMinSubtreeLeaves = 2048;
constexpr int64_t kTopLeaves = 4096;       // subtree roots reduced by the single top block, preferred
constexpr int64_t kMaxSubtreeLeaves = 16384;  // 128 KiB of shared memory per block

// Dirty subtrees (cuda_ext/reference/per.py): for kMarkedMinLeaves <= P <= kFastMaxLeaves the writers
// (push, update) set the root of each written leaf's kFastSubtreeLeaves-leaf subtree, heap node
// P / kFastSubtreeLeaves + leaf / kFastSubtreeLeaves, to kDirtyMarker; per_tree_refresh rebuilds those.
constexpr int kFastThreads = 256;
constexpr int64_t kFastSubtreeLeaves = 8 * kFastThreads;  // 2048: the subtree root is 11 levels up
constexpr int64_t kFastMaxLeaves = int64_t{1} << 23;       // at most 4096 subtree roots for the top block
constexpr int64_t kMarkedMinLeaves = 2 * kFastSubtreeLeaves;
constexpr unsigned long long kDirtyMarker = 0x7FF4C0FFEE0DDBA1ULL;  // a signaling-NaN bit pattern

// Whether the writers of a P-leaf tree mark dirty subtrees.
__host__ __device__ inline bool marks_subtrees(int64_t n_leaves) {
  return n_leaves >= kMarkedMinLeaves && n_leaves <= kFastMaxLeaves;
}

// Mark the subtree above `leaf` dirty (the caller checked marks_subtrees(n_leaves)).
__device__ inline void mark_subtree(double* tree, int64_t n_leaves, int64_t leaf) {
  reinterpret_cast<unsigned long long*>(tree)[n_leaves / kFastSubtreeLeaves + leaf / kFastSubtreeLeaves] =
      kDirtyMarker;
}

// ---------------------------------------------------------------- per_push

// per_push in two launches over blocks of kPushRows rows. push_count_kernel: each block's number of rows
// that want a slot (workspace[b]); block 0 also copies (write_head, size) to workspace[n_blocks + 0/1] so
// the second launch can update head_size without a read/write race. push_write_kernel: each block sums the
// counts (its exclusive prefix and the total), gives its rows their slots and leaves, copies them into the
// ring (16-byte accesses when VEC4), and block 0 writes the new write_head and size.
constexpr int kPushRows = 32;  // rows per push block: the fastest of 16, 32, 64 (benchmarks/RESULTS.md)
constexpr int kPushThreads = 256;

__global__ void push_count_kernel(const bool* __restrict__ wants, int64_t n, const int64_t* __restrict__ head_size,
                                  int64_t* __restrict__ workspace) {
  pdl_wait_then_release();
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kPushRows + threadIdx.x;
  const int count = __syncthreads_count(row < n && wants[row]);
  if (threadIdx.x == 0) {
    workspace[blockIdx.x] = count;
    if (blockIdx.x == 0) {
      workspace[gridDim.x] = head_size[0];
      workspace[gridDim.x + 1] = head_size[1];
    }
  }
}

template <bool VEC4>
__global__ void __launch_bounds__(kPushThreads) push_write_kernel(
    const bool* __restrict__ wants, const float* __restrict__ new_priority,
    const float* __restrict__ max_multiplier, const float* __restrict__ max_priority,
    int64_t* __restrict__ head_size, double* __restrict__ tree, int64_t* __restrict__ slots,
    const float* __restrict__ new_obs, const float* __restrict__ new_next_obs,
    const int64_t* __restrict__ new_action, const float* __restrict__ new_reward,
    const float* __restrict__ new_done, const int8_t* __restrict__ new_kind, float* __restrict__ obs,
    float* __restrict__ next_obs, int64_t* __restrict__ action, float* __restrict__ reward,
    float* __restrict__ done, int8_t* __restrict__ kind, const int64_t* __restrict__ workspace, int64_t n,
    int64_t capacity, int64_t n_leaves, double alpha, int obs_dim, int n_branches) {
  pdl_wait_then_release();
  __shared__ int64_t s_sums[2][kPushThreads / 32];
  __shared__ int s_warp0;
  __shared__ int64_t s_slot[kPushRows];
  const int n_blocks = gridDim.x;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  int64_t before = 0;
  int64_t all = 0;
  for (int j = threadIdx.x; j < n_blocks; j += blockDim.x) {
    const int64_t c = workspace[j];
    all += c;
    if (j < static_cast<int>(blockIdx.x)) before += c;
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    before += __shfl_down_sync(0xffffffffu, before, offset);
    all += __shfl_down_sync(0xffffffffu, all, offset);
  }
  if (lane == 0) {
    s_sums[0][warp] = before;
    s_sums[1][warp] = all;
  }
  const int64_t first_row = static_cast<int64_t>(blockIdx.x) * kPushRows;
  const int64_t row = first_row + threadIdx.x;
  const bool want = threadIdx.x < kPushRows && row < n && wants[row];
  const unsigned ballot = __ballot_sync(0xffffffffu, want);
  __syncthreads();
  if (threadIdx.x == 0) s_warp0 = __popc(ballot);
  int64_t prefix_before = 0;
  int64_t total = 0;
#pragma unroll
  for (int w = 0; w < kPushThreads / 32; ++w) {
    prefix_before += s_sums[0][w];
    total += s_sums[1][w];
  }
  __syncthreads();
  const int64_t head = workspace[n_blocks];
  const int64_t size = workspace[n_blocks + 1];
  if (threadIdx.x < kPushRows) {
    const int in_warp = __popc(ballot & ((1u << lane) - 1u));
    const int64_t prefix = prefix_before + (warp == 1 ? s_warp0 : 0) + in_warp;
    int64_t slot = -1;
    if (want && prefix >= total - capacity) {
      slot = (head + prefix) % capacity;
      const float raw = __fadd_rn(new_priority[row], __fmul_rn(max_multiplier[row], max_priority[0]));
      tree[n_leaves + slot] = pow(static_cast<double>(raw), alpha);
      if (marks_subtrees(n_leaves)) mark_subtree(tree, n_leaves, slot);
    }
    if (row < n) slots[row] = slot;
    s_slot[threadIdx.x] = slot;
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    head_size[0] = (head + total) % capacity;
    head_size[1] = min(size + total, capacity);
  }
  __syncthreads();
  const int rows_here = static_cast<int>(n - first_row < kPushRows ? n - first_row : kPushRows);
  const int units = VEC4 ? obs_dim >> 2 : obs_dim;
  for (int idx = threadIdx.x; idx < rows_here * units; idx += blockDim.x) {
    const int r = idx / units;
    const int64_t slot = s_slot[r];
    if (slot < 0) continue;
    const int c = idx - r * units;
    const int64_t from = (first_row + r) * units + c;
    const int64_t to = slot * units + c;
    if (VEC4) {
      reinterpret_cast<float4*>(obs)[to] = reinterpret_cast<const float4*>(new_obs)[from];
      reinterpret_cast<float4*>(next_obs)[to] = reinterpret_cast<const float4*>(new_next_obs)[from];
    } else {
      obs[to] = new_obs[from];
      next_obs[to] = new_next_obs[from];
    }
  }
  for (int idx = threadIdx.x; idx < rows_here * n_branches; idx += blockDim.x) {
    const int r = idx / n_branches;
    const int64_t slot = s_slot[r];
    if (slot < 0) continue;
    const int k = idx - r * n_branches;
    action[slot * n_branches + k] = new_action[(first_row + r) * n_branches + k];
  }
  if (threadIdx.x < rows_here) {
    const int64_t slot = s_slot[threadIdx.x];
    if (slot >= 0) {
      reward[slot] = new_reward[first_row + threadIdx.x];
      done[slot] = new_done[first_row + threadIdx.x];
      kind[slot] = new_kind[first_row + threadIdx.x];
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

// True in every thread of the block that arrives last at the grid's arrival counter, the low 32 bits of
// tree[0] (unused by the tree, kept 0 between calls: atomicInc wraps it back to 0 on the last arrival).
// Each thread's earlier writes are visible device-wide before its block arrives, and the last block then
// sees every other block's writes. Every thread of the block must call it.
__device__ inline bool last_block_to_arrive(double* tree) {
  __shared__ int is_last;
  __threadfence();  // this thread's node writes are visible device-wide before the block arrives
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned int arrived = atomicInc(reinterpret_cast<unsigned int*>(tree), gridDim.x - 1);
    is_last = arrived == gridDim.x - 1 ? 1 : 0;
  }
  __syncthreads();
  if (!is_last) return false;
  __threadfence();
  return true;
}

// Whole tree of n_leaves <= width in one block.
__global__ void small_tree_kernel(double* tree, int64_t n_leaves) {
  pdl_wait_then_release();
  extern __shared__ double local[];
  reduce_nodes(tree, n_leaves, n_leaves, local, false);
}

// Block b rebuilds the subtree over leaves [b * width, (b + 1) * width) (with `leaf_idx` non-null,
// only if one of them is listed); the last block to finish then reduces the gridDim.x subtree roots
// to the root. The arrival counter is the low 32 bits of tree[0] (unused by the tree, kept 0
// between calls: atomicInc wraps it back to 0 on the last arrival).
__global__ void tree_rebuild_kernel(double* tree, int64_t n_leaves, int64_t width,
                                    const int64_t* __restrict__ leaf_idx, int64_t m) {
  pdl_wait_then_release();
  extern __shared__ double local[];
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
  if (!last_block_to_arrive(tree)) return;
  reduce_nodes(tree, gridDim.x, gridDim.x, local, true);
}

// Fast path for 2^12 <= P <= 2^23: subtrees of kFastSubtreeLeaves leaves, kFastThreads threads each
// summing 8 leaves in registers (16-byte loads), then warp shuffles; one barrier per subtree. A block
// rebuilds its subtree only if it holds a listed leaf: kScan reads the listed leaves, kMarker tests whether
// mark_dirty_kernel set the subtree root to kDirtyMarker (a clean root cannot hold a stale value; a
// legitimate sum that happens to equal the marker is just rebuilt again), kAll rebuilds every subtree.
// The last block to arrive reduces the gridDim.x subtree roots to the root.
__global__ void mark_dirty_kernel(double* __restrict__ tree, const int64_t* __restrict__ leaf_idx, int64_t m,
                                  int64_t n_leaves, int64_t n_subtrees) {
  pdl_wait_then_release();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < m;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t leaf = leaf_idx[i];
    if (leaf >= 0 && leaf < n_leaves) {
      reinterpret_cast<unsigned long long*>(tree)[n_subtrees + leaf / kFastSubtreeLeaves] = kDirtyMarker;
    }
  }
}

enum class DirtyTest { kAll, kMarker, kScan };

// One level of reduce_chunk: the W values r[0..W) (nodes level + chunk W + k) to W / 2 parents, written,
// then the levels above (W a compile-time constant, so r stays in registers).
template <int W>
__device__ inline void sum_levels(double* r, double* tree, int64_t level, int64_t chunk) {
  level /= 2;
#pragma unroll
  for (int k = 0; k < W / 2; ++k) {
    r[k] = r[2 * k] + r[2 * k + 1];
    tree[level + chunk * (W / 2) + k] = r[k];
  }
  if constexpr (W / 2 > 1) sum_levels<W / 2>(r, tree, level, chunk);
}

// Sum the C subtree roots [level + chunk C, level + (chunk + 1) C) (coherent 16-byte loads: other blocks
// wrote them in this launch) to one node, writing the log2(C) levels between; returns that node's value.
template <int C>
__device__ inline double reduce_chunk(double* tree, int64_t level, int64_t chunk) {
  double r[C];
  const double2* pairs = reinterpret_cast<const double2*>(tree + level + chunk * C);
#pragma unroll
  for (int k = 0; k < C / 2; ++k) {
    const double2 pair = __ldcg(pairs + k);
    r[2 * k] = pair.x;
    r[2 * k + 1] = pair.y;
  }
  sum_levels<C>(r, tree, level, chunk);
  return r[0];
}

// The top of the tree above the n = gridDim.x subtree roots [n, 2n) (n a power of two, 2..4096), by the
// kFastThreads threads of one block: each sums n / 256 roots in registers (n > 256), then each warp reduces
// its 32 values by shuffles, then warp 0 the warp roots; every node is written, as left + right.
__device__ void reduce_top(double* tree, int64_t n) {
  __shared__ double warp_roots[kFastThreads / 32];
  const int t = threadIdx.x;
  const int lane = t & 31;
  const int warp = t >> 5;
  int64_t m = n;  // thread t < m holds node m + t
  double v = 0.0;
  switch (n / kFastThreads) {
    case 16: v = reduce_chunk<16>(tree, n, t); m = kFastThreads; break;
    case 8: v = reduce_chunk<8>(tree, n, t); m = kFastThreads; break;
    case 4: v = reduce_chunk<4>(tree, n, t); m = kFastThreads; break;
    case 2: v = reduce_chunk<2>(tree, n, t); m = kFastThreads; break;
    default: if (t < n) v = __ldcg(tree + n + t); break;  // n <= 256
  }
  // Each warp: its (up to) 32 nodes [m + 32 warp, ...) down to one, node m / 32 + warp (node 1 if m <= 32).
  const bool holds = warp * 32 < m;
  int64_t count = m;
  for (int active = m < 32 ? static_cast<int>(m) : 32; active > 1;) {
    const double left = __shfl_sync(0xffffffffu, v, (2 * lane) & 31);
    const double right = __shfl_sync(0xffffffffu, v, (2 * lane + 1) & 31);
    v = left + right;
    active /= 2;
    count /= 2;
    if (holds && lane < active) tree[count + warp * active + lane] = v;
  }
  if (m <= 32) return;
  const int n_warps = static_cast<int>(m / 32);  // 2..8 warp roots, nodes [n_warps, 2 n_warps)
  if (lane == 0 && holds) warp_roots[warp] = v;
  __syncthreads();
  if (warp != 0) return;
  v = lane < n_warps ? warp_roots[lane] : 0.0;
  count = n_warps;
  for (int active = n_warps; active > 1;) {
    const double left = __shfl_sync(0xffffffffu, v, (2 * lane) & 31);
    const double right = __shfl_sync(0xffffffffu, v, (2 * lane + 1) & 31);
    v = left + right;
    active /= 2;
    count /= 2;
    if (lane < active) tree[count + lane] = v;
  }
}

__global__ void __launch_bounds__(kFastThreads) fast_rebuild_kernel(double* tree, int64_t n_leaves, DirtyTest test,
                                                                    const int64_t* __restrict__ leaf_idx,
                                                                    int64_t m) {
  pdl_wait_then_release();
  __shared__ double warp_roots[kFastThreads / 32];
  const int64_t n_subtrees = gridDim.x;
  const int64_t b = blockIdx.x;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  bool dirty = true;
  if (test == DirtyTest::kMarker) {
    dirty = reinterpret_cast<const unsigned long long*>(tree)[n_subtrees + b] == kDirtyMarker;
  } else if (test == DirtyTest::kScan) {  // few listed leaves: every block reads them all
    const int64_t lo = b * kFastSubtreeLeaves;
    const int64_t hi = lo + kFastSubtreeLeaves;
    int found = 0;
    for (int64_t i = threadIdx.x; i < m; i += blockDim.x) {
      const int64_t leaf = leaf_idx[i];
      found |= (leaf >= lo && leaf < hi) ? 1 : 0;
    }
    dirty = __syncthreads_or(found) != 0;
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
  if (!last_block_to_arrive(tree)) return;
  reduce_top(tree, n_subtrees);
}

cudaError_t set_shared_limit(const void* kernel, size_t shared_bytes) {
  if (shared_bytes <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(shared_bytes));
}

// ---------------------------------------------------------------- per_sample

// A sampler's uniform draws: the `uniforms` tensor, or (uniforms null: per_sample_philox) Philox4x32-10 draws
// of rng_state = (seed, counter), whose counter the sampler's last launch then advances by one (after every
// thread has read it). Every thread reads the state itself, so there is nothing to share.
struct UniformSource {
  const double* uniforms;
  int64_t* rng_state;
  uint64_t seed = 0;
  uint64_t counter = 0;

  __device__ void load() {
    if (uniforms == nullptr) {
      seed = static_cast<uint64_t>(rng_state[0]);
      counter = static_cast<uint64_t>(rng_state[1]);
    }
  }
  __device__ double operator()(int64_t i) const {
    return uniforms != nullptr ? uniforms[i] : philox_uniform(seed, counter, static_cast<uint64_t>(i));
  }
  // After a barrier that follows every read of the state (or in a later launch): the next counter.
  __device__ void advance() const {
    if (uniforms == nullptr && blockIdx.x == 0 && threadIdx.x == 0) {
      rng_state[1] = static_cast<int64_t>(counter + 1);
    }
  }
};

__device__ inline double read_node(const double* __restrict__ tree, const double* cached, int64_t node,
                                   int64_t n_cached) {
  return node < n_cached ? cached[node] : tree[node];
}

__global__ void sample_kernel(const double* __restrict__ tree, const int64_t* __restrict__ head_size,
                              UniformSource draws, int64_t* __restrict__ indices,
                              float* __restrict__ weights, int64_t batch, int64_t n_leaves, double beta) {
  pdl_wait_then_release();
  draws.load();
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
      target[k] = (static_cast<double>(safe_i) + draws(safe_i)) / static_cast<double>(batch) * total;
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
  draws.advance();
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

// per_sample over many blocks (one sample per thread). The top kSampleCached nodes sit in shared memory;
// below them each round trip loads a node's two children and its four grandchildren (16-byte loads) and
// descends two levels, always comparing against the stored node values (so any tree gives the reference's
// path). sample_descend_kernel writes the indices, w_i = (size * leaf / total) ** -beta to workspace[i]
// and its block's largest w to workspace[batch + block]; sample_weights_kernel divides by the batch max.
constexpr int kSampleBlockThreads = 256;  // the fastest of 64, 128, 256 (benchmarks/RESULTS.md)
constexpr int64_t kSampleCached = 512;  // top nodes cached per block: the fastest of 256 .. 4096

__device__ inline void descend_one(double left, double right, double& target, int64_t& node, double& value) {
  const bool go_left = (target < left && left > 0.0) || right == 0.0;
  if (!go_left) target -= left;
  node = 2 * node + (go_left ? 0 : 1);
  value = go_left ? left : right;
}

// From `node` (1: the root) down `depth` levels: the cached top, then two levels per round trip.
__device__ inline void descend(const double* __restrict__ tree, const double* cached, int64_t n_cached, int depth,
                               double& target, int64_t& node, double& value) {
  int level = 0;
  while (level < depth && 2 * node < n_cached) {
    descend_one(cached[2 * node], cached[2 * node + 1], target, node, value);
    ++level;
  }
  while (level + 2 <= depth) {
    const double2 children = *reinterpret_cast<const double2*>(tree + 2 * node);
    const double2 left_pair = *reinterpret_cast<const double2*>(tree + 4 * node);
    const double2 right_pair = *reinterpret_cast<const double2*>(tree + 4 * node + 2);
    descend_one(children.x, children.y, target, node, value);
    const double2 below = (node & 1) ? right_pair : left_pair;
    descend_one(below.x, below.y, target, node, value);
    level += 2;
  }
  if (level < depth) {
    const double2 children = *reinterpret_cast<const double2*>(tree + 2 * node);
    descend_one(children.x, children.y, target, node, value);
  }
}

// The leaf node of stratified draw `safe_i` of `batch` (`u`: its uniform draw in [0, 1)): the one under the
// target (safe_i + u) / batch * total, found from the root; `value` is its leaf value.
__device__ inline int64_t stratified_leaf(const double* __restrict__ tree, const double* cached, int64_t n_cached,
                                          int depth, int64_t safe_i, double u, int64_t batch, double& value) {
  const double total = cached[1];
  double target = (static_cast<double>(safe_i) + u) / static_cast<double>(batch) * total;
  int64_t node = 1;
  value = total;
  descend(tree, cached, n_cached, depth, target, node, value);
  return node;
}

// Batches of at most kSampleBlockMax: one block, one sample per thread, weights in the same launch; beyond
// 256 the grid path is faster (benchmarks/RESULTS.md).
constexpr int64_t kSampleBlockMax = 256;

__global__ void __launch_bounds__(1024) sample_block_kernel(const double* __restrict__ tree,
                                                            const int64_t* __restrict__ head_size,
                                                            UniformSource draws,
                                                            int64_t* __restrict__ indices,
                                                            float* __restrict__ weights, int64_t batch,
                                                            int64_t n_leaves, int depth, double beta) {
  pdl_wait_then_release();
  __shared__ double cached[kSampleCached];
  __shared__ double warp_max[32];
  const int64_t n_cached = (2 * n_leaves < kSampleCached) ? 2 * n_leaves : kSampleCached;
  for (int64_t k = threadIdx.x; k < n_cached; k += blockDim.x) cached[k] = tree[k];
  const int64_t i = threadIdx.x;
  const int64_t safe_i = i < batch ? i : batch - 1;
  draws.load();
  const double u = draws(safe_i);
  const double size = static_cast<double>(head_size[1]);
  __syncthreads();
  draws.advance();
  const double total = cached[1];
  double value;
  const int64_t node = stratified_leaf(tree, cached, n_cached, depth, safe_i, u, batch, value);
  double w = 0.0;
  if (i < batch) {
    indices[i] = node - n_leaves;
    w = pow(size * (value / total), -beta);
  }
  double m = w;
  for (int offset = 16; offset > 0; offset >>= 1) m = fmax(m, __shfl_down_sync(0xffffffffu, m, offset));
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = m;
  __syncthreads();
  m = warp_max[0];
  for (int k = 1; k < static_cast<int>(blockDim.x >> 5); ++k) m = fmax(m, warp_max[k]);
  if (i < batch) weights[i] = static_cast<float>(w / m);
}

__global__ void __launch_bounds__(kSampleBlockThreads) sample_descend_kernel(
    const double* __restrict__ tree, const int64_t* __restrict__ head_size, UniformSource draws,
    int64_t* __restrict__ indices, double* __restrict__ workspace, int64_t batch, int64_t n_leaves, int depth,
    double beta) {
  pdl_wait_then_release();
  __shared__ double cached[kSampleCached];
  __shared__ double block_max[kSampleBlockThreads / 32];
  const int64_t n_cached = (2 * n_leaves < kSampleCached) ? 2 * n_leaves : kSampleCached;
  for (int64_t k = threadIdx.x; k < n_cached; k += blockDim.x) cached[k] = tree[k];
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t safe_i = i < batch ? i : batch - 1;
  draws.load();
  const double u = draws(safe_i);
  const double size = static_cast<double>(head_size[1]);
  __syncthreads();
  const double total = cached[1];
  double value;
  const int64_t node = stratified_leaf(tree, cached, n_cached, depth, safe_i, u, batch, value);
  double w = 0.0;
  if (i < batch) {
    indices[i] = node - n_leaves;
    w = pow(size * (value / total), -beta);
    workspace[i] = w;
  }
  for (int offset = 16; offset > 0; offset >>= 1) w = fmax(w, __shfl_down_sync(0xffffffffu, w, offset));
  if ((threadIdx.x & 31) == 0) block_max[threadIdx.x >> 5] = w;
  __syncthreads();
  if (threadIdx.x == 0) {
    double m = block_max[0];
    for (int k = 1; k < kSampleBlockThreads / 32; ++k) m = fmax(m, block_max[k]);
    workspace[batch + blockIdx.x] = m;
  }
}

__global__ void sample_weights_kernel(const double* __restrict__ workspace, float* __restrict__ weights,
                                      int64_t batch, int n_partials, UniformSource draws) {
  pdl_wait_then_release();
  draws.load();  // sample_descend_kernel (finished) read the state; this launch advances it
  draws.advance();
  __shared__ double s_max;
  if (threadIdx.x < 32) {
    double m = 0.0;
    for (int k = threadIdx.x; k < n_partials; k += 32) m = fmax(m, workspace[batch + k]);
    for (int offset = 16; offset > 0; offset >>= 1) m = fmax(m, __shfl_down_sync(0xffffffffu, m, offset));
    if (threadIdx.x == 0) s_max = m;
  }
  __syncthreads();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < batch) weights[i] = static_cast<float>(workspace[i] / s_max);
}

// ---------------------------------------------------------------- per_update

// "Last occurrence wins" without scratch memory, in two passes over the batch.
// Pass 1 claims each listed leaf with atomicMax of a marker above every non-negative double's bit
// pattern plus the position, so the leaf ends up holding the marker of its last occurrence. Pass 2:
// each entry's compare-and-swap of its own marker with its leaf value succeeds only for that last
// occurrence (a loser sees the winner's marker or the winner's value, never its own marker).
constexpr unsigned long long kClaimMarker = 0xFFF0000000000001ULL;  // above -inf; a NaN pattern

__global__ void update_claim_kernel(double* __restrict__ tree, float* __restrict__ max_priority,
                                    const int64_t* __restrict__ indices, const float* __restrict__ td_abs,
                                    int64_t batch, int64_t n_leaves, float eps) {
  pdl_wait_then_release();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  // One atomicMax per warp (of the warp's largest bit pattern: max_priority >= 0, so int order is float
  // order for every value that can win).
  const int bits = i < batch ? __float_as_int(__fadd_rn(td_abs[i], eps)) : INT_MIN;
  const int warp_bits = __reduce_max_sync(0xffffffffu, bits);
  if ((threadIdx.x & 31) == 0 && warp_bits != INT_MIN) atomicMax(reinterpret_cast<int*>(max_priority), warp_bits);
  if (i >= batch) return;
  const int64_t leaf = indices[i];
  if (leaf < 0 || leaf >= n_leaves) return;
  atomicMax(reinterpret_cast<unsigned long long*>(tree + n_leaves + leaf),
            kClaimMarker + static_cast<unsigned long long>(i));
}

// Batches of at most kUpdateBlockMax: the same two passes in one block, a barrier between them; larger
// batches are faster as two grid launches (see kSampleBlockMax).
constexpr int64_t kUpdateBlockMax = 256;

__global__ void __launch_bounds__(1024) update_block_kernel(double* __restrict__ tree,
                                                            float* __restrict__ max_priority,
                                                            const int64_t* __restrict__ indices,
                                                            const float* __restrict__ td_abs, int64_t batch,
                                                            int64_t n_leaves, double alpha, float eps) {
  pdl_wait_then_release();
  for (int64_t base = 0; base < batch; base += blockDim.x) {  // uniform trip count: whole warps reduce
    const int64_t i = base + threadIdx.x;
    const int bits = i < batch ? __float_as_int(__fadd_rn(td_abs[i], eps)) : INT_MIN;
    const int warp_bits = __reduce_max_sync(0xffffffffu, bits);
    if ((threadIdx.x & 31) == 0 && warp_bits != INT_MIN) {
      atomicMax(reinterpret_cast<int*>(max_priority), warp_bits);
    }
    if (i < batch) {
      const int64_t leaf = indices[i];
      if (leaf >= 0 && leaf < n_leaves) {
        atomicMax(reinterpret_cast<unsigned long long*>(tree + n_leaves + leaf),
                  kClaimMarker + static_cast<unsigned long long>(i));
      }
    }
  }
  __threadfence();
  __syncthreads();  // every claim is in place before any entry looks for its own marker
  for (int64_t i = threadIdx.x; i < batch; i += blockDim.x) {
    const int64_t leaf = indices[i];
    if (leaf < 0 || leaf >= n_leaves) continue;
    const float raw = __fadd_rn(td_abs[i], eps);
    const double value = pow(static_cast<double>(raw), alpha);
    atomicCAS(reinterpret_cast<unsigned long long*>(tree + n_leaves + leaf),
              kClaimMarker + static_cast<unsigned long long>(i),
              static_cast<unsigned long long>(__double_as_longlong(value)));
    if (marks_subtrees(n_leaves)) mark_subtree(tree, n_leaves, leaf);
  }
}

__global__ void update_write_kernel(double* __restrict__ tree, const int64_t* __restrict__ indices,
                                    const float* __restrict__ td_abs, int64_t batch, int64_t n_leaves,
                                    double alpha, float eps) {
  pdl_wait_then_release();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= batch) return;
  const int64_t leaf = indices[i];
  if (leaf < 0 || leaf >= n_leaves) return;
  const float raw = __fadd_rn(td_abs[i], eps);
  const double value = pow(static_cast<double>(raw), alpha);
  atomicCAS(reinterpret_cast<unsigned long long*>(tree + n_leaves + leaf),
            kClaimMarker + static_cast<unsigned long long>(i),
            static_cast<unsigned long long>(__double_as_longlong(value)));
  if (marks_subtrees(n_leaves)) mark_subtree(tree, n_leaves, leaf);
}

}  // namespace

int64_t push_workspace_size(int64_t n) { return (n + kPushRows - 1) / kPushRows + 2; }

cudaError_t launch_push(const bool* wants, const float* new_priority, const float* max_multiplier,
                        const float* max_priority, int64_t* head_size, double* tree, int64_t* slots,
                        const float* new_obs, const float* new_next_obs, const int64_t* new_action,
                        const float* new_reward, const float* new_done, const int8_t* new_kind, float* obs,
                        float* next_obs, int64_t* action, float* reward, float* done, int8_t* kind, int64_t n,
                        int64_t capacity, int64_t n_leaves, int64_t obs_dim, int64_t n_branches, double alpha,
                        int64_t* workspace, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const int64_t n_blocks = (n + kPushRows - 1) / kPushRows;
  if (n_blocks > 0x7fffffff || obs_dim > 0x7fffffff / kPushRows || n_branches > 0x7fffffff / kPushRows) {
    return cudaErrorInvalidValue;
  }
  CUDA_EXT_LAUNCH(push_count_kernel, static_cast<unsigned>(n_blocks), kPushRows, 0, stream, wants, n, head_size, workspace);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; };
  const bool vec4 =
      obs_dim % 4 == 0 && aligned(new_obs) && aligned(new_next_obs) && aligned(obs) && aligned(next_obs);
  if (vec4) {
    CUDA_EXT_LAUNCH(push_write_kernel<true>, static_cast<unsigned>(n_blocks), kPushThreads, 0, stream, 
        wants, new_priority, max_multiplier, max_priority, head_size, tree, slots, new_obs, new_next_obs,
        new_action, new_reward, new_done, new_kind, obs, next_obs, action, reward, done, kind, workspace, n,
        capacity, n_leaves, alpha, static_cast<int>(obs_dim), static_cast<int>(n_branches));
  } else {
    CUDA_EXT_LAUNCH(push_write_kernel<false>, static_cast<unsigned>(n_blocks), kPushThreads, 0, stream, 
        wants, new_priority, max_multiplier, max_priority, head_size, tree, slots, new_obs, new_next_obs,
        new_action, new_reward, new_done, new_kind, obs, next_obs, action, reward, done, kind, workspace, n,
        capacity, n_leaves, alpha, static_cast<int>(obs_dim), static_cast<int>(n_branches));
  }
  return cudaGetLastError();
}

// The whole tree of 2 <= P <= kMinSubtreeLeaves leaves, in one block.
static cudaError_t launch_small_tree(double* tree, int64_t n_leaves, cudaStream_t stream) {
  const int threads = static_cast<int>(n_leaves / 2 < 1024 ? n_leaves / 2 : 1024);
  CUDA_EXT_LAUNCH(small_tree_kernel, 1, threads, static_cast<size_t>(n_leaves) * sizeof(double), stream, tree, n_leaves);
  return cudaGetLastError();
}

// Subtrees of kMinSubtreeLeaves..kMaxSubtreeLeaves leaves, one block each, the last block the top. With fewer
// listed leaves (`leaf_idx`, m) than subtrees, only the subtrees holding one (each block scans the m indices);
// otherwise, or with no list (nullptr), every subtree.
static cudaError_t launch_subtree_rebuild(double* tree, int64_t n_leaves, const int64_t* leaf_idx, int64_t m,
                                          cudaStream_t stream) {
  int64_t width = n_leaves / kTopLeaves;
  if (width < kMinSubtreeLeaves) width = kMinSubtreeLeaves;
  if (width > kMaxSubtreeLeaves) width = kMaxSubtreeLeaves;  // then n_leaves / width <= 16384 too
  const int64_t blocks = n_leaves / width;
  const size_t shared_bytes = static_cast<size_t>(width > blocks ? width : blocks) * sizeof(double);
  const cudaError_t err = set_shared_limit(reinterpret_cast<const void*>(tree_rebuild_kernel), shared_bytes);
  if (err != cudaSuccess) return err;
  const int64_t* filter = m < blocks ? leaf_idx : nullptr;  // null leaf_idx: every subtree
  CUDA_EXT_LAUNCH(tree_rebuild_kernel, static_cast<unsigned>(blocks), 1024, shared_bytes, stream, tree, n_leaves, width,
                  filter, m);
  return cudaGetLastError();
}

cudaError_t launch_tree_rebuild(double* tree, const int64_t* leaf_idx, int64_t m, int64_t n_leaves,
                                cudaStream_t stream) {
  if (n_leaves < 2) return cudaSuccess;
  if (n_leaves <= kMinSubtreeLeaves) return launch_small_tree(tree, n_leaves, stream);
  if (n_leaves <= kFastMaxLeaves && (reinterpret_cast<uintptr_t>(tree) & 15u) == 0) {
    const int64_t n_subtrees = n_leaves / kFastSubtreeLeaves;
    // Up to kScanMax listed leaves: every block scans them (no extra launch); more, up to P / 8: a marking
    // launch first; more: rebuild everything (marking would cost more than it skips).
    constexpr int64_t kScanMax = 4 * kFastThreads;  // scanning more leaves costs more than marking
    if (m == 0) return cudaSuccess;
    DirtyTest test = DirtyTest::kAll;
    if (m <= kScanMax) {
      test = DirtyTest::kScan;
    } else if (m <= n_leaves / 8) {
      test = DirtyTest::kMarker;
      CUDA_EXT_LAUNCH(mark_dirty_kernel, grid_for(m, 256, 1024), 256, 0, stream, tree, leaf_idx, m, n_leaves, n_subtrees);
      const cudaError_t err = cudaGetLastError();
      if (err != cudaSuccess) return err;
    }
    CUDA_EXT_LAUNCH(fast_rebuild_kernel, static_cast<unsigned>(n_subtrees), kFastThreads, 0, stream, 
        tree, n_leaves, test, leaf_idx, m);
    return cudaGetLastError();
  }
  return launch_subtree_rebuild(tree, n_leaves, leaf_idx, m, stream);
}

cudaError_t launch_tree_refresh(double* tree, int64_t n_leaves, cudaStream_t stream) {
  if (n_leaves < 2) return cudaSuccess;
  if (n_leaves <= kMinSubtreeLeaves) return launch_small_tree(tree, n_leaves, stream);
  if (marks_subtrees(n_leaves) && (reinterpret_cast<uintptr_t>(tree) & 15u) == 0) {  // the marked subtrees
    const int64_t n_subtrees = n_leaves / kFastSubtreeLeaves;
    CUDA_EXT_LAUNCH(fast_rebuild_kernel, static_cast<unsigned>(n_subtrees), kFastThreads, 0, stream,
                    tree, n_leaves, DirtyTest::kMarker, static_cast<const int64_t*>(nullptr), int64_t{0});
    return cudaGetLastError();
  }
  // Unmarked (P > 2^23) or unaligned: every subtree (which also overwrites any marker).
  return launch_subtree_rebuild(tree, n_leaves, nullptr, 0, stream);
}

int64_t sample_workspace_size(int64_t batch) {
  return batch + (batch + kSampleBlockThreads - 1) / kSampleBlockThreads;
}

cudaError_t launch_sample(const double* tree, const int64_t* head_size, const double* uniforms,
                          int64_t* rng_state, int64_t* indices, float* weights, int64_t batch, int64_t n_leaves,
                          double beta, double* workspace, cudaStream_t stream) {
  if (batch == 0) return cudaSuccess;
  if ((uniforms == nullptr) == (rng_state == nullptr)) return cudaErrorInvalidValue;
  const UniformSource draws{uniforms, rng_state};
  int depth = 0;
  while ((int64_t{1} << depth) < n_leaves) ++depth;
  const int64_t blocks = (batch + kSampleBlockThreads - 1) / kSampleBlockThreads;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  if ((reinterpret_cast<uintptr_t>(tree) & 15u) != 0) {  // 16-byte node-pair loads need an aligned tree
    CUDA_EXT_LAUNCH(sample_kernel, 1, kSampleThreads, 0, stream, tree, head_size, draws, indices, weights, batch,
                    n_leaves, beta);
    return cudaGetLastError();
  }
  if (batch <= kSampleBlockMax) {
    const int threads = static_cast<int>((batch + 31) / 32 * 32);
    CUDA_EXT_LAUNCH(sample_block_kernel, 1, threads, 0, stream, tree, head_size, draws, indices, weights, batch,
                    n_leaves, depth, beta);
    return cudaGetLastError();
  }
  // Without PDL: launched early right behind the tree refresh (the replay buffer's order), its waiting
  // blocks slow the refresh down (benchmarks/RESULTS.md).
  CUDA_EXT_LAUNCH_NO_PDL(sample_descend_kernel, static_cast<unsigned>(blocks), kSampleBlockThreads, 0, stream,
                         tree, head_size, draws, indices, workspace, batch, n_leaves, depth, beta);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  CUDA_EXT_LAUNCH(sample_weights_kernel, static_cast<unsigned>((batch + 255) / 256), 256, 0, stream, 
      workspace, weights, batch, static_cast<int>(blocks), draws);
  return cudaGetLastError();
}

cudaError_t launch_update(double* tree, float* max_priority, const int64_t* indices, const float* td_abs,
                          int64_t batch, int64_t n_leaves, double alpha, float eps, cudaStream_t stream) {
  if (batch == 0) return cudaSuccess;
  if (batch <= kUpdateBlockMax) {
    const int threads = static_cast<int>(batch < 1024 ? (batch + 31) / 32 * 32 : 1024);
    CUDA_EXT_LAUNCH(update_block_kernel, 1, threads, 0, stream, tree, max_priority, indices, td_abs, batch, n_leaves, alpha,
                                                   eps);
    return cudaGetLastError();
  }
  const int blocks = static_cast<int>((batch + kUpdateThreads - 1) / kUpdateThreads);
  CUDA_EXT_LAUNCH(update_claim_kernel, blocks, kUpdateThreads, 0, stream, tree, max_priority, indices, td_abs, batch,
                                                             n_leaves, eps);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  CUDA_EXT_LAUNCH(update_write_kernel, blocks, kUpdateThreads, 0, stream, tree, indices, td_abs, batch, n_leaves, alpha,
                                                             eps);
  return cudaGetLastError();
}

}  // namespace per
}  // namespace cuda_ext
