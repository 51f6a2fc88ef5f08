// Torch launchers of the hindsight ops: argument checks (ValueError naming the argument), device guard,
// current stream, output allocation, then the plain launch functions of hindsight_kernels.cuh. The ops'
// schemas are defined in Python (cuda_ext/ops_hindsight.py); this file registers their CUDA kernels.
// Read-only inputs are made contiguous; state tensors mutated in place must already be contiguous.
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <tuple>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "hindsight_kernels.cuh"

namespace {

using Rows = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// The rows an op returns, allocated: [n, obs_dim] obs and next obs and [n] rewards with the options of
// `floats`, [n, n_branches] actions and the [1] count with those of `longs`, [n] wants with those of `bools`.
Rows empty_rows(int64_t n, int64_t obs_dim, int64_t n_branches, const at::Tensor& floats, const at::Tensor& longs,
                const at::Tensor& bools) {
  return {at::empty({n, obs_dim}, floats.options()), at::empty({n, obs_dim}, floats.options()),
          at::empty({n, n_branches}, longs.options()), at::empty({n}, floats.options()),
          at::empty({n}, bools.options()), at::empty({1}, longs.options())};
}

// Check dtype, shape (-1: any size), device (that of `like`) and, for mutated state, contiguity.
void check(const at::Tensor& t, const char* name, at::ScalarType dtype, std::initializer_list<int64_t> shape,
           const at::Tensor& like, bool mutated) {
  TORCH_CHECK_VALUE(t.device() == like.device(), name, ".device=", t.device(), " must be ", like.device());
  TORCH_CHECK_VALUE(t.scalar_type() == dtype, name, ".dtype=", t.scalar_type(), " must be ", dtype);
  bool ok = t.dim() == static_cast<int64_t>(shape.size());
  int64_t dim = 0;
  for (int64_t size : shape) {
    if (ok && size >= 0 && t.size(dim) != size) ok = false;
    ++dim;
  }
  TORCH_CHECK_VALUE(ok, name, ".shape=", t.sizes(), " must be ", at::IntArrayRef(shape), " (-1: any)");
  TORCH_CHECK_VALUE(!mutated || t.is_contiguous(), name, " must be contiguous (it is updated in place)");
}

void hindsight_track_cuda(const at::Tensor& ring, const at::Tensor& ring_len, const at::Tensor& entry_mid,
                          const at::Tensor& direction, const at::Tensor& peak, const at::Tensor& peak_row,
                          const at::Tensor& position, const at::Tensor& best_bid, const at::Tensor& best_ask,
                          const at::Tensor& row) {
  TORCH_CHECK_VALUE(ring.is_cuda(), "ring.device=", ring.device(), " must be a CUDA device");
  check(ring, "ring", at::kFloat, {-1, -1}, ring, true);
  const int64_t n_books = ring.size(0);
  const int64_t ring_size = ring.size(1);
  TORCH_CHECK_VALUE(ring_size >= 1, "ring.shape[1]=", ring_size, " must be >= 1");
  check(ring_len, "ring_len", at::kLong, {n_books}, ring, true);
  check(entry_mid, "entry_mid", at::kFloat, {n_books}, ring, true);
  check(direction, "direction", at::kLong, {n_books}, ring, true);
  check(peak, "peak", at::kFloat, {n_books}, ring, true);
  check(peak_row, "peak_row", at::kLong, {n_books}, ring, true);
  check(position, "position", at::kFloat, {n_books}, ring, false);
  check(best_bid, "best_bid", at::kFloat, {n_books}, ring, false);
  check(best_ask, "best_ask", at::kFloat, {n_books}, ring, false);
  check(row, "row", at::kLong, {n_books}, ring, false);
  const c10::cuda::CUDAGuard guard(ring.device());
  const at::Tensor position_c = position.contiguous();
  const at::Tensor bid_c = best_bid.contiguous();
  const at::Tensor ask_c = best_ask.contiguous();
  const at::Tensor row_c = row.contiguous();
  C10_CUDA_CHECK(cuda_ext::hindsight::launch_track(
      ring.data_ptr<float>(), ring_len.data_ptr<int64_t>(), entry_mid.data_ptr<float>(),
      direction.data_ptr<int64_t>(), peak.data_ptr<float>(), peak_row.data_ptr<int64_t>(),
      position_c.data_ptr<float>(), bid_c.data_ptr<float>(), ask_c.data_ptr<float>(), row_c.data_ptr<int64_t>(),
      n_books, ring_size, at::cuda::getCurrentCUDAStream()));
}

Rows hindsight_inject_cuda(const at::Tensor& ring_len, const at::Tensor& entry_mid, const at::Tensor& direction,
                           const at::Tensor& peak, const at::Tensor& peak_row, const at::Tensor& trade_closed,
                           const at::Tensor& raw_reward, const at::Tensor& lots, const at::Tensor& obs,
                           const at::Tensor& next_obs, const at::Tensor& action,
                           const at::Tensor& replay_next_obs, double reward_scale, double threshold,
                           int64_t anchor, int64_t direction_branch, int64_t flat_action) {
  TORCH_CHECK_VALUE(obs.is_cuda(), "obs.device=", obs.device(), " must be a CUDA device");
  check(obs, "obs", at::kFloat, {-1, -1}, obs, false);
  const int64_t n_books = obs.size(0);
  const int64_t obs_dim = obs.size(1);
  check(next_obs, "next_obs", at::kFloat, {n_books, obs_dim}, obs, false);
  check(action, "action", at::kLong, {n_books, -1}, obs, false);
  const int64_t n_branches = action.size(1);
  check(replay_next_obs, "replay_next_obs", at::kFloat, {-1, obs_dim}, obs, false);
  check(ring_len, "ring_len", at::kLong, {n_books}, obs, true);
  check(entry_mid, "entry_mid", at::kFloat, {n_books}, obs, true);
  check(direction, "direction", at::kLong, {n_books}, obs, true);
  check(peak, "peak", at::kFloat, {n_books}, obs, true);
  check(peak_row, "peak_row", at::kLong, {n_books}, obs, true);
  check(trade_closed, "trade_closed", at::kBool, {n_books}, obs, false);
  check(raw_reward, "raw_reward", at::kFloat, {n_books}, obs, false);
  check(lots, "lots", at::kFloat, {n_books}, obs, false);
  TORCH_CHECK_VALUE(std::isfinite(reward_scale) && reward_scale > 0, "reward_scale=", reward_scale,
                    " must be a finite number > 0");
  TORCH_CHECK_VALUE(std::isfinite(threshold), "threshold=", threshold, " must be a finite number");
  TORCH_CHECK_VALUE(anchor == 0 || anchor == 1, "anchor=", anchor, " must be 0 (close) or 1 (peak)");
  TORCH_CHECK_VALUE(anchor == 0 || replay_next_obs.size(0) >= 1, "replay_next_obs.shape=",
                    replay_next_obs.sizes(), " must have rows for anchor=1");
  TORCH_CHECK_VALUE(direction_branch >= 0 && direction_branch < n_branches, "direction_branch=",
                    direction_branch, " must be in [0, ", n_branches, ")");
  TORCH_CHECK_VALUE(flat_action >= 0, "flat_action=", flat_action, " must be >= 0");
  const c10::cuda::CUDAGuard guard(obs.device());
  const at::Tensor closed_c = trade_closed.contiguous();
  const at::Tensor raw_c = raw_reward.contiguous();
  const at::Tensor lots_c = lots.contiguous();
  const at::Tensor obs_c = obs.contiguous();
  const at::Tensor next_c = next_obs.contiguous();
  const at::Tensor action_c = action.contiguous();
  const at::Tensor replay_c = replay_next_obs.contiguous();
  Rows rows = empty_rows(n_books, obs_dim, n_branches, obs, action, trade_closed);
  auto& [out_obs, out_next_obs, out_action, out_reward, wants, count] = rows;
  C10_CUDA_CHECK(cuda_ext::hindsight::launch_inject(
      ring_len.data_ptr<int64_t>(), entry_mid.data_ptr<float>(), direction.data_ptr<int64_t>(),
      peak.data_ptr<float>(), peak_row.data_ptr<int64_t>(), closed_c.data_ptr<bool>(), raw_c.data_ptr<float>(),
      lots_c.data_ptr<float>(), obs_c.data_ptr<float>(), next_c.data_ptr<float>(), action_c.data_ptr<int64_t>(),
      replay_c.data_ptr<float>(), n_books, obs_dim, n_branches, replay_next_obs.size(0),
      static_cast<float>(reward_scale), static_cast<float>(threshold), static_cast<int>(anchor), direction_branch,
      flat_action, out_obs.data_ptr<float>(), out_next_obs.data_ptr<float>(), out_action.data_ptr<int64_t>(),
      out_reward.data_ptr<float>(), wants.data_ptr<bool>(), count.data_ptr<int64_t>(),
      at::cuda::getCurrentCUDAStream()));
  return rows;
}

Rows hindsight_forward_cuda(const at::Tensor& slot_valid, const at::Tensor& slot_entry,
                            const at::Tensor& slot_close_step, const at::Tensor& slot_direction,
                            const at::Tensor& slot_actual, const at::Tensor& slot_lots,
                            const at::Tensor& slot_book, const at::Tensor& slot_obs,
                            const at::Tensor& slot_action, const at::Tensor& ring_head, const at::Tensor& step,
                            const at::Tensor& mid, const at::Tensor& book_reset, const at::Tensor& trade_closed,
                            const at::Tensor& entry_mid, const at::Tensor& closed_direction,
                            const at::Tensor& actual, const at::Tensor& lots, const at::Tensor& obs,
                            const at::Tensor& action, int64_t lookahead, double threshold, double reward_scale,
                            int64_t direction_branch) {
  TORCH_CHECK_VALUE(slot_obs.is_cuda(), "slot_obs.device=", slot_obs.device(), " must be a CUDA device");
  check(slot_obs, "slot_obs", at::kFloat, {-1, -1}, slot_obs, true);
  const int64_t n_slots = slot_obs.size(0);
  const int64_t obs_dim = slot_obs.size(1);
  TORCH_CHECK_VALUE(n_slots >= 1, "slot_obs.shape[0]=", n_slots, " must be >= 1");
  check(slot_action, "slot_action", at::kLong, {n_slots, -1}, slot_obs, true);
  const int64_t n_branches = slot_action.size(1);
  check(slot_valid, "slot_valid", at::kBool, {n_slots}, slot_obs, true);
  check(slot_entry, "slot_entry", at::kFloat, {n_slots}, slot_obs, true);
  check(slot_close_step, "slot_close_step", at::kLong, {n_slots}, slot_obs, true);
  check(slot_direction, "slot_direction", at::kLong, {n_slots}, slot_obs, true);
  check(slot_actual, "slot_actual", at::kFloat, {n_slots}, slot_obs, true);
  check(slot_lots, "slot_lots", at::kFloat, {n_slots}, slot_obs, true);
  check(slot_book, "slot_book", at::kLong, {n_slots}, slot_obs, true);
  check(ring_head, "ring_head", at::kLong, {1}, slot_obs, true);
  check(step, "step", at::kLong, {1}, slot_obs, false);
  check(obs, "obs", at::kFloat, {-1, obs_dim}, slot_obs, false);
  const int64_t n_books = obs.size(0);
  check(action, "action", at::kLong, {n_books, n_branches}, slot_obs, false);
  check(mid, "mid", at::kFloat, {n_books}, slot_obs, false);
  check(book_reset, "book_reset", at::kBool, {n_books}, slot_obs, false);
  check(trade_closed, "trade_closed", at::kBool, {n_books}, slot_obs, false);
  check(entry_mid, "entry_mid", at::kFloat, {n_books}, slot_obs, false);
  check(closed_direction, "closed_direction", at::kLong, {n_books}, slot_obs, false);
  check(actual, "actual", at::kFloat, {n_books}, slot_obs, false);
  check(lots, "lots", at::kFloat, {n_books}, slot_obs, false);
  TORCH_CHECK_VALUE(lookahead >= 1, "lookahead=", lookahead, " must be >= 1");
  TORCH_CHECK_VALUE(std::isfinite(threshold), "threshold=", threshold, " must be a finite number");
  TORCH_CHECK_VALUE(std::isfinite(reward_scale) && reward_scale > 0, "reward_scale=", reward_scale,
                    " must be a finite number > 0");
  TORCH_CHECK_VALUE(direction_branch >= 0 && direction_branch < n_branches, "direction_branch=",
                    direction_branch, " must be in [0, ", n_branches, ")");
  const c10::cuda::CUDAGuard guard(slot_obs.device());
  const at::Tensor step_c = step.contiguous();
  const at::Tensor mid_c = mid.contiguous();
  const at::Tensor reset_c = book_reset.contiguous();
  const at::Tensor closed_c = trade_closed.contiguous();
  const at::Tensor entry_c = entry_mid.contiguous();
  const at::Tensor dir_c = closed_direction.contiguous();
  const at::Tensor actual_c = actual.contiguous();
  const at::Tensor lots_c = lots.contiguous();
  const at::Tensor obs_c = obs.contiguous();
  const at::Tensor action_c = action.contiguous();
  Rows rows = empty_rows(n_slots, obs_dim, n_branches, slot_obs, slot_action, slot_valid);
  auto& [out_obs, out_next_obs, out_action, out_reward, wants, count] = rows;
  at::Tensor workspace =
      at::empty({cuda_ext::hindsight::forward_workspace_size(n_slots, n_books)}, slot_action.options());
  C10_CUDA_CHECK(cuda_ext::hindsight::launch_forward(
      slot_valid.data_ptr<bool>(), slot_entry.data_ptr<float>(), slot_close_step.data_ptr<int64_t>(),
      slot_direction.data_ptr<int64_t>(), slot_actual.data_ptr<float>(), slot_lots.data_ptr<float>(),
      slot_book.data_ptr<int64_t>(), slot_obs.data_ptr<float>(), slot_action.data_ptr<int64_t>(),
      ring_head.data_ptr<int64_t>(), step_c.data_ptr<int64_t>(), mid_c.data_ptr<float>(),
      reset_c.data_ptr<bool>(), closed_c.data_ptr<bool>(), entry_c.data_ptr<float>(), dir_c.data_ptr<int64_t>(),
      actual_c.data_ptr<float>(), lots_c.data_ptr<float>(), obs_c.data_ptr<float>(), action_c.data_ptr<int64_t>(),
      n_slots, n_books, obs_dim, n_branches, lookahead, static_cast<float>(threshold),
      static_cast<float>(reward_scale), direction_branch, out_obs.data_ptr<float>(),
      out_next_obs.data_ptr<float>(), out_action.data_ptr<int64_t>(), out_reward.data_ptr<float>(),
      wants.data_ptr<bool>(), count.data_ptr<int64_t>(), workspace.data_ptr<int64_t>(),
      at::cuda::getCurrentCUDAStream()));
  return rows;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
magnitude_relabel_cuda(const at::Tensor& trade_closed, const at::Tensor& obs, const at::Tensor& next_obs,
                       const at::Tensor& action, const at::Tensor& reward, const at::Tensor& magnitudes,
                       int64_t magnitude_branch) {
  TORCH_CHECK_VALUE(obs.is_cuda(), "obs.device=", obs.device(), " must be a CUDA device");
  check(obs, "obs", at::kFloat, {-1, -1}, obs, false);
  const int64_t n_books = obs.size(0);
  const int64_t obs_dim = obs.size(1);
  check(next_obs, "next_obs", at::kFloat, {n_books, obs_dim}, obs, false);
  check(action, "action", at::kLong, {n_books, -1}, obs, false);
  const int64_t n_branches = action.size(1);
  check(trade_closed, "trade_closed", at::kBool, {n_books}, obs, false);
  check(reward, "reward", at::kFloat, {n_books}, obs, false);
  check(magnitudes, "magnitudes", at::kFloat, {-1}, obs, false);
  const int64_t n_mags = magnitudes.size(0);
  TORCH_CHECK_VALUE(n_mags >= 2, "magnitudes.shape=", magnitudes.sizes(), " must hold >= 2 magnitudes");
  TORCH_CHECK_VALUE(magnitude_branch >= 0 && magnitude_branch < n_branches, "magnitude_branch=",
                    magnitude_branch, " must be in [0, ", n_branches, ")");
  const c10::cuda::CUDAGuard guard(obs.device());
  const at::Tensor closed_c = trade_closed.contiguous();
  const at::Tensor obs_c = obs.contiguous();
  const at::Tensor next_c = next_obs.contiguous();
  const at::Tensor action_c = action.contiguous();
  const at::Tensor reward_c = reward.contiguous();
  const at::Tensor mags_c = magnitudes.contiguous();
  const int64_t n_rows = (n_mags - 1) * n_books;
  auto [out_obs, out_next_obs, out_action, out_reward, wants, count] =
      empty_rows(n_rows, obs_dim, n_branches, obs, action, trade_closed);
  at::Tensor out_priority = at::empty({n_rows}, obs.options());
  C10_CUDA_CHECK(cuda_ext::hindsight::launch_relabel(
      closed_c.data_ptr<bool>(), obs_c.data_ptr<float>(), next_c.data_ptr<float>(), action_c.data_ptr<int64_t>(),
      reward_c.data_ptr<float>(), mags_c.data_ptr<float>(), n_books, obs_dim, n_branches, n_mags,
      magnitude_branch, out_obs.data_ptr<float>(), out_next_obs.data_ptr<float>(), out_action.data_ptr<int64_t>(),
      out_reward.data_ptr<float>(), out_priority.data_ptr<float>(), wants.data_ptr<bool>(),
      count.data_ptr<int64_t>(), at::cuda::getCurrentCUDAStream()));
  return {out_obs, out_next_obs, out_action, out_reward, out_priority, wants, count};
}

}  // namespace

TORCH_LIBRARY_IMPL(cuda_ext, CUDA, m) {
  m.impl("hindsight_track", &hindsight_track_cuda);
  m.impl("hindsight_inject", &hindsight_inject_cuda);
  m.impl("hindsight_forward", &hindsight_forward_cuda);
  m.impl("magnitude_relabel", &magnitude_relabel_cuda);
}
