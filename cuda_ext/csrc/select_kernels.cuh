// Action-selection kernels: branch_select (per-branch epsilon-greedy / Boltzmann with IQR and ensemble
// bonuses) and quantile_iqr. Plain C++ launch functions over raw device pointers; torch-free (CUDA runtime
// only). The torch launchers live in select_binding.cpp; semantics in cuda_ext/README.md; the oracle is
// cuda_ext/reference/select.py. Launches go on `stream`, never sync the host (CUDA-graph safe). Floats use
// one rounded operation at a time (no contracted FMA); Boltzmann weights are float(exp(double(x))) summed
// sequentially in float32, exactly as the reference does, so both draw the same action.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace cuda_ext {
namespace action_select {

// Largest row length quantile_iqr sorts in registers; longer rows must come in already sorted.
constexpr int64_t kMaxRegisterSamples = 64;

// branch_select: one thread per (book, branch); actions[b, k] in [0, n_actions[k]), or -1 where
// n_actions[k] is outside [1, max_actions].
cudaError_t launch_branch_select(const float* q, const float* iqr, const float* ens_std,
                                 const int64_t* n_actions, const float* eps, const bool* boltzmann,
                                 const float* u_explore, const float* u_action, int64_t n_books,
                                 int64_t n_branches, int64_t max_actions, float alpha, float beta,
                                 int64_t* actions, cudaStream_t stream);

// quantile_iqr over rows of `n_samples` floats: rows of at most kMaxRegisterSamples are sorted in
// registers (`presorted` false); longer rows must be passed sorted ascending, NaN last (`presorted` true).
cudaError_t launch_quantile_iqr(const float* samples, int64_t n_rows, int64_t n_samples, bool presorted,
                                float* out, cudaStream_t stream);

}  // namespace action_select
}  // namespace cuda_ext
