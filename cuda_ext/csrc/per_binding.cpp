// Torch launchers of the prioritized-replay ops: argument checks, device guard, current stream
// (c10::cuda::getCurrentCUDAStream, the function at::cuda::getCurrentCUDAStream forwards to), then
// the plain launch functions of per_kernels.cuh. The ops' schemas are defined in Python
// (cuda_ext/ops_per.py); this file only registers their CUDA implementations.
#include <cmath>
#include <cstdint>
#include <tuple>
#include <utility>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "per_kernels.cuh"

namespace {

void check_tensor(const at::Tensor& t, const char* name, at::ScalarType dtype, int64_t dim,
                  const at::Tensor& like) {
  TORCH_CHECK_VALUE(t.is_cuda(), name, " must be a CUDA tensor, got device ", t.device());
  TORCH_CHECK_VALUE(t.device() == like.device(), name, " is on ", t.device(), " but tree is on ", like.device());
  TORCH_CHECK_VALUE(t.scalar_type() == dtype, name, " must have dtype ", dtype, ", got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.dim() == dim, name, " must have ", dim, " dimensions, got shape ", t.sizes());
  TORCH_CHECK_VALUE(t.is_contiguous(), name, " must be contiguous");
}

void check_size(const at::Tensor& t, const char* name, int64_t dim, int64_t expected) {
  TORCH_CHECK_VALUE(t.size(dim) == expected, name, ".size(", dim, ")=", t.size(dim), " must be ", expected);
}

int64_t leaf_count(const at::Tensor& tree) {
  TORCH_CHECK_VALUE(tree.is_cuda(), "tree must be a CUDA tensor, got device ", tree.device());
  TORCH_CHECK_VALUE(tree.scalar_type() == at::kDouble, "tree must have dtype float64, got ", tree.scalar_type());
  TORCH_CHECK_VALUE(tree.dim() == 1 && tree.is_contiguous(), "tree must be a contiguous 1-D tensor");
  const int64_t n_nodes = tree.size(0);
  const int64_t n_leaves = n_nodes / 2;
  TORCH_CHECK_VALUE(n_nodes >= 2 && n_nodes % 2 == 0 && (n_leaves & (n_leaves - 1)) == 0, "tree length=", n_nodes,
              " must be 2P with P a power of two");
  TORCH_CHECK_VALUE(n_leaves <= cuda_ext::per::kMaxLeaves, "tree leaves P=", n_leaves, " exceeds ",
              cuda_ext::per::kMaxLeaves);
  return n_leaves;
}

at::Tensor per_push_cuda(const at::Tensor& obs, const at::Tensor& next_obs, const at::Tensor& action,
                         const at::Tensor& reward, const at::Tensor& done, const at::Tensor& kind,
                         const at::Tensor& tree, const at::Tensor& head_size, const at::Tensor& max_priority,
                         const at::Tensor& new_obs, const at::Tensor& new_next_obs,
                         const at::Tensor& new_action, const at::Tensor& new_reward,
                         const at::Tensor& new_done, const at::Tensor& new_kind, const at::Tensor& wants,
                         const at::Tensor& new_priority, const at::Tensor& max_multiplier, double alpha) {
  TORCH_CHECK_VALUE(std::isfinite(alpha) && alpha >= 0, "alpha=", alpha, " must be a finite number >= 0");
  const int64_t n_leaves = leaf_count(tree);
  check_tensor(obs, "obs", at::kFloat, 2, tree);
  const int64_t capacity = obs.size(0);
  const int64_t obs_dim = obs.size(1);
  TORCH_CHECK_VALUE(capacity >= 1 && capacity <= n_leaves, "capacity=", capacity, " must be in [1, P=", n_leaves,
              "]");
  check_tensor(next_obs, "next_obs", at::kFloat, 2, tree);
  check_tensor(action, "action", at::kLong, 2, tree);
  check_tensor(reward, "reward", at::kFloat, 1, tree);
  check_tensor(done, "done", at::kFloat, 1, tree);
  check_tensor(kind, "kind", at::kChar, 1, tree);
  check_tensor(head_size, "head_size", at::kLong, 1, tree);
  check_tensor(max_priority, "max_priority", at::kFloat, 1, tree);
  const int64_t n_branches = action.size(1);
  for (const auto& [t, name] : {std::pair{next_obs, "next_obs"}, std::pair{action, "action"},
                                std::pair{reward, "reward"}, std::pair{done, "done"}, std::pair{kind, "kind"}}) {
    check_size(t, name, 0, capacity);
  }
  check_size(next_obs, "next_obs", 1, obs_dim);
  check_size(head_size, "head_size", 0, 2);
  check_size(max_priority, "max_priority", 0, 1);

  check_tensor(wants, "wants", at::kBool, 1, tree);
  const int64_t n = wants.size(0);
  check_tensor(new_obs, "new_obs", at::kFloat, 2, tree);
  check_tensor(new_next_obs, "new_next_obs", at::kFloat, 2, tree);
  check_tensor(new_action, "new_action", at::kLong, 2, tree);
  check_tensor(new_reward, "new_reward", at::kFloat, 1, tree);
  check_tensor(new_done, "new_done", at::kFloat, 1, tree);
  check_tensor(new_kind, "new_kind", at::kChar, 1, tree);
  check_tensor(new_priority, "new_priority", at::kFloat, 1, tree);
  check_tensor(max_multiplier, "max_multiplier", at::kFloat, 1, tree);
  for (const auto& [t, name] :
       {std::pair{new_obs, "new_obs"}, std::pair{new_next_obs, "new_next_obs"},
        std::pair{new_action, "new_action"}, std::pair{new_reward, "new_reward"},
        std::pair{new_done, "new_done"}, std::pair{new_kind, "new_kind"},
        std::pair{new_priority, "new_priority"}, std::pair{max_multiplier, "max_multiplier"}}) {
    check_size(t, name, 0, n);
  }
  check_size(new_obs, "new_obs", 1, obs_dim);
  check_size(new_next_obs, "new_next_obs", 1, obs_dim);
  check_size(new_action, "new_action", 1, n_branches);

  const c10::cuda::CUDAGuard guard(tree.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  at::Tensor slots = at::empty({n}, wants.options().dtype(at::kLong));
  at::Tensor workspace = at::empty({cuda_ext::per::push_workspace_size(n)}, wants.options().dtype(at::kLong));
  C10_CUDA_CHECK(cuda_ext::per::launch_push(
      wants.data_ptr<bool>(), new_priority.data_ptr<float>(), max_multiplier.data_ptr<float>(),
      max_priority.data_ptr<float>(), head_size.data_ptr<int64_t>(), tree.data_ptr<double>(),
      slots.data_ptr<int64_t>(), new_obs.data_ptr<float>(), new_next_obs.data_ptr<float>(),
      new_action.data_ptr<int64_t>(), new_reward.data_ptr<float>(), new_done.data_ptr<float>(),
      new_kind.data_ptr<int8_t>(), obs.data_ptr<float>(), next_obs.data_ptr<float>(), action.data_ptr<int64_t>(),
      reward.data_ptr<float>(), done.data_ptr<float>(), kind.data_ptr<int8_t>(), n, capacity, n_leaves, obs_dim,
      n_branches, alpha, workspace.data_ptr<int64_t>(), stream));
  return slots;
}

void per_tree_rebuild_cuda(const at::Tensor& tree, const at::Tensor& leaf_idx) {
  const int64_t n_leaves = leaf_count(tree);
  check_tensor(leaf_idx, "leaf_idx", at::kLong, 1, tree);
  const c10::cuda::CUDAGuard guard(tree.device());
  C10_CUDA_CHECK(cuda_ext::per::launch_tree_rebuild(tree.data_ptr<double>(), leaf_idx.data_ptr<int64_t>(),
                                                    leaf_idx.size(0), n_leaves,
                                                    c10::cuda::getCurrentCUDAStream()));
}

void per_tree_refresh_cuda(const at::Tensor& tree) {
  const int64_t n_leaves = leaf_count(tree);
  const c10::cuda::CUDAGuard guard(tree.device());
  C10_CUDA_CHECK(cuda_ext::per::launch_tree_refresh(tree.data_ptr<double>(), n_leaves,
                                                    c10::cuda::getCurrentCUDAStream()));
}

std::tuple<at::Tensor, at::Tensor> per_sample_cuda(const at::Tensor& tree, const at::Tensor& head_size,
                                                   const at::Tensor& uniforms, double beta) {
  TORCH_CHECK_VALUE(std::isfinite(beta) && beta >= 0 && beta <= 1, "beta=", beta, " must lie in [0, 1]");
  const int64_t n_leaves = leaf_count(tree);
  check_tensor(head_size, "head_size", at::kLong, 1, tree);
  check_size(head_size, "head_size", 0, 2);
  check_tensor(uniforms, "uniforms", at::kDouble, 1, tree);
  const int64_t batch = uniforms.size(0);
  const c10::cuda::CUDAGuard guard(tree.device());
  at::Tensor indices = at::empty({batch}, uniforms.options().dtype(at::kLong));
  at::Tensor weights = at::empty({batch}, uniforms.options().dtype(at::kFloat));
  at::Tensor workspace = at::empty({cuda_ext::per::sample_workspace_size(batch)}, uniforms.options());
  C10_CUDA_CHECK(cuda_ext::per::launch_sample(tree.data_ptr<double>(), head_size.data_ptr<int64_t>(),
                                              uniforms.data_ptr<double>(), nullptr, indices.data_ptr<int64_t>(),
                                              weights.data_ptr<float>(), batch, n_leaves, beta,
                                              workspace.data_ptr<double>(), c10::cuda::getCurrentCUDAStream()));
  return {indices, weights};
}

std::tuple<at::Tensor, at::Tensor> per_sample_philox_cuda(const at::Tensor& tree, const at::Tensor& head_size,
                                                          const at::Tensor& rng_state, int64_t batch_size,
                                                          double beta) {
  TORCH_CHECK_VALUE(std::isfinite(beta) && beta >= 0 && beta <= 1, "beta=", beta, " must lie in [0, 1]");
  TORCH_CHECK_VALUE(batch_size >= 0, "batch_size=", batch_size, " must be >= 0");
  const int64_t n_leaves = leaf_count(tree);
  check_tensor(head_size, "head_size", at::kLong, 1, tree);
  check_size(head_size, "head_size", 0, 2);
  check_tensor(rng_state, "rng_state", at::kLong, 1, tree);
  check_size(rng_state, "rng_state", 0, 2);
  const c10::cuda::CUDAGuard guard(tree.device());
  at::Tensor indices = at::empty({batch_size}, head_size.options());
  at::Tensor weights = at::empty({batch_size}, head_size.options().dtype(at::kFloat));
  if (batch_size == 0) {  // nothing to launch; the counter still advances, as in the reference
    rng_state.select(0, 1).add_(1);
    return {indices, weights};
  }
  at::Tensor workspace =
      at::empty({cuda_ext::per::sample_workspace_size(batch_size)}, tree.options());
  C10_CUDA_CHECK(cuda_ext::per::launch_sample(tree.data_ptr<double>(), head_size.data_ptr<int64_t>(), nullptr,
                                              rng_state.data_ptr<int64_t>(), indices.data_ptr<int64_t>(),
                                              weights.data_ptr<float>(), batch_size, n_leaves, beta,
                                              workspace.data_ptr<double>(), c10::cuda::getCurrentCUDAStream()));
  return {indices, weights};
}

void per_update_cuda(const at::Tensor& tree, const at::Tensor& max_priority, const at::Tensor& indices,
                     const at::Tensor& td_abs, double alpha, double eps) {
  TORCH_CHECK_VALUE(std::isfinite(alpha) && alpha >= 0, "alpha=", alpha, " must be a finite number >= 0");
  TORCH_CHECK_VALUE(std::isfinite(eps) && eps >= 0, "eps=", eps, " must be a finite number >= 0");
  const int64_t n_leaves = leaf_count(tree);
  check_tensor(max_priority, "max_priority", at::kFloat, 1, tree);
  check_size(max_priority, "max_priority", 0, 1);
  check_tensor(indices, "indices", at::kLong, 1, tree);
  check_tensor(td_abs, "td_abs", at::kFloat, 1, tree);
  check_size(td_abs, "td_abs", 0, indices.size(0));
  const c10::cuda::CUDAGuard guard(tree.device());
  C10_CUDA_CHECK(cuda_ext::per::launch_update(tree.data_ptr<double>(), max_priority.data_ptr<float>(),
                                              indices.data_ptr<int64_t>(), td_abs.data_ptr<float>(),
                                              indices.size(0), n_leaves, alpha, static_cast<float>(eps),
                                              c10::cuda::getCurrentCUDAStream()));
}

}  // namespace

TORCH_LIBRARY_IMPL(cuda_ext, CUDA, m) {
  m.impl("per_push", &per_push_cuda);
  m.impl("per_tree_rebuild", &per_tree_rebuild_cuda);
  m.impl("per_tree_refresh", &per_tree_refresh_cuda);
  m.impl("per_sample", &per_sample_cuda);
  m.impl("per_sample_philox", &per_sample_philox_cuda);
  m.impl("per_update", &per_update_cuda);
}
