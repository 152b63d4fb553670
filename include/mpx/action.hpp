// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file action.hpp
/// The vocabulary of schedules. One `Action` is one thing a pipeline rank does for one micro-batch of
/// one stage; a `Table` is every rank's ordered program for one training step.
///
/// Conventions (the executor and the proof share them):
/// - `F(s, m)`   forward of stage s on micro-batch m.
/// - `B(s, m)`   full backward (input and weight gradients).
/// - `I(s, m)`   input-gradient half of a split backward (ZB-H1); `W(s, m)` is its weight-gradient half.
/// - `SendF(s, m)` sends stage s's output to stage s+1; `RecvF(s, m)` receives stage s's input from s-1.
/// - `SendB(s, m)` sends the gradient of stage s's input to s-1; `RecvB(s, m)` receives the gradient of
///   stage s's output from s+1.
/// - A forward-only stage (`Layout::forward_only`: the leading `Frozen` stages) has F actions only, and
///   the first stage after them sends no gradient back.
/// Messages on one channel (direction and stage boundary) are matched first-in first-out.
///
/// Storage: a rank's program is a list of `Step`s. A step is one compute, then the receives it posts
/// (those of all later computes up to `post_end`), then the sends of its result. Sends always leave
/// right after the compute that produces them; receives are posted in compute order, as far ahead as
/// the table says. `expand()` gives the explicit action list (F, RB, SF, ...), which is what `mpx::print`
/// shows and the executor walks. The compact form keeps the compile-time proof linear and small.

#include <mpx/config.hpp>  // MPX_VERSION

#include <array>    // std::array
#include <cstdint>  // std::int64_t, std::uint8_t, std::uint16_t, std::uint32_t
#include <span>     // std::span
#include <vector>   // std::vector

namespace mpx
{

/// What an action does.
enum class Op : std::uint8_t { F, B, I, W, SendF, RecvF, SendB, RecvB };

inline constexpr int num_ops = 8;

constexpr bool is_compute(Op op) { return op == Op::F || op == Op::B || op == Op::I || op == Op::W; }
constexpr bool is_send(Op op) { return op == Op::SendF || op == Op::SendB; }
constexpr bool is_recv(Op op) { return op == Op::RecvF || op == Op::RecvB; }

/// The short spelling used by `mpx::print` and by user tables: F B I W SF RF SB RB.
constexpr const char* op_name(Op op)
{
  constexpr const char* names[] = {"F", "B", "I", "W", "SF", "RF", "SB", "RB"};
  return names[static_cast<int>(op)];
}

/// One action of one rank's program.
struct Action
{
  Op op{};
  std::uint16_t stage{};
  std::uint32_t mb{};
  friend constexpr bool operator==(const Action&, const Action&) = default;
};

/// One compute of a rank's program and the receives posted right after it.
struct Step
{
  Op op{};                  ///< F, B, I or W
  std::uint16_t stage{};
  std::uint32_t mb{};
  std::uint32_t post_end{};  ///< after this compute, receives of this rank's computes [.., post_end) are posted
};

/// The cost model of the expected timeline, in time units per (stage, micro-batch):
/// forward 1, full backward 2, split backward 1 + 1 (the zero-bubble paper's F = B = W).
constexpr int cost_of(Op op) { return op == Op::F ? 1 : op == Op::B ? 2 : (op == Op::I || op == Op::W) ? 1 : 0; }

/// The largest pipeline the compile-time tables describe.
inline constexpr int max_stages = 1024;

/// One layer's cost per micro-batch, declared or measured, in any integer unit all layers share (FLOPs,
/// microseconds): its forward and its full backward (balance.hpp).
struct LayerCost
{
  std::int64_t forward = 0, backward = 0;
  friend constexpr bool operator==(const LayerCost&, const LayerCost&) = default;
};

/// Per-stage costs per micro-batch of each kind of compute, in one integer unit: what the proof's timeline
/// uses instead of `cost_of` when it is given them (`mpx::predict`, balance.hpp).
struct StageCosts
{
  std::array<std::int64_t, max_stages> forward{}, backward{}, input{}, weight{};
  /// I and W as halves of B (the zero-bubble paper's I = W), for the first `stages` stages.
  constexpr void split_evenly(int stages)
  {
    for (int s = 0; s < stages; ++s) input[std::size_t(s)] = (backward[std::size_t(s)] + 1) / 2, weight[std::size_t(s)] = backward[std::size_t(s)] / 2;
  }
  constexpr std::int64_t of(Op op, int s) const
  {
    const auto i = std::size_t(s);
    return op == Op::F ? forward[i] : op == Op::B ? backward[i] : op == Op::I ? input[i] : op == Op::W ? weight[i] : 0;
  }
};

/// Where stages live and how many micro-batches one step has: the input of every schedule.
struct Layout
{
  int ranks = 0;         ///< pipeline ranks (slots)
  int stages = 0;        ///< stages, >= ranks (more for interleaved)
  int microbatches = 0;  ///< micro-batches per step
  std::array<std::uint16_t, max_stages> rank_of{};  ///< stage -> rank
  /// Stages [0, forward_only) run forward only: `Frozen`, with no trainable stage before them, they need
  /// no backward, no gradient message and no activations kept (the pipeline's leading frozen stages).
  int forward_only = 0;

