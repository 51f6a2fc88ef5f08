// Hindsight kernels (see hindsight_kernels.cuh). Torch-free: CUDA runtime and the package headers only.
//
// Candidate-row kernels: every thread decides one row (wants, source pointers, reward, state updates) into
// shared memory, then each warp copies its 32 rows' observations with coalesced 16-byte loads/stores where
// rows are aligned and writes the actions; one count atomic per block. hindsight_inject and
// magnitude_relabel copy the observation rows of wanted rows only (the op contract leaves the others
// unspecified): zeros there would be most of those ops' memory traffic, and a warp with no wanted row does
// no copy work; the forward ring's few rows are zeroed. The forward ring's judge kernel (few slots) lets its
// first warp decide kRows slots and the block copy them.
#include <cstdint>

#include <cuda_runtime.h>

#include "common.h"
#include "launch.cuh"
#include "hindsight_kernels.cuh"

namespace cuda_ext {
namespace hindsight {
namespace {

constexpr int kThreads = 256;   // threads per block
constexpr int kRows = 32;       // forward slots per judge block (decided by warp 0)
constexpr int kBookThreads = 256;  // books per block in the forward ring's entry scan

// Copy `n_rows` rows of `dim` floats from per-row sources (nullptr: zeros) to `out + first_row * dim`.
// VEC4: dim is a multiple of 4 and every row (sources and out) is 16-byte aligned, so 16-byte loads and
// stores. 32-bit indexing within the block's rows.
template <bool VEC4>
__device__ inline void copy_rows(float* out, const float* const* sources, int64_t first_row, int n_rows,
                                 int64_t dim, int tid, int n_threads) {
  float* dst = out + first_row * dim;
  const int width = static_cast<int>(dim);
  if (VEC4) {
    const int quads = width >> 2;
    const int n = n_rows * quads;
    float4* dst4 = reinterpret_cast<float4*>(dst);
    for (int idx = tid; idx < n; idx += n_threads) {
      const int r = idx / quads;
      const float4* src = reinterpret_cast<const float4*>(sources[r]);
      dst4[idx] = src != nullptr ? src[idx - r * quads] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  } else {
    const int n = n_rows * width;
    for (int idx = tid; idx < n; idx += n_threads) {
      const int r = idx / width;
      const float* src = sources[r];
      dst[idx] = src != nullptr ? src[idx - r * width] : 0.0f;
    }
  }
}

// Copy rows with 16-byte accesses when `vec4`, else 4-byte ones.
__device__ inline void copy_rows_any(bool vec4, float* out, const float* const* sources, int64_t first_row,
                                     int n_rows, int64_t dim, int tid, int n_threads) {
  if (vec4) {
    copy_rows<true>(out, sources, first_row, n_rows, dim, tid, n_threads);
  } else {
    copy_rows<false>(out, sources, first_row, n_rows, dim, tid, n_threads);
  }
}

// Copy the observation and next-observation rows of the warp's wanted rows (row r wanted: obs_src[r] is not
// nullptr) to rows `first_row + r` of `out_obs` / `out_next_obs`; rows not wanted are left as they are. The
// warp loops over its wanted rows only (a ballot), copying one row's obs and next_obs together, so a warp
// of unwanted rows (most, when few trades close) costs one ballot. Every lane of the warp must call it.
__device__ inline void copy_wanted_rows(bool vec4, float* out_obs, float* out_next_obs,
                                        const float* const* obs_src, const float* const* next_src,
                                        int64_t first_row, int n_rows, int64_t dim, int lane) {
  unsigned wanted = __ballot_sync(0xffffffffu, lane < n_rows && obs_src[lane] != nullptr);
  const int width = static_cast<int>(dim);
  while (wanted != 0u) {
    const int r = __ffs(wanted) - 1;
    wanted &= wanted - 1u;
    float* dst = out_obs + (first_row + r) * dim;
    float* dst_next = out_next_obs + (first_row + r) * dim;
    if (vec4) {
      const int quads = width >> 2;
      const float4* src = reinterpret_cast<const float4*>(obs_src[r]);
      const float4* src_next = reinterpret_cast<const float4*>(next_src[r]);
      for (int q = lane; q < 2 * quads; q += 32) {
        if (q < quads) {
          reinterpret_cast<float4*>(dst)[q] = src[q];
        } else {
          reinterpret_cast<float4*>(dst_next)[q - quads] = src_next[q - quads];
        }
      }
    } else {
      const float* src = obs_src[r];
      const float* src_next = next_src[r];
      for (int c = lane; c < 2 * width; c += 32) {
        if (c < width) {
          dst[c] = src[c];
        } else {
          dst_next[c - width] = src_next[c - width];
        }
      }
    }
  }
}

// Actions of the block's rows: row r copies its source row (nullptr: zeros) with column `branch` set to
// replace[r] when has_replace[r]. 32-bit indexing.
__device__ inline void write_actions(int64_t* out_action, const int64_t* const* sources, const int64_t* replace,
                                     const bool* has_replace, int64_t branch, int64_t first_row, int n_rows,
                                     int64_t n_branches, int tid, int n_threads) {
  const int width = static_cast<int>(n_branches);
  const int n = n_rows * width;
  int64_t* dst = out_action + first_row * n_branches;
  for (int idx = tid; idx < n; idx += n_threads) {
    const int r = idx / width;
    const int k = idx - r * width;
    const int64_t* src = sources[r];
    dst[idx] = src == nullptr ? 0 : (has_replace[r] && k == branch ? replace[r] : src[k]);
  }
}

// Add the number of rows the block's threads want to `*count` (one atomic per block). Every thread of
// the block must call it (it has a barrier).
__device__ inline void count_wanted_block(bool want, int64_t* count) {
  const int wanted = __syncthreads_count(want);
  if (threadIdx.x == 0 && wanted != 0) {
    atomicAdd(reinterpret_cast<unsigned long long*>(count), static_cast<unsigned long long>(wanted));
  }
}

// The end of a candidate kernel with one row per thread (row blockIdx.x * kThreads + threadIdx.x of n_total),
// its sources staged in the block's shared arrays: each warp copies its wanted rows' observations
// (copy_wanted_rows) and writes their actions (write_actions), then the block adds its wanted rows to
// `*count`. Every thread of the block must call it.
__device__ inline void emit_block_rows(bool vec4, bool want, int64_t n_total, float* out_obs, float* out_next_obs,
                                       int64_t* out_action, const float* const* s_obs,
                                       const float* const* s_next_obs, const int64_t* const* s_action,
                                       const int64_t* s_replace, const bool* s_has_replace, int64_t branch,
                                       int64_t obs_dim, int64_t n_branches, int64_t* count) {
  __syncwarp();
  const int lane = threadIdx.x & 31;
  const int warp_base = threadIdx.x & ~31;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kThreads + warp_base;
  const int64_t left = n_total - first;
  const int n_rows = static_cast<int>(left < 0 ? 0 : (left < 32 ? left : 32));
  copy_wanted_rows(vec4, out_obs, out_next_obs, s_obs + warp_base, s_next_obs + warp_base, first, n_rows, obs_dim,
                   lane);
  write_actions(out_action, s_action + warp_base, s_replace + warp_base, s_has_replace + warp_base, branch, first,
                n_rows, n_branches, lane, 32);
  count_wanted_block(want, count);
}

__global__ void track_kernel(float* __restrict__ ring, int64_t* __restrict__ ring_len,
                             float* __restrict__ entry_mid, int64_t* __restrict__ direction,
                             float* __restrict__ peak, int64_t* __restrict__ peak_row,
                             const float* __restrict__ position, const float* __restrict__ best_bid,
                             const float* __restrict__ best_ask, const int64_t* __restrict__ row,
                             int64_t n_books, int64_t ring_size) {
  pdl_wait_then_release();
  for (int64_t b = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; b < n_books;
       b += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float mid = __fmul_rn(__fadd_rn(best_bid[b], best_ask[b]), 0.5f);
    const float pos = position[b];
    const int64_t sign = static_cast<int64_t>(pos > 0.0f) - static_cast<int64_t>(pos < 0.0f);
    if (sign == 0) {  // flat (or NaN): reset
      ring_len[b] = 0;
      direction[b] = 0;
      entry_mid[b] = 0.0f;
      peak[b] = 0.0f;
      peak_row[b] = -1;
      continue;
    }
    int64_t len = ring_len[b];
    float best = peak[b];
    int64_t best_row = peak_row[b];
    if (sign != direction[b]) {  // a new trade: from flat or by a flip
      direction[b] = sign;
      entry_mid[b] = mid;
      len = 0;
      best = mid;
      best_row = row[b];
    }
    const int64_t at = ((len % ring_size) + ring_size) % ring_size;  // floor modulo, as torch's %
    ring[b * ring_size + at] = mid;
    ring_len[b] = len + 1;
    if (sign > 0 ? mid > best : mid < best) {
      best = mid;
      best_row = row[b];
    }
    peak[b] = best;
    peak_row[b] = best_row;
  }
}

__global__ void inject_kernel(int64_t* __restrict__ ring_len, float* __restrict__ entry_mid,
                              int64_t* __restrict__ direction, float* __restrict__ peak,
                              int64_t* __restrict__ peak_row, const bool* __restrict__ trade_closed,
                              const float* __restrict__ raw_reward, const float* __restrict__ lots,
                              const float* __restrict__ obs, const float* __restrict__ next_obs,
                              const int64_t* __restrict__ action, const float* __restrict__ replay_next_obs,
                              int64_t n_books, int64_t obs_dim, int64_t n_branches, int64_t n_replay_rows,
                              float reward_scale, float threshold, int anchor, int64_t direction_branch,
                              int64_t flat_action, float* __restrict__ out_obs,
                              float* __restrict__ out_next_obs, int64_t* __restrict__ out_action,
                              float* __restrict__ out_reward, bool* __restrict__ wants,
                              int64_t* __restrict__ count, bool vec4) {
  pdl_wait_then_release();
  // Every thread decides one book; each warp then writes its 32 books' rows (no block-wide wait).
  __shared__ const float* s_obs[kThreads];
  __shared__ const float* s_next_obs[kThreads];
  __shared__ const int64_t* s_action[kThreads];
  __shared__ int64_t s_flat[kThreads];
  __shared__ bool s_exit[kThreads];
  bool want = false;
  {
    const int64_t b = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
    bool use_peak = false;
    const float* src_obs = nullptr;
    const float* src_next_obs = nullptr;
    if (b < n_books) {
      const bool closed = trade_closed[b];
      const float peak_pnl = __fmul_rn(fabsf(__fsub_rn(peak[b], entry_mid[b])), lots[b]);
      const float actual = __fdiv_rn(fabsf(raw_reward[b]), reward_scale);
      want = closed && direction[b] != 0 && peak_pnl > __fmul_rn(threshold, actual);
      out_reward[b] = want ? __fmul_rn(peak_pnl, reward_scale) : 0.0f;
      wants[b] = want;
      if (want) {
        const int64_t prow = peak_row[b];
        use_peak = anchor == 1 && prow >= 0 && prow < n_replay_rows;
        src_obs = use_peak ? replay_next_obs + prow * obs_dim : obs + b * obs_dim;
        src_next_obs = use_peak ? replay_next_obs + prow * obs_dim : next_obs + b * obs_dim;
      }
      if (closed) {  // every closed book's tracker resets, fired or not
        ring_len[b] = 0;
        entry_mid[b] = 0.0f;
        direction[b] = 0;
        peak[b] = 0.0f;
        peak_row[b] = -1;
      }
    }
    s_obs[threadIdx.x] = src_obs;
    s_next_obs[threadIdx.x] = src_next_obs;
    s_action[threadIdx.x] = want ? action + b * n_branches : nullptr;
    s_flat[threadIdx.x] = flat_action;
    s_exit[threadIdx.x] = use_peak;
  }
  emit_block_rows(vec4, want, n_books, out_obs, out_next_obs, out_action, s_obs, s_next_obs, s_action, s_flat,
                  s_exit, direction_branch, obs_dim, n_branches, count);
}

// Forward phase 1 (blocks [0, slot_blocks)): judge slots, write one candidate row per slot, per-block
// fire counts to workspace[blk] and the ring head to workspace[head_at]. Blocks [slot_blocks, ...):
// count the books that enter the ring into workspace[blk].
__global__ void forward_judge_kernel(bool* __restrict__ slot_valid, const float* __restrict__ slot_entry,
                                     const int64_t* __restrict__ slot_close_step,
                                     const int64_t* __restrict__ slot_direction,
                                     const float* __restrict__ slot_actual,
                                     const float* __restrict__ slot_lots, const int64_t* __restrict__ slot_book,
                                     const float* __restrict__ slot_obs, const int64_t* __restrict__ slot_action,
                                     const int64_t* __restrict__ ring_head, const int64_t* __restrict__ step,
                                     const float* __restrict__ mid, const bool* __restrict__ book_reset,
                                     const bool* __restrict__ trade_closed,
                                     const int64_t* __restrict__ closed_direction, int64_t n_slots,
                                     int64_t n_books, int64_t obs_dim, int64_t n_branches, int64_t lookahead,
                                     float threshold, float reward_scale, int64_t direction_branch,
                                     float* __restrict__ out_obs, float* __restrict__ out_next_obs,
                                     int64_t* __restrict__ out_action, float* __restrict__ out_reward,
                                     bool* __restrict__ wants, int64_t* __restrict__ workspace,
                                     int slot_blocks, int64_t head_at, bool vec4) {
  pdl_wait_then_release();
  if (static_cast<int>(blockIdx.x) >= slot_blocks) {
    const int64_t b = static_cast<int64_t>(blockIdx.x - slot_blocks) * kBookThreads + threadIdx.x;
    const bool enters = b < n_books && trade_closed[b] && closed_direction[b] != 0;
    const int entering = __syncthreads_count(enters);
    if (threadIdx.x == 0) workspace[blockIdx.x] = entering;
    return;
  }
  __shared__ const float* s_obs[kRows];
  __shared__ const int64_t* s_action[kRows];
  __shared__ bool s_wants[kRows];
  __shared__ int64_t s_stay[kRows];
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kRows;
  if (threadIdx.x < kRows) {
    const int64_t i = first + threadIdx.x;
    bool want = false;
    int64_t stay = 0;
    if (i < n_slots) {
      if (i == 0) workspace[head_at] = ring_head[0];
      float reward = 0.0f;
      if (slot_valid[i]) {
        const int64_t book = slot_book[i];
        const bool reset = book < 0 || book >= n_books || book_reset[book];
        const int64_t age = step[0] - slot_close_step[i];
        const int64_t dir = slot_direction[i];
        float fwd = 0.0f;
        if (!reset) {
          fwd = __fmul_rn(__fmul_rn(static_cast<float>(dir), __fsub_rn(mid[book], slot_entry[i])), slot_lots[i]);
        }
        const bool mature = age >= lookahead && age < 2 * lookahead;
        want = !reset && mature && fwd > __fmul_rn(threshold, slot_actual[i]);
        if (reset || age >= 2 * lookahead || want) slot_valid[i] = false;
        if (want) reward = __fmul_rn(fwd, reward_scale);
        stay = dir > 0 ? 2 : 0;
      }
      out_reward[i] = reward;
      wants[i] = want;
    }
    s_obs[threadIdx.x] = want ? slot_obs + i * obs_dim : nullptr;
    s_action[threadIdx.x] = want ? slot_action + i * n_branches : nullptr;
    s_wants[threadIdx.x] = want;
    s_stay[threadIdx.x] = stay;
    const unsigned ballot = __ballot_sync(0xffffffffu, want);
    if (threadIdx.x == 0) workspace[blockIdx.x] = __popc(ballot);
  }
  __syncthreads();
  const int n_rows = static_cast<int>(n_slots - first < kRows ? n_slots - first : kRows);
  copy_rows_any(vec4, out_obs, s_obs, first, n_rows, obs_dim, threadIdx.x, blockDim.x);
  copy_rows_any(vec4, out_next_obs, s_obs, first, n_rows, obs_dim, threadIdx.x, blockDim.x);
  write_actions(out_action, s_action, s_stay, s_wants, direction_branch, first, n_rows, n_branches, threadIdx.x,
                blockDim.x);
}

// Forward phase 2: every block sums the entry counts before it, scans its own books and writes the
// entrants that are among the last n_slots into the ring. Block 0 also writes count and ring_head.
__global__ void forward_enter_kernel(bool* __restrict__ slot_valid, float* __restrict__ slot_entry,
                                     int64_t* __restrict__ slot_close_step, int64_t* __restrict__ slot_direction,
                                     float* __restrict__ slot_actual, float* __restrict__ slot_lots,
                                     int64_t* __restrict__ slot_book, float* __restrict__ slot_obs,
                                     int64_t* __restrict__ slot_action, int64_t* __restrict__ ring_head,
                                     const int64_t* __restrict__ step, const bool* __restrict__ trade_closed,
                                     const float* __restrict__ entry_mid,
                                     const int64_t* __restrict__ closed_direction,
                                     const float* __restrict__ actual, const float* __restrict__ lots,
                                     const float* __restrict__ obs, const int64_t* __restrict__ action,
                                     int64_t n_slots, int64_t n_books, int64_t obs_dim, int64_t n_branches,
                                     int64_t* __restrict__ count, const int64_t* __restrict__ workspace,
                                     int slot_blocks, int book_blocks, int64_t head_at) {
  pdl_wait_then_release();
  __shared__ int64_t s_pos[kBookThreads];
  __shared__ int64_t s_book[kBookThreads];
  const int64_t* entering = workspace + slot_blocks;
  int64_t before = 0;
  int64_t all = 0;
  for (int j = threadIdx.x; j < book_blocks; j += blockDim.x) {
    all += entering[j];
    if (j < static_cast<int>(blockIdx.x)) before += entering[j];
  }
  // Block sums of `before` and `all` in one pass (warp shuffles, one barrier).
  __shared__ int64_t s_sums[2][kBookThreads / 32];
  for (int offset = 16; offset > 0; offset >>= 1) {
    before += __shfl_down_sync(0xffffffffu, before, offset);
    all += __shfl_down_sync(0xffffffffu, all, offset);
  }
  if ((threadIdx.x & 31) == 0) {
    s_sums[0][threadIdx.x >> 5] = before;
    s_sums[1][threadIdx.x >> 5] = all;
  }
  __syncthreads();
  int64_t before_total = 0;
  int64_t total = 0;
  for (int w = 0; w < kBookThreads / 32; ++w) {
    before_total += s_sums[0][w];
    total += s_sums[1][w];
  }
  const int64_t head = ((workspace[head_at] % n_slots) + n_slots) % n_slots;  // floor modulo, as torch's %

  const int64_t b = static_cast<int64_t>(blockIdx.x) * kBookThreads + threadIdx.x;
  const bool enters = b < n_books && trade_closed[b] && closed_direction[b] != 0;
  int64_t block_entering = 0;
  const int64_t prefix = before_total + block_exclusive_scan(enters ? 1 : 0, &block_entering);
  const bool kept = enters && prefix >= total - n_slots;
  const int64_t pos = (head + prefix) % n_slots;
  if (kept) {
    slot_valid[pos] = true;
    slot_entry[pos] = entry_mid[b];
    slot_close_step[pos] = step[0];
    slot_direction[pos] = closed_direction[b];
    slot_actual[pos] = actual[b];
    slot_lots[pos] = lots[b];
    slot_book[pos] = b;
  }
  int64_t n_kept = 0;
  const int64_t kept_at = block_exclusive_scan(kept ? 1 : 0, &n_kept);
  if (kept) {
    s_pos[kept_at] = pos;
    s_book[kept_at] = b;
  }
  __syncthreads();
  const int dim = static_cast<int>(obs_dim);
  for (int idx = threadIdx.x; idx < static_cast<int>(n_kept) * dim; idx += blockDim.x) {
    const int e = idx / dim;
    const int d = idx - e * dim;
    slot_obs[s_pos[e] * obs_dim + d] = obs[s_book[e] * obs_dim + d];
  }
  const int width = static_cast<int>(n_branches);
  for (int idx = threadIdx.x; idx < static_cast<int>(n_kept) * width; idx += blockDim.x) {
    const int e = idx / width;
    const int k = idx - e * width;
    slot_action[s_pos[e] * n_branches + k] = action[s_book[e] * n_branches + k];
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    int64_t fired = 0;
    for (int j = 0; j < slot_blocks; ++j) fired += workspace[j];
    count[0] = fired;
    ring_head[0] = (head + total) % n_slots;
  }
}

__global__ void relabel_kernel(const bool* __restrict__ trade_closed, const float* __restrict__ obs,
                               const float* __restrict__ next_obs, const int64_t* __restrict__ action,
                               const float* __restrict__ reward, const float* __restrict__ magnitudes,
                               int64_t n_books, int64_t obs_dim, int64_t n_branches, int64_t n_mags,
                               int64_t magnitude_branch, float* __restrict__ out_obs,
                               float* __restrict__ out_next_obs, int64_t* __restrict__ out_action,
                               float* __restrict__ out_reward, float* __restrict__ out_priority,
                               bool* __restrict__ wants, int64_t* __restrict__ count, bool vec4) {
  pdl_wait_then_release();
  // Every thread decides one row; each warp then writes its 32 rows (no block-wide wait).
  __shared__ const float* s_obs[kThreads];
  __shared__ const float* s_next_obs[kThreads];
  __shared__ const int64_t* s_action[kThreads];
  __shared__ int64_t s_target[kThreads];
  __shared__ bool s_relabel[kThreads];
  const int64_t n_rows_total = (n_mags - 1) * n_books;
  bool want = false;
  {
    const int64_t r = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
    int64_t target = 0;
    const float* src_obs = nullptr;
    const float* src_next_obs = nullptr;
    const int64_t* src_action = nullptr;
    if (r < n_rows_total) {
      const int64_t j = r / n_books;
      const int64_t b = r - j * n_books;
      const bool closed = trade_closed[b];  // the action is read for closed books only (most are not)
      const int64_t current = closed ? action[b * n_branches + magnitude_branch] : -1;
      want = closed && current >= 0 && current < n_mags;
      target = j + (j >= current ? 1 : 0);
      float relabeled = 0.0f;
      float priority = 0.0f;
      if (want) {
        const float r0 = reward[b];
        relabeled = __fdiv_rn(__fmul_rn(r0, magnitudes[target]), magnitudes[current]);
        priority = fabsf(__fsub_rn(relabeled, r0));
        src_obs = obs + b * obs_dim;
        src_next_obs = next_obs + b * obs_dim;
        src_action = action + b * n_branches;
      }
      out_reward[r] = relabeled;
      out_priority[r] = priority;
      wants[r] = want;
    }
    s_obs[threadIdx.x] = src_obs;
    s_next_obs[threadIdx.x] = src_next_obs;
    s_action[threadIdx.x] = src_action;
    s_target[threadIdx.x] = target;
    s_relabel[threadIdx.x] = true;
  }
  emit_block_rows(vec4, want, n_rows_total, out_obs, out_next_obs, out_action, s_obs, s_next_obs, s_action,
                  s_target, s_relabel, magnitude_branch, obs_dim, n_branches, count);
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

int blocks_for(int64_t n, int per_block) {
  const int64_t blocks = (n + per_block - 1) / per_block;
  return static_cast<int>(blocks < 1 ? 1 : blocks);
}

}  // namespace

cudaError_t launch_track(float* ring, int64_t* ring_len, float* entry_mid, int64_t* direction, float* peak,
                         int64_t* peak_row, const float* position, const float* best_bid,
                         const float* best_ask, const int64_t* row, int64_t n_books, int64_t ring_size,
                         cudaStream_t stream) {
  if (n_books == 0) return cudaSuccess;
  CUDA_EXT_LAUNCH(track_kernel, grid_for(n_books, kThreads, 1 << 20), kThreads, 0, stream, 
      ring, ring_len, entry_mid, direction, peak, peak_row, position, best_bid, best_ask, row, n_books,
      ring_size);
  return cudaGetLastError();
}

cudaError_t launch_inject(int64_t* ring_len, float* entry_mid, int64_t* direction, float* peak,
                          int64_t* peak_row, const bool* trade_closed, const float* raw_reward,
                          const float* lots, const float* obs, const float* next_obs, const int64_t* action,
                          const float* replay_next_obs, int64_t n_books, int64_t obs_dim,
                          int64_t n_branches, int64_t n_replay_rows, float reward_scale, float threshold,
                          int anchor, int64_t direction_branch, int64_t flat_action, float* out_obs,
                          float* out_next_obs, int64_t* out_action, float* out_reward, bool* wants,
                          int64_t* count, cudaStream_t stream) {
  cudaError_t status = cudaMemsetAsync(count, 0, sizeof(int64_t), stream);
  if (status != cudaSuccess || n_books == 0) return status;
  CUDA_EXT_LAUNCH(inject_kernel, blocks_for(n_books, kThreads), kThreads, 0, stream, 
      ring_len, entry_mid, direction, peak, peak_row, trade_closed, raw_reward, lots, obs, next_obs, action,
      replay_next_obs, n_books, obs_dim, n_branches, n_replay_rows, reward_scale, threshold, anchor,
      direction_branch, flat_action, out_obs, out_next_obs, out_action, out_reward, wants, count,
      obs_dim % 4 == 0 && aligned16(obs) && aligned16(next_obs) && aligned16(replay_next_obs) &&
          aligned16(out_obs) && aligned16(out_next_obs));
  return cudaGetLastError();
}

int64_t forward_workspace_size(int64_t n_slots, int64_t n_books) {
  return blocks_for(n_slots, kRows) + (n_books + kBookThreads - 1) / kBookThreads + 1;
}

cudaError_t launch_forward(bool* slot_valid, float* slot_entry, int64_t* slot_close_step,
                           int64_t* slot_direction, float* slot_actual, float* slot_lots, int64_t* slot_book,
                           float* slot_obs, int64_t* slot_action, int64_t* ring_head, const int64_t* step,
                           const float* mid, const bool* book_reset, const bool* trade_closed,
                           const float* entry_mid, const int64_t* closed_direction, const float* actual,
                           const float* lots, const float* obs, const int64_t* action, int64_t n_slots,
                           int64_t n_books, int64_t obs_dim, int64_t n_branches, int64_t lookahead,
                           float threshold, float reward_scale, int64_t direction_branch, float* out_obs,
                           float* out_next_obs, int64_t* out_action, float* out_reward, bool* wants,
                           int64_t* count, int64_t* workspace, cudaStream_t stream) {
  const int slot_blocks = blocks_for(n_slots, kRows);
  const int book_blocks = static_cast<int>((n_books + kBookThreads - 1) / kBookThreads);
  const int64_t head_at = slot_blocks + book_blocks;
  CUDA_EXT_LAUNCH(forward_judge_kernel, slot_blocks + book_blocks, kThreads, 0, stream, 
      slot_valid, slot_entry, slot_close_step, slot_direction, slot_actual, slot_lots, slot_book, slot_obs,
      slot_action, ring_head, step, mid, book_reset, trade_closed, closed_direction, n_slots, n_books, obs_dim,
      n_branches, lookahead, threshold, reward_scale, direction_branch, out_obs, out_next_obs, out_action,
      out_reward, wants, workspace, slot_blocks, head_at,
      obs_dim % 4 == 0 && aligned16(slot_obs) && aligned16(out_obs) && aligned16(out_next_obs));
  cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) return status;
  CUDA_EXT_LAUNCH(forward_enter_kernel, book_blocks < 1 ? 1 : book_blocks, kBookThreads, 0, stream, 
      slot_valid, slot_entry, slot_close_step, slot_direction, slot_actual, slot_lots, slot_book, slot_obs,
      slot_action, ring_head, step, trade_closed, entry_mid, closed_direction, actual, lots, obs, action,
      n_slots, n_books, obs_dim, n_branches, count, workspace, slot_blocks, book_blocks, head_at);
  return cudaGetLastError();
}

cudaError_t launch_relabel(const bool* trade_closed, const float* obs, const float* next_obs,
                           const int64_t* action, const float* reward, const float* magnitudes,
                           int64_t n_books, int64_t obs_dim, int64_t n_branches, int64_t n_mags,
                           int64_t magnitude_branch, float* out_obs, float* out_next_obs,
                           int64_t* out_action, float* out_reward, float* out_priority, bool* wants,
                           int64_t* count, cudaStream_t stream) {
  cudaError_t status = cudaMemsetAsync(count, 0, sizeof(int64_t), stream);
  const int64_t n_rows = (n_mags - 1) * n_books;
  if (status != cudaSuccess || n_rows == 0) return status;
  CUDA_EXT_LAUNCH(relabel_kernel, blocks_for(n_rows, kThreads), kThreads, 0, stream, 
      trade_closed, obs, next_obs, action, reward, magnitudes, n_books, obs_dim, n_branches, n_mags,
      magnitude_branch, out_obs, out_next_obs, out_action, out_reward, out_priority, wants, count,
      obs_dim % 4 == 0 && aligned16(obs) && aligned16(next_obs) && aligned16(out_obs) &&
          aligned16(out_next_obs));
  return cudaGetLastError();
}

}  // namespace hindsight
}  // namespace cuda_ext
