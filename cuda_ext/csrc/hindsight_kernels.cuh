// Hindsight kernels: trade tracker, backward (peak) and forward injection, magnitude relabel. Plain C++
// launch functions over raw device pointers; torch-free (CUDA runtime only). The torch launchers live in
// hindsight_binding.cpp; semantics in cuda_ext/README.md; the oracle is cuda_ext/reference/hindsight.py.
// Every launch goes on `stream`, never syncs the host and writes fixed-size outputs (CUDA-graph safe).
// Floats use one rounded operation at a time (__fadd_rn/__fmul_rn/...), never a contracted FMA, so the
// results equal the float32 CPU reference bit for bit. Rows that are not wanted are written as zeros.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace cuda_ext {
namespace hindsight {

// hindsight_track: one thread per book; tracker state updated in place.
cudaError_t launch_track(float* ring, int64_t* ring_len, float* entry_mid, int64_t* direction, float* peak,
                         int64_t* peak_row, const float* position, const float* best_bid,
                         const float* best_ask, const int64_t* row, int64_t n_books, int64_t ring_size,
                         cudaStream_t stream);

// hindsight_inject: candidate row per book, tracker reset of closed books; `count` is zeroed and
// accumulated here. anchor: 0 close, 1 peak.
cudaError_t launch_inject(int64_t* ring_len, float* entry_mid, int64_t* direction, float* peak,
                          int64_t* peak_row, const bool* trade_closed, const float* raw_reward,
                          const float* lots, const float* obs, const float* next_obs, const int64_t* action,
                          const float* replay_next_obs, int64_t n_books, int64_t obs_dim,
                          int64_t n_branches, int64_t n_replay_rows, float reward_scale, float threshold,
                          int anchor, int64_t direction_branch, int64_t flat_action, float* out_obs,
                          float* out_next_obs, int64_t* out_action, float* out_reward, bool* wants,
                          int64_t* count, cudaStream_t stream);

// Scratch int64 entries hindsight_forward needs for `n_slots` slots and `n_books` books.
int64_t forward_workspace_size(int64_t n_slots, int64_t n_books);

// hindsight_forward: phase 1 (judge the slots, one row per slot) then phase 2 (closed trades enter the
// ring at prefix-sum positions); two kernels, `workspace` of forward_workspace_size() int64 entries.
cudaError_t launch_forward(bool* slot_valid, float* slot_entry, int64_t* slot_close_step,
                           int64_t* slot_direction, float* slot_actual, float* slot_lots, int64_t* slot_book,
                           float* slot_obs, int64_t* slot_action, int64_t* ring_head, const int64_t* step,
                           const float* mid, const bool* book_reset, const bool* trade_closed,
                           const float* entry_mid, const int64_t* closed_direction, const float* actual,
                           const float* lots, const float* obs, const int64_t* action, int64_t n_slots,
                           int64_t n_books, int64_t obs_dim, int64_t n_branches, int64_t lookahead,
                           float threshold, float reward_scale, int64_t direction_branch, float* out_obs,
                           float* out_next_obs, int64_t* out_action, float* out_reward, bool* wants,
                           int64_t* count, int64_t* workspace, cudaStream_t stream);

// magnitude_relabel: (n_mags - 1) * n_books candidate rows; `count` is zeroed and accumulated here.
cudaError_t launch_relabel(const bool* trade_closed, const float* obs, const float* next_obs,
                           const int64_t* action, const float* reward, const float* magnitudes,
                           int64_t n_books, int64_t obs_dim, int64_t n_branches, int64_t n_mags,
                           int64_t magnitude_branch, float* out_obs, float* out_next_obs,
                           int64_t* out_action, float* out_reward, float* out_priority, bool* wants,
                           int64_t* count, cudaStream_t stream);

}  // namespace hindsight
}  // namespace cuda_ext
