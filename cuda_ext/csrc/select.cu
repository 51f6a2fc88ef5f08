// Action-selection kernels (see select_kernels.cuh). Torch-free: CUDA runtime and the package headers only.
#include <cmath>
#include <cstdint>
#include <utility>

#include <cuda_runtime.h>

#include "common.h"
#include "launch.cuh"
#include "select_kernels.cuh"

namespace cuda_ext {
namespace action_select {
namespace {

constexpr int kThreads = 256;
constexpr int kRowsPerBlock = 128;  // quantile_iqr: rows staged through shared memory per block
constexpr float kMinTemperature = 0.01f;

// score = (q + alpha * iqr) + beta * ens_std, one rounding per operation as in the reference.
__device__ inline float score_at(const float* q, const float* iqr, const float* ens_std, int64_t at, float alpha,
                                 float beta) {
  return __fadd_rn(__fadd_rn(q[at], __fmul_rn(alpha, iqr[at])), __fmul_rn(beta, ens_std[at]));
}

// Boltzmann weight exp((score - best) / tau), evaluated in float64 and rounded to float32.
__device__ inline float boltzmann_weight(float score, float best, float tau) {
  const float scaled = __fdiv_rn(__fsub_rn(score, best), tau);
  return static_cast<float>(exp(static_cast<double>(scaled)));
}

__global__ void branch_select_kernel(const float* __restrict__ q, const float* __restrict__ iqr,
                                     const float* __restrict__ ens_std, const int64_t* __restrict__ n_actions,
                                     const float* __restrict__ eps, const bool* __restrict__ boltzmann,
                                     const float* __restrict__ u_explore, const float* __restrict__ u_action,
                                     int64_t n_pairs, int64_t n_branches, int64_t max_actions, float alpha,
                                     float beta, int64_t* __restrict__ actions) {
  pdl_wait_then_release();
  for (int64_t pair = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; pair < n_pairs;
       pair += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t branch = pair % n_branches;
    const int64_t n = n_actions[branch];
    if (n < 1 || n > max_actions) {
      actions[pair] = -1;
      continue;
    }
    const float u = u_action[pair];
    if (u_explore[pair] < eps[branch]) {  // explore: uniform draw by u
      const int64_t drawn = static_cast<int64_t>(floorf(__fmul_rn(u, static_cast<float>(n))));
      actions[pair] = drawn < n - 1 ? drawn : n - 1;
      continue;
    }
    const int64_t first = pair * max_actions;
    float best = score_at(q, iqr, ens_std, first, alpha, beta);
    float worst = best;
    int64_t greedy = 0;
    for (int64_t a = 1; a < n; ++a) {
      const float s = score_at(q, iqr, ens_std, first + a, alpha, beta);
      if (s > best) {  // strict: the lowest index wins ties
        best = s;
        greedy = a;
      }
      worst = fminf(worst, s);
    }
    if (!boltzmann[branch]) {
      actions[pair] = greedy;
      continue;
    }
    const float tau = fmaxf(__fsub_rn(best, worst), kMinTemperature);
    float total = 0.0f;
    for (int64_t a = 0; a < n; ++a) {
      total = __fadd_rn(total, boltzmann_weight(score_at(q, iqr, ens_std, first + a, alpha, beta), best, tau));
    }
    const float target = __fmul_rn(u, total);
    float running = 0.0f;
    int64_t chosen = n - 1;  // when rounding leaves no running sum above the target
    for (int64_t a = 0; a < n; ++a) {
      running = __fadd_rn(running, boltzmann_weight(score_at(q, iqr, ens_std, first + a, alpha, beta), best, tau));
      if (running > target) {
        chosen = a;
        break;
      }
    }
    actions[pair] = chosen;
  }
}

// branch_select for max_actions <= AMAX: every load a pair needs (flags, draws and all AMAX scores) is
// issued before the first branch, the scores and Boltzmann weights stay in registers, 32-bit indexing.
// Same float operations in the same order as branch_select_kernel.
template <int AMAX>
__global__ void branch_select_small_kernel(const float* __restrict__ q, const float* __restrict__ iqr,
                                           const float* __restrict__ ens_std,
                                           const int64_t* __restrict__ n_actions, const float* __restrict__ eps,
                                           const bool* __restrict__ boltzmann,
                                           const float* __restrict__ u_explore,
                                           const float* __restrict__ u_action, int n_pairs, int n_branches,
                                           int max_actions, float alpha, float beta,
                                           int64_t* __restrict__ actions) {
  pdl_wait_then_release();
  const int pair = blockIdx.x * blockDim.x + threadIdx.x;
  if (pair >= n_pairs) return;
  const int branch = pair % n_branches;
  const int64_t n = n_actions[branch];
  const float u = u_action[pair];
  const float explore_draw = u_explore[pair];
  const float branch_eps = eps[branch];
  const bool use_boltzmann = boltzmann[branch];
  const int first = pair * max_actions;
  float s[AMAX];
#pragma unroll
  for (int a = 0; a < AMAX; ++a) {
    s[a] = a < max_actions ? score_at(q, iqr, ens_std, first + a, alpha, beta) : 0.0f;
  }
  if (n < 1 || n > max_actions) {
    actions[pair] = -1;
    return;
  }
  if (explore_draw < branch_eps) {  // explore: uniform draw by u
    const int64_t drawn = static_cast<int64_t>(floorf(__fmul_rn(u, static_cast<float>(n))));
    actions[pair] = drawn < n - 1 ? drawn : n - 1;
    return;
  }
  float best = s[0];
  float worst = best;
  int64_t greedy = 0;
#pragma unroll
  for (int a = 1; a < AMAX; ++a) {
    if (a < n) {
      if (s[a] > best) {  // strict: the lowest index wins ties
        best = s[a];
        greedy = a;
      }
      worst = fminf(worst, s[a]);
    }
  }
  if (!use_boltzmann) {
    actions[pair] = greedy;
    return;
  }
  const float tau = fmaxf(__fsub_rn(best, worst), kMinTemperature);
  float w[AMAX];
  float total = 0.0f;
#pragma unroll
  for (int a = 0; a < AMAX; ++a) {
    w[a] = 0.0f;
    if (a < n) {
      w[a] = boltzmann_weight(s[a], best, tau);
      total = __fadd_rn(total, w[a]);
    }
  }
  const float target = __fmul_rn(u, total);
  float running = 0.0f;
  int64_t chosen = n - 1;  // when rounding leaves no running sum above the target
#pragma unroll
  for (int a = 0; a < AMAX; ++a) {
    if (a < n && chosen == n - 1 && a < n - 1) {
      running = __fadd_rn(running, w[a]);
      if (running > target) chosen = a;
    }
  }
  actions[pair] = chosen;
}

// Positions of the 25% and 75% quantiles: pos = float(q) * float(n - 1) in float32, like torch.quantile.
struct IqrPositions {
  int64_t lo25, hi25, lo75, hi75;
  float w25, w75;
};

IqrPositions iqr_positions(int64_t n_samples) {
  const float last = static_cast<float>(n_samples - 1);
  const float pos25 = 0.25f * last;
  const float pos75 = 0.75f * last;
  const float lo25 = std::floor(pos25);
  const float lo75 = std::floor(pos75);
  return {static_cast<int64_t>(lo25), static_cast<int64_t>(std::ceil(pos25)), static_cast<int64_t>(lo75),
          static_cast<int64_t>(std::ceil(pos75)), pos25 - lo25, pos75 - lo75};
}

__device__ inline float interpolate(float below, float above, float weight) {
  return __fadd_rn(below, __fmul_rn(weight, __fsub_rn(above, below)));
}

// Sort N values (a power of two) ascending in registers: the pairwise sorting network (Parberry 1992), its
// comparators listed at compile time and applied fully unrolled. It has the comparator count of Batcher's
// odd-even merge sort (191 for N = 32, against the bitonic network's 240), and where only a few order
// statistics are read (the EXACT kernels) the compiler drops every min/max that does not feed them: 296 of
// them are left for positions 7, 8, 23, 24 of 32, against 412 of the bitonic network.
struct Comparator {
  int lo;
  int hi;
};

// Walk the network's comparators in order; with `out` null only count them. Returns the count.
__host__ __device__ constexpr int pairwise_network(int n, Comparator* out) {
  int count = 0;
  for (int a = 1; a < n; a *= 2) {  // first phase: sort pairs, pairs of pairs, ... by their first elements
    int c = 0;
    for (int b = a; b < n;) {
      if (out != nullptr) out[count] = {b - a, b};
      ++count;
      ++b;
      c = (c + 1) % a;
      if (c == 0) b += a;
    }
  }
  for (int a = n / 4, e = 1; a > 0; a /= 2, e = 2 * e + 1) {  // second phase: merge the interleaved halves
    for (int d = e; d > 0; d /= 2) {
      int c = 0;
      for (int b = (d + 1) * a; b < n;) {
        if (out != nullptr) out[count] = {b - d * a, b};
        ++count;
        ++b;
        c = (c + 1) % a;
        if (c == 0) b += a;
      }
    }
  }
  return count;
}

template <int N>
struct PairwiseNetwork {
  static constexpr int kSize = pairwise_network(N, nullptr);
  Comparator comparators[kSize];
  __host__ __device__ constexpr PairwiseNetwork() : comparators{} { pairwise_network(N, comparators); }
};

template <int N>
constexpr PairwiseNetwork<N> kPairwiseNetwork{};

template <int LO, int HI, int N>
__device__ __forceinline__ void compare_exchange(float (&v)[N]) {
  const float a = v[LO];
  const float b = v[HI];
  v[LO] = fminf(a, b);
  v[HI] = fmaxf(a, b);
}

template <int N, int... I>
__device__ __forceinline__ void apply_pairwise_network(float (&v)[N], std::integer_sequence<int, I...>) {
  (compare_exchange<kPairwiseNetwork<N>.comparators[I].lo, kPairwiseNetwork<N>.comparators[I].hi>(v), ...);
}

template <int N>
__device__ inline void sort_ascending(float (&v)[N]) {
  apply_pairwise_network<N>(v, std::make_integer_sequence<int, PairwiseNetwork<N>::kSize>{});
}

// Compile-time order-statistic positions of a row of exactly N samples (as iqr_positions, in float32).
template <int N>
struct ExactPositions {
  static constexpr float kPos25 = 0.25f * static_cast<float>(N - 1);
  static constexpr float kPos75 = 0.75f * static_cast<float>(N - 1);
  static constexpr int kLo25 = static_cast<int>(kPos25);
  static constexpr int kLo75 = static_cast<int>(kPos75);
  static constexpr int kHi25 = kLo25 + (static_cast<float>(kLo25) < kPos25 ? 1 : 0);
  static constexpr int kHi75 = kLo75 + (static_cast<float>(kLo75) < kPos75 ? 1 : 0);
};

// Rows of at most NMAX samples: the block stages kRowsPerBlock rows in shared memory with coalesced loads
// (16-byte loads when VEC4), each thread sorts one row in registers (sort_ascending, +inf padding) and
// interpolates. EXACT: every row has exactly NMAX samples, so the four order-statistic positions are
// compile-time constants and the compiler drops every comparator that does not feed them.
template <int NMAX, bool EXACT, bool VEC4>
__global__ void iqr_register_kernel(const float* __restrict__ samples, int64_t n_rows, int n_samples,
                                    IqrPositions at, float* __restrict__ out) {
  pdl_wait_then_release();
  __shared__ float tile[kRowsPerBlock * (NMAX + 1)];
  const int64_t first_row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock;
  const int rows_here = static_cast<int>(n_rows - first_row < kRowsPerBlock ? n_rows - first_row : kRowsPerBlock);
  const float* src = samples + first_row * n_samples;
  if (VEC4) {  // EXACT rows of NMAX (a multiple of 4) floats, 16-byte aligned
    constexpr int kQuads = NMAX / 4;
    const int n_quads = rows_here * kQuads;
    const float4* src4 = reinterpret_cast<const float4*>(src);
    for (int idx = threadIdx.x; idx < n_quads; idx += blockDim.x) {
      const int r = idx / kQuads;
      const int c = (idx - r * kQuads) * 4;
      const float4 x = __ldcs(src4 + idx);
      float* row = tile + r * (NMAX + 1) + c;
      row[0] = x.x;
      row[1] = x.y;
      row[2] = x.z;
      row[3] = x.w;
    }
  } else {
    const int n_values = rows_here * n_samples;
    for (int idx = threadIdx.x; idx < n_values; idx += blockDim.x) {
      const int r = idx / n_samples;
      tile[r * (NMAX + 1) + (idx - r * n_samples)] = src[idx];
    }
  }
  __syncthreads();
  if (static_cast<int>(threadIdx.x) >= rows_here) return;
  float v[NMAX];
  bool has_nan = false;
#pragma unroll
  for (int i = 0; i < NMAX; ++i) {
    float x = (EXACT || i < n_samples) ? tile[threadIdx.x * (NMAX + 1) + i] : INFINITY;
    has_nan |= isnan(x);
    v[i] = x;  // a NaN row outputs NaN whatever the sort made of it
  }
  sort_ascending<NMAX>(v);
  float lo25 = 0.0f, hi25 = 0.0f, lo75 = 0.0f, hi75 = 0.0f;
  if (EXACT) {
    using P = ExactPositions<NMAX>;
    lo25 = v[P::kLo25];
    hi25 = v[P::kHi25];
    lo75 = v[P::kLo75];
    hi75 = v[P::kHi75];
  } else {
#pragma unroll
    for (int i = 0; i < NMAX; ++i) {
      if (i == at.lo25) lo25 = v[i];
      if (i == at.hi25) hi25 = v[i];
      if (i == at.lo75) lo75 = v[i];
      if (i == at.hi75) hi75 = v[i];
    }
  }
  const float iqr = __fsub_rn(interpolate(lo75, hi75, at.w75), interpolate(lo25, hi25, at.w25));
  out[first_row + threadIdx.x] = has_nan ? NAN : iqr;
}

// Rows of exactly N samples (N % 4 == 0, 16-byte aligned), persistent blocks: while a thread sorts its row
// of the current tile, the 16-byte loads of its share of the block's next tile are already in flight (held
// in registers), so the memory stream and the sorting overlap instead of alternating. Same sorting network
// and arithmetic as iqr_register_kernel<N, true, true>.
template <int N>
__global__ void __launch_bounds__(kRowsPerBlock) iqr_pipelined_kernel(const float* __restrict__ samples,
                                                                     int64_t n_rows, IqrPositions at,
                                                                     float* __restrict__ out) {
  pdl_wait_then_release();
  constexpr int kQuads = N / 4;                           // 16-byte pieces per row
  constexpr int kPerThread = kQuads;                      // a tile is kRowsPerBlock * kQuads pieces
  // Rows padded to N + 4 floats: 16-byte stores and loads, and the 8 threads of each 16-byte phase (a row's
  // quads when storing, one quad of 8 rows when loading) fall on 8 different 4-bank groups.
  constexpr int kStride = N + 4;
  __shared__ __align__(16) float tile[kRowsPerBlock * kStride];
  const int64_t n_tiles = (n_rows + kRowsPerBlock - 1) / kRowsPerBlock;
  const float4* src4 = reinterpret_cast<const float4*>(samples);
  float4 next[kPerThread];
  auto load_tile = [&](int64_t t) {
    // this thread's pieces of tile t: base[k * kRowsPerBlock], k < kPerThread, those before the end
    const float4* base = src4 + t * (kRowsPerBlock * kQuads) + threadIdx.x;
    const int64_t left = (n_rows - t * kRowsPerBlock) * kQuads - threadIdx.x;
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      next[k] = k * kRowsPerBlock < left ? __ldcs(base + k * kRowsPerBlock) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  };
  int64_t t = blockIdx.x;
  if (t < n_tiles) load_tile(t);
  for (; t < n_tiles; t += gridDim.x) {
    __syncthreads();  // every thread is done reading the previous tile
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int idx = k * kRowsPerBlock + threadIdx.x;
      const int r = idx / kQuads;
      reinterpret_cast<float4*>(tile + r * kStride)[idx - r * kQuads] = next[k];
    }
    __syncthreads();
    if (t + gridDim.x < n_tiles) load_tile(t + gridDim.x);  // in flight while this tile is sorted
    const int64_t row_index = t * kRowsPerBlock + threadIdx.x;
    if (row_index >= n_rows) continue;
    float v[N];
    bool has_nan = false;
    const float4* own = reinterpret_cast<const float4*>(tile + threadIdx.x * kStride);
#pragma unroll
    for (int q = 0; q < kQuads; ++q) {
      const float4 x = own[q];
      v[4 * q] = x.x;  // a NaN row outputs NaN whatever the sort made of it
      v[4 * q + 1] = x.y;
      v[4 * q + 2] = x.z;
      v[4 * q + 3] = x.w;
      has_nan |= isnan(x.x) | isnan(x.y) | isnan(x.z) | isnan(x.w);
    }
    sort_ascending<N>(v);
    using P = ExactPositions<N>;
    const float iqr = __fsub_rn(interpolate(v[P::kLo75], v[P::kHi75], at.w75),
                                interpolate(v[P::kLo25], v[P::kHi25], at.w25));
    out[row_index] = has_nan ? NAN : iqr;
  }
}

// Blocks of iqr_pipelined_kernel<32> to launch: as many as fit on the device at once (occupancy query,
// made once per process), at most one per tile.
int pipelined_grid(int64_t n_tiles) {
  static int resident = 0;
  if (resident == 0) {
    int device = 0;
    int n_sm = 0;
    int per_sm = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, iqr_pipelined_kernel<32>, kRowsPerBlock, 0) !=
            cudaSuccess ||
        per_sm < 1) {
      n_sm = 132;
      per_sm = 4;
    }
    resident = n_sm * per_sm;
  }
  return static_cast<int>(n_tiles < resident ? n_tiles : resident);
}

