// Torch launchers of the action-selection ops: argument checks (ValueError naming the argument), device
// guard, current stream, output allocation, then the plain launch functions of select_kernels.cuh. The ops'
// schemas are defined in Python (cuda_ext/ops_select.py); this file registers their CUDA kernels.
#include <cmath>
#include <cstdint>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "select_kernels.cuh"

namespace {

// Check device (that of `like`), dtype and exact shape.
void check(const at::Tensor& t, const char* name, at::ScalarType dtype, at::IntArrayRef shape,
           const at::Tensor& like) {
  TORCH_CHECK_VALUE(t.device() == like.device(), name, ".device=", t.device(), " must be ", like.device());
  TORCH_CHECK_VALUE(t.scalar_type() == dtype, name, ".dtype=", t.scalar_type(), " must be ", dtype);
  TORCH_CHECK_VALUE(t.sizes() == shape, name, ".shape=", t.sizes(), " must be ", shape);
}

at::Tensor branch_select_cuda(const at::Tensor& q, const at::Tensor& iqr, const at::Tensor& ens_std,
                              const at::Tensor& n_actions, const at::Tensor& eps, const at::Tensor& boltzmann,
                              const at::Tensor& u_explore, const at::Tensor& u_action, double alpha,
                              double beta) {
  TORCH_CHECK_VALUE(std::isfinite(alpha), "alpha=", alpha, " must be a finite number");
  TORCH_CHECK_VALUE(std::isfinite(beta), "beta=", beta, " must be a finite number");
  TORCH_CHECK_VALUE(q.is_cuda(), "q.device=", q.device(), " must be a CUDA device");
  TORCH_CHECK_VALUE(q.scalar_type() == at::kFloat, "q.dtype=", q.scalar_type(), " must be Float");
  TORCH_CHECK_VALUE(q.dim() == 3, "q.shape=", q.sizes(), " must be [B, NB, A]");
  const int64_t n_books = q.size(0);
  const int64_t n_branches = q.size(1);
  const int64_t max_actions = q.size(2);
  TORCH_CHECK_VALUE(max_actions >= 1, "q.shape[2]=", max_actions, " must be >= 1");
  check(iqr, "iqr", at::kFloat, q.sizes(), q);
  check(ens_std, "ens_std", at::kFloat, q.sizes(), q);
  check(n_actions, "n_actions", at::kLong, {n_branches}, q);
  check(eps, "eps", at::kFloat, {n_branches}, q);
  check(boltzmann, "boltzmann", at::kBool, {n_branches}, q);
  check(u_explore, "u_explore", at::kFloat, {n_books, n_branches}, q);
  check(u_action, "u_action", at::kFloat, {n_books, n_branches}, q);
  const c10::cuda::CUDAGuard guard(q.device());
  const at::Tensor q_c = q.contiguous();
  const at::Tensor iqr_c = iqr.contiguous();
  const at::Tensor std_c = ens_std.contiguous();
  const at::Tensor n_c = n_actions.contiguous();
  const at::Tensor eps_c = eps.contiguous();
  const at::Tensor boltz_c = boltzmann.contiguous();
  const at::Tensor ue_c = u_explore.contiguous();
  const at::Tensor ua_c = u_action.contiguous();
  at::Tensor actions = at::empty({n_books, n_branches}, n_actions.options());
  C10_CUDA_CHECK(cuda_ext::action_select::launch_branch_select(
      q_c.data_ptr<float>(), iqr_c.data_ptr<float>(), std_c.data_ptr<float>(), n_c.data_ptr<int64_t>(),
      eps_c.data_ptr<float>(), boltz_c.data_ptr<bool>(), ue_c.data_ptr<float>(), ua_c.data_ptr<float>(), n_books,
      n_branches, max_actions, static_cast<float>(alpha), static_cast<float>(beta), actions.data_ptr<int64_t>(),
      at::cuda::getCurrentCUDAStream()));
  return actions;
}

at::Tensor quantile_iqr_cuda(const at::Tensor& samples) {
  TORCH_CHECK_VALUE(samples.is_cuda(), "samples.device=", samples.device(), " must be a CUDA device");
  TORCH_CHECK_VALUE(samples.scalar_type() == at::kFloat, "samples.dtype=", samples.scalar_type(),
                    " must be Float");
  TORCH_CHECK_VALUE(samples.dim() >= 1 && samples.size(-1) >= 1, "samples.shape=", samples.sizes(),
                    " must have a last dimension >= 1");
  const c10::cuda::CUDAGuard guard(samples.device());
  const int64_t n_samples = samples.size(-1);
  const int64_t n_rows = samples.numel() / n_samples;
  at::Tensor out = at::empty(samples.sizes().slice(0, samples.dim() - 1), samples.options());
  const bool presorted = n_samples > cuda_ext::action_select::kMaxRegisterSamples;
  // Long rows: torch's segmented sort (NaN last), then the kernel reads four order statistics per row.
  const at::Tensor rows = presorted ? std::get<0>(samples.sort(-1)).contiguous() : samples.contiguous();
  C10_CUDA_CHECK(cuda_ext::action_select::launch_quantile_iqr(
      rows.data_ptr<float>(), n_rows, n_samples, presorted, out.data_ptr<float>(),
      at::cuda::getCurrentCUDAStream()));
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(cuda_ext, CUDA, m) {
  m.impl("branch_select", &branch_select_cuda);
  m.impl("quantile_iqr", &quantile_iqr_cuda);
}
