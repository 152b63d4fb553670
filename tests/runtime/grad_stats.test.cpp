// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runtime/grad_stats.hpp on a one-rank world: the squared norm, the step's collective, an
// inf found, clipping to the limit, unscaling.
#include "support/rooms.hpp"

TEST_CASE("The step's collective reports loss, norm and inf, clip brings the norm to the limit", "[rooms][grad_stats]")
{
  auto w = test::one_rank_world<rooms::P1>();
  auto a = torch::zeros({2}).requires_grad_(true), b = torch::zeros({1}).requires_grad_(true);
  a.mutable_grad() = torch::tensor({3.0f, 0.0f});
  b.mutable_grad() = torch::tensor({4.0f});
  const mpx::StageParameters stages{{a}, {b}};
  CHECK(mpx::local_grad_sq(stages) == Approx(25.0));
  const auto r = mpx::reduce_step(w, torch::tensor(2.5, torch::kDouble), mpx::local_grad_sq(stages), 0);
  CHECK(r.loss == 2.5);
  CHECK(r.grad_norm == Approx(5.0));
  CHECK(!r.found_inf);
  mpx::clip(stages, r.grad_norm, 1.0);
  CHECK(std::sqrt(mpx::local_grad_sq(stages)) == Approx(1.0).epsilon(1e-5));
  mpx::clip(stages, 1.0, 0.0);  // 0: off
  mpx::unscale(stages, 2.0);
  CHECK(std::sqrt(mpx::local_grad_sq(stages)) == Approx(0.5).epsilon(1e-5));
  b.mutable_grad()[0] = std::numeric_limits<float>::infinity();
  const auto inf = mpx::reduce_step(w, at::Tensor(), mpx::local_grad_sq(stages), 1);
  CHECK(inf.found_inf);
  CHECK(std::isinf(inf.grad_norm));
  CHECK(inf.loss == 0);  // no loss on this rank
}

TEST_CASE("local_grad_sq takes a whole gradient's sum of squares where one was already taken, and reads the rest", "[rooms][grad_stats]")
{
  auto a = torch::zeros({2}).requires_grad_(true), b = torch::zeros({2, 2}).requires_grad_(true);
  a.mutable_grad() = torch::tensor({3.0f, 0.0f});
  b.mutable_grad() = torch::tensor({{1.0f, 2.0f}, {3.0f, 4.0f}});
  // a's sum is given (a value its gradient does not have, so that the test sees which was used); b counted
  // as rows [1, 2) only, a piece: never taken from the given sums, which are of whole gradients
  const mpx::StageNormTerms terms{{mpx::tp::NormTerm(a), mpx::tp::NormTerm(b, 0, 1, 1)}};
  auto given = [&](const at::Tensor& p) { return p.is_same(a) || p.is_same(b) ? std::optional<double>(100.0) : std::nullopt; };
  CHECK(mpx::local_grad_sq(terms, given) == Approx(100.0 + 9 + 16));
  CHECK(mpx::local_grad_sq(terms) == Approx(9.0 + 9 + 16));
  b.mutable_grad().reset();  // no gradient: not counted, not asked
  CHECK(mpx::local_grad_sq(terms, given) == Approx(100.0));
  a.mutable_grad()[0] = std::numeric_limits<float>::quiet_NaN();  // a given sum is trusted as it is
  CHECK(mpx::local_grad_sq(terms, given) == Approx(100.0));
  CHECK(std::isnan(mpx::local_grad_sq(terms)));
}