// Rows already sorted ascending with NaN last: one thread per row reads its four order statistics.
__global__ void iqr_sorted_kernel(const float* __restrict__ sorted, int64_t n_rows, int64_t n_samples,
                                  IqrPositions at, float* __restrict__ out) {
  pdl_wait_then_release();
  for (int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; row < n_rows;
       row += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float* v = sorted + row * n_samples;
    const float iqr =
        __fsub_rn(interpolate(v[at.lo75], v[at.hi75], at.w75), interpolate(v[at.lo25], v[at.hi25], at.w25));
    out[row] = isnan(v[n_samples - 1]) ? NAN : iqr;
  }
}

}  // namespace

cudaError_t launch_branch_select(const float* q, const float* iqr, const float* ens_std,
                                 const int64_t* n_actions, const float* eps, const bool* boltzmann,
                                 const float* u_explore, const float* u_action, int64_t n_books,
                                 int64_t n_branches, int64_t max_actions, float alpha, float beta,
                                 int64_t* actions, cudaStream_t stream) {
  const int64_t n_pairs = n_books * n_branches;
  if (n_pairs == 0) return cudaSuccess;
  const bool small_index = n_pairs * max_actions < (int64_t{1} << 31);
  if (small_index && max_actions <= 4) {
    CUDA_EXT_LAUNCH(branch_select_small_kernel<4>, grid_for(n_pairs, kThreads, 1 << 30), kThreads, 0, stream, 
        q, iqr, ens_std, n_actions, eps, boltzmann, u_explore, u_action, static_cast<int>(n_pairs),
        static_cast<int>(n_branches), static_cast<int>(max_actions), alpha, beta, actions);
    return cudaGetLastError();
  }
  if (small_index && max_actions <= 8) {
    CUDA_EXT_LAUNCH(branch_select_small_kernel<8>, grid_for(n_pairs, kThreads, 1 << 30), kThreads, 0, stream, 
        q, iqr, ens_std, n_actions, eps, boltzmann, u_explore, u_action, static_cast<int>(n_pairs),
        static_cast<int>(n_branches), static_cast<int>(max_actions), alpha, beta, actions);
    return cudaGetLastError();
  }
  CUDA_EXT_LAUNCH(branch_select_kernel, grid_for(n_pairs, kThreads, 1 << 20), kThreads, 0, stream, 
      q, iqr, ens_std, n_actions, eps, boltzmann, u_explore, u_action, n_pairs, n_branches, max_actions, alpha,
      beta, actions);
  return cudaGetLastError();
}

