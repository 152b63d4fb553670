// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file tp/group.hpp
/// `mpx::tp::Group`: the tensor-parallel group a cut module works in — its c10d group, this rank's place
/// in it and the size N, and the run's timeout. `mpx::tp::current()` is the group the blocks (layers.hpp)
/// being built or run now belong to; the runtime sets it (`tp::Scope`) around a tensor-parallel stage's
/// construction and forward, and with no scope it is the group of one (N = 1: every block is its plain
/// LibTorch counterpart, so the same model code runs whole in one process). A block keeps the group it
/// was built in. Every collective names the group, the operation and the fix when a peer fails, and is
/// counted in `traffic()`.

#include <mpx/errors.hpp>  // mpx::peer_error, mpx::config_error
#include <mpx/torch/process_group.hpp>  // mpx::ProcessGroupPtr
#include <mpx/linkage.hpp>  // MPX_DECL, MPX_DEFINITIONS

#include <torch/torch.h>  // at::Tensor

#include <chrono>   // std::chrono::milliseconds
#include <cstdint>  // std::int64_t
#include <memory>   // std::shared_ptr
#include <string>   // std::string
#include <utility>  // std::exchange
#include <vector>   // std::vector

namespace mpx::tp
{

/// A tensor-parallel group (see the file comment).
struct Group : torch::CustomClassHolder
{
  ProcessGroupPtr pg;  ///< null for the group of one
  int rank = 0, size = 1;
  std::chrono::milliseconds timeout{60000};
  std::string name = "tensor-parallel group";  ///< "tensor-parallel group of slot 1 (ranks 2..3)", for errors
};
using GroupPtr = c10::intrusive_ptr<Group>;

namespace detail
{
MPX_DECL GroupPtr& current_slot();
}  // namespace detail

/// The group the blocks built or run now belong to (the group of one outside any Scope).
inline const GroupPtr& current() { return detail::current_slot(); }

/// Makes `g` the current group until the scope ends (scopes nest).
class Scope
{
 public:
  explicit Scope(GroupPtr g) : before_(std::exchange(detail::current_slot(), std::move(g))) {}
  ~Scope() { detail::current_slot() = std::move(before_); }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  GroupPtr before_;
};

/// The sizes of `n` cut `size` ways: each equal; a size N does not divide is a config_error naming `what`.
MPX_DECL std::int64_t shard_size(std::int64_t n, int size, const std::string& what);

/// What this process's tensor-parallel collectives carried (payload: an all-reduce's tensor, an
/// all-gather's gathered result), for benchmarks: `traffic() = {}` resets it.
struct Traffic
{
  std::int64_t all_reduce_calls = 0, all_reduce_bytes = 0, all_gather_calls = 0, all_gather_bytes = 0;
};
MPX_DECL Traffic& traffic();

namespace detail
{
/// Runs collective `op` on `g`, waiting with the group's timeout; a failure is a peer_error naming the group.
template <class Op>
void collective(const Group& g, const char* what, Op&& op)
{
  try {
    op()->wait(g.timeout);
  } catch (const std::exception& e) {
    throw peer_error("mpx: " + g.name + " (this rank is its member " + std::to_string(g.rank) + " of " + std::to_string(g.size) + "), " +
                     what + ": the collective failed, or a peer did not take part within " + std::to_string(g.timeout.count()) + " ms (" +
                     e.what() + ")");
  }
}

/// Gloo (CPU tensors) carries no 16-bit floating type in LibTorch 1.13: such a tensor travels as float.
inline bool travels_as_float(const at::Tensor& t) { return !t.is_cuda() && (t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf); }
}  // namespace detail

/// Sums `t` over the group, in place (contiguous CPU or device tensor).
MPX_DECL void all_reduce(const Group& g, at::Tensor& t, const char* what = "all-reduce");

/// The maximum of `t` over the group, in place.
MPX_DECL void all_reduce_max(const Group& g, at::Tensor& t, const char* what = "all-reduce (max)");

/// Every member's `t` (same shape on all), in group order.
MPX_DECL std::vector<at::Tensor> all_gather(const Group& g, const at::Tensor& t, const char* what = "all-gather");

}  // namespace mpx::tp

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----

namespace mpx::tp::detail
{
MPX_DECL GroupPtr& current_slot()
{
  thread_local GroupPtr g = c10::make_intrusive<Group>();
  return g;
}

}  // namespace mpx::tp::detail

namespace mpx::tp
{
MPX_DECL std::int64_t shard_size(std::int64_t n, int size, const std::string& what)
{
  if (n % size != 0)
    throw config_error("mpx::tp: " + what + " (" + std::to_string(n) + ") is not divisible by the tensor-parallel degree " +
                       std::to_string(size) + "; choose a degree that divides it");
  return n / size;
}

MPX_DECL Traffic& traffic()
{
  static Traffic t;
  return t;
}

MPX_DECL void all_reduce(const Group& g, at::Tensor& t, const char* what)
{
  if (g.size == 1) return;
  if (detail::travels_as_float(t)) {  // (bf16 autocast on CPU ranks)
    auto f = t.to(at::kFloat);
    all_reduce(g, f, what);
    t.copy_(f);
    return;
  }
  std::vector<at::Tensor> v{t};
  detail::collective(g, what, [&] { return g.pg->allreduce(v); });
  ++traffic().all_reduce_calls;
  traffic().all_reduce_bytes += std::int64_t(t.nbytes());
}

MPX_DECL void all_reduce_max(const Group& g, at::Tensor& t, const char* what)
{
  if (g.size == 1) return;
  if (detail::travels_as_float(t)) {
    auto f = t.to(at::kFloat);
    all_reduce_max(g, f, what);
    t.copy_(f);
    return;
  }
  std::vector<at::Tensor> v{t};
  c10d::AllreduceOptions o;
  o.reduceOp = c10d::ReduceOp::MAX;
  detail::collective(g, what, [&] { return g.pg->allreduce(v, o); });
  ++traffic().all_reduce_calls;
  traffic().all_reduce_bytes += std::int64_t(t.nbytes());
}

MPX_DECL std::vector<at::Tensor> all_gather(const Group& g, const at::Tensor& t, const char* what)
{
  if (g.size == 1) return {t};
  if (detail::travels_as_float(t)) {
    auto out = all_gather(g, t.to(at::kFloat), what);
    for (auto& o : out) o = o.to(t.scalar_type());
    return out;
  }
  std::vector<at::Tensor> in{t.contiguous()};
  std::vector<std::vector<at::Tensor>> out(1);
  for (int r = 0; r < g.size; ++r) out[0].push_back(torch::empty_like(in[0]));
  detail::collective(g, what, [&] { return g.pg->allgather(out, in); });
  ++traffic().all_gather_calls;
  traffic().all_gather_bytes += std::int64_t(in[0].nbytes()) * g.size;
  return out[0];
}

}  // namespace mpx::tp
#endif  // MPX_DEFINITIONS