  /// The usual placement: stage s on rank s % ranks.
  static constexpr Layout looped(int ranks, int stages, int microbatches)
  {
    Layout l;
    l.ranks = ranks;
    l.stages = stages;
    l.microbatches = microbatches;
    for (int s = 0; s < stages && s < max_stages; ++s) l.rank_of[s] = static_cast<std::uint16_t>(s % ranks);
    return l;
  }
  /// Whether stage s runs a backward (it trains, or gradients flow through it to a stage that does).
  constexpr bool trains(int s) const { return s >= forward_only; }
  constexpr bool receives_forward(Op op, int s) const { return op == Op::F && s > 0; }
  constexpr bool receives_backward(Op op, int s) const { return (op == Op::B || op == Op::I) && s + 1 < stages; }
  constexpr bool receives(Op op, int s) const { return receives_forward(op, s) || receives_backward(op, s); }
  /// Whether a backward of stage s sends its input's gradient back: only to a stage that runs backward.
  constexpr bool sends_backward(Op op, int s) const { return (op == Op::B || op == Op::I) && s > forward_only; }
};

namespace detail
{
/// A heap array usable during constant evaluation. Hot loops index `p` directly: the compiler's constant
/// evaluator pays for every function call, and a proof of 64 ranks x 512 micro-batches runs 65,536 steps.
template <class T>
struct buffer
{
  T* p = nullptr;
  std::size_t n = 0;
  constexpr buffer() = default;
  constexpr explicit buffer(std::size_t size) : p(new T[size == 0 ? 1 : size]()), n(size) {}
  constexpr buffer(buffer&& o) noexcept : p(o.p), n(o.n) { o.p = nullptr; o.n = 0; }
  constexpr buffer& operator=(buffer&& o) noexcept
  {
    if (this != &o) { delete[] p; p = o.p; n = o.n; o.p = nullptr; o.n = 0; }
    return *this;
  }
  buffer(const buffer&) = delete;
  buffer& operator=(const buffer&) = delete;
  constexpr ~buffer() { delete[] p; }
  constexpr std::size_t size() const { return n; }
  constexpr T* data() { return p; }
  constexpr const T* data() const { return p; }
  constexpr T& operator[](std::size_t i) { return p[i]; }
  constexpr const T& operator[](std::size_t i) const { return p[i]; }
};
}  // namespace detail

/// Every rank's program for one step, built (and proved) during constant evaluation.
struct Table
{
  Layout layout;
  detail::buffer<Step> steps;               ///< all ranks' steps, rank after rank
  detail::buffer<std::uint32_t> begin;      ///< rank r's steps are [begin[r], begin[r+1])
  detail::buffer<std::uint32_t> post_begin; ///< receives of rank r's computes [0, post_begin[r]) are posted first
  int malformed_rank = -1;                  ///< a user table whose text does not fit the layout: where
  int malformed_step = -1;