cudaError_t launch_quantile_iqr(const float* samples, int64_t n_rows, int64_t n_samples, bool presorted,
                                float* out, cudaStream_t stream) {
  if (n_rows == 0) return cudaSuccess;
  const IqrPositions at = iqr_positions(n_samples);
  if (presorted) {
    CUDA_EXT_LAUNCH(iqr_sorted_kernel, grid_for(n_rows, kThreads, 1 << 20), kThreads, 0, stream, samples, n_rows, n_samples,
                                                                                     at, out);
  } else {
    const int64_t blocks = (n_rows + kRowsPerBlock - 1) / kRowsPerBlock;
    if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
    const int n = static_cast<int>(n_samples);
    const unsigned grid = static_cast<unsigned>(blocks);
    const bool aligned = (reinterpret_cast<uintptr_t>(samples) & 15u) == 0;
    if (n_samples == 32 && aligned) {
      CUDA_EXT_LAUNCH(iqr_pipelined_kernel<32>, pipelined_grid(blocks), kRowsPerBlock, 0, stream, samples, n_rows, at, out);
    } else if (n_samples == 64 && aligned) {
      CUDA_EXT_LAUNCH(iqr_register_kernel<64, true, true>, grid, kRowsPerBlock, 0, stream, samples, n_rows, n, at, out);
    } else if (n_samples <= 32) {
      CUDA_EXT_LAUNCH(iqr_register_kernel<32, false, false>, grid, kRowsPerBlock, 0, stream, samples, n_rows, n, at, out);
    } else if (n_samples <= kMaxRegisterSamples) {
      CUDA_EXT_LAUNCH(iqr_register_kernel<64, false, false>, grid, kRowsPerBlock, 0, stream, samples, n_rows, n, at, out);
    } else {
      return cudaErrorInvalidValue;
    }
  }
  return cudaGetLastError();
}

}  // namespace action_select
}  // namespace cuda_ext
