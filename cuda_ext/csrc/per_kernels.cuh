// Prioritized-replay kernels: plain C++ launch functions over raw device pointers. Torch-free (CUDA
// runtime only); the torch launchers live in per_binding.cpp. Semantics: cuda_ext/README.md.
// Every launch goes on `stream`, never syncs the host and has fixed-size outputs (CUDA-graph safe).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace cuda_ext {
namespace per {

// Largest supported number of tree leaves P (the top-of-tree block keeps P / subtree leaves in
// shared memory).
constexpr int64_t kMaxLeaves = int64_t{1} << 28;

// Scratch int64 entries launch_push needs for `n` rows.
int64_t push_workspace_size(int64_t n);

// per_push (two launches over blocks of rows: per-block counts, then slots, leaves, row copies and
// head_size; in a tree of 2^12 <= P <= 2^23 leaves also the written leaves' dirty-subtree markers);
// `workspace` of push_workspace_size(n) int64 entries.
cudaError_t launch_push(const bool* wants, const float* new_priority, const float* max_multiplier,
                        const float* max_priority, int64_t* head_size, double* tree, int64_t* slots,
                        const float* new_obs, const float* new_next_obs, const int64_t* new_action,
                        const float* new_reward, const float* new_done, const int8_t* new_kind, float* obs,
                        float* next_obs, int64_t* action, float* reward, float* done, int8_t* kind, int64_t n,
                        int64_t capacity, int64_t n_leaves, int64_t obs_dim, int64_t n_branches, double alpha,
                        int64_t* workspace, cudaStream_t stream);

// per_tree_rebuild (one launch): recompute internal nodes as left + right (float64). Subtrees that
// hold none of `leaf_idx` may be skipped; the result equals a full bottom-up rebuild of a consistent
// tree. tree[0] must be 0: its low 32 bits count the finished blocks (left 0 again).
cudaError_t launch_tree_rebuild(double* tree, const int64_t* leaf_idx, int64_t m, int64_t n_leaves,
                                cudaStream_t stream);

// per_tree_refresh (one launch): after launch_push / launch_update, bring every internal node up to date
// without the changed leaves: for 2^12 <= P <= 2^23 (16-byte aligned) the subtrees those writers marked
// dirty and the nodes above; otherwise the whole tree. tree[0] must be 0, as for launch_tree_rebuild.
cudaError_t launch_tree_refresh(double* tree, int64_t n_leaves, cudaStream_t stream);

// Scratch float64 entries launch_sample needs for a batch.
int64_t sample_workspace_size(int64_t batch);

// per_sample (up to 256 samples: one block; more: two launches, one thread per sample descends, then
// weights over the batch maximum):
// stratified descent, importance weights normalized by the batch maximum. A tree that is not 16-byte
// aligned takes a one-block kernel. `workspace` of
// sample_workspace_size(batch) float64 entries. Exactly one of `uniforms` ([batch] float64 draws: per_sample)
// and `rng_state` ((seed, counter) int64: per_sample_philox, each thread draws Philox4x32-10 itself and the
// last launch advances the counter by one) is non-null. With batch 0 nothing is launched.
cudaError_t launch_sample(const double* tree, const int64_t* head_size, const double* uniforms,
                          int64_t* rng_state, int64_t* indices, float* weights, int64_t batch, int64_t n_leaves,
                          double beta, double* workspace, cudaStream_t stream);

// per_update: leaf = (td_abs + eps) ** alpha, last duplicate wins; raises max_priority. Two passes (claim
// each leaf with atomicMax of a marker + position, then compare-and-swap the marker of the last
// occurrence): in one block up to 256 rows, else two grid launches. Marks dirty subtrees as launch_push.
cudaError_t launch_update(double* tree, float* max_priority, const int64_t* indices, const float* td_abs,
                          int64_t batch, int64_t n_leaves, double alpha, float eps, cudaStream_t stream);

}  // namespace per
}  // namespace cuda_ext