  constexpr Table() = default;
  /// A table of `ranks` ranks with room for `total` steps; `begin` is filled by the builder.
  constexpr Table(const Layout& l, std::size_t total)
      : layout(l), steps(total), begin(std::size_t(l.ranks) + 1), post_begin(std::size_t(l.ranks))
  {
  }
  constexpr int num_ranks() const { return static_cast<int>(begin.size()) - 1; }
  constexpr std::span<const Step> rank(int r) const
  {
    return {steps.p + begin[r], steps.p + begin[r + 1]};
  }
};

/// A `Table` frozen into static storage so that it outlives constant evaluation: what the executor walks.
template <std::size_t N, std::size_t R>
struct FrozenTable
{
  Layout layout;
  std::array<Step, N> steps{};
  std::array<std::uint32_t, R + 1> begin{};
  std::array<std::uint32_t, R> post_begin{};
  int malformed_rank = -1;
  int malformed_step = -1;

  static constexpr int num_ranks() { return static_cast<int>(R); }
  constexpr std::span<const Step> rank(int r) const
  {
    return {steps.data() + begin[r], steps.data() + begin[r + 1]};
  }
};

namespace detail
{
/// Sets where each rank posts its receives: after compute k, those of every compute up to its
/// `lookahead`-th next receiving compute (before the first compute: up to the `lookahead`-th). The rule of
/// every built-in schedule (`to_table`).
constexpr void post_receives(Table& t, int lookahead)
{
  const Layout& l = t.layout;
  const int look = lookahead < 1 ? 1 : lookahead;
  buffer<std::uint32_t> next{std::size_t(look)};  // next[i]: the (i+1)-th receiving compute after k
  for (int r = 0; r < l.ranks; ++r) {
    Step* c = t.steps.p + t.begin.p[r];
    const std::uint32_t n = t.begin.p[r + 1] - t.begin.p[r];
    for (int i = 0; i < look; ++i) next.p[i] = n;
    for (std::uint32_t k = n; k-- > 0;) {
      const std::uint32_t through = next.p[look - 1];
      c[k].post_end = through < n ? through + 1 : n;
      if (l.receives(c[k].op, c[k].stage)) {
        for (int i = look - 1; i > 0; --i) next.p[i] = next.p[i - 1];
        next.p[0] = k;
      }
    }
    const std::uint32_t through = next.p[look - 1];
    t.post_begin.p[r] = through < n ? through + 1 : n;
  }
}
}  // namespace detail

/// The receive a compute waits for, if any (`RecvF` for a forward of a later stage, `RecvB` for a
/// backward of an earlier one).
constexpr bool receive_of(const Layout& l, Op op, int s, Action& out)
{
  if (l.receives_forward(op, s)) { out = {Op::RecvF, std::uint16_t(s), 0}; return true; }
  if (l.receives_backward(op, s)) { out = {Op::RecvB, std::uint16_t(s), 0}; return true; }
  return false;
}

/// The explicit action list of one rank: computes, posted receives and sends, in program order.
template <class AnyTable>
constexpr std::vector<Action> expand(const AnyTable& t, int r)
{
  const Layout& l = t.layout;
  auto steps = t.rank(r);
  std::vector<Action> out;
  std::size_t posted = 0;
  auto post_until = [&](std::size_t end) {
    for (; posted < end && posted < steps.size(); ++posted) {
      const Step& c = steps[posted];
      Action a;
      if (receive_of(l, c.op, c.stage, a)) out.push_back({a.op, c.stage, c.mb});
    }
  };
  post_until(t.post_begin[r]);
  for (const Step& c : steps) {
    out.push_back({c.op, c.stage, c.mb});
    post_until(c.post_end);
    if (c.op == Op::F && c.stage + 1 < l.stages) out.push_back({Op::SendF, c.stage, c.mb});
    if (l.sends_backward(c.op, c.stage)) out.push_back({Op::SendB, c.stage, c.mb});
  }
  return out;
}

namespace detail
{
/// Copies a transient table into a `FrozenTable` of exactly its size.
template <std::size_t N, std::size_t R>
constexpr FrozenTable<N, R> freeze(const Table& t)
{
  FrozenTable<N, R> f;
  f.layout = t.layout;
  for (std::size_t i = 0; i < N; ++i) f.steps[i] = t.steps.p[i];
  for (std::size_t r = 0; r <= R; ++r) f.begin[r] = t.begin[r];
  for (std::size_t r = 0; r < R; ++r) f.post_begin[r] = t.post_begin[r];
  f.malformed_rank = t.malformed_rank;
  f.malformed_step = t.malformed_step;
  return f;
}

}  // namespace detail
}  // namespace mpx
