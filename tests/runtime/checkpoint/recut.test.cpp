// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runtime/checkpoint/recut.hpp: a tensor cut at one tensor-parallel degree is re-cut for another,
// fused parts and shared key/value heads included.
#include "support/catch_torch.hpp"

#include <mpx/mpx.hpp>

TEST_CASE("A tensor cut at one tensor-parallel degree is re-cut for another, fused parts included", "[rooms][recut]")
{
  const auto full = torch::arange(24 * 3, torch::kFloat).view({24, 3});  // a fused q|k|v of 8 rows each
  const mpx::tp::Cut qkv{"weight", 0, {8, 8, 8}};
  auto cut = [&](int n) {
    std::vector<at::Tensor> out;
    for (int r = 0; r < n; ++r) out.push_back(mpx::tp::shard(full, qkv, r, n));
    return out;
  };
  CHECK(torch::equal(cut(2)[1].narrow(0, 0, 4), full.narrow(0, 4, 4)));  // rank 1's share of q
  CHECK(torch::equal(mpx::tp::join(cut(2), qkv), full));
  CHECK(torch::equal(mpx::detail::recut(cut(2), &qkv, nullptr, 0, 1), full));         // 2 -> 1
  CHECK(torch::equal(mpx::detail::recut({full}, nullptr, &qkv, 3, 4), cut(4)[3]));     // 1 -> 4
  CHECK(torch::equal(mpx::detail::recut(cut(4), &qkv, &qkv, 1, 2), cut(2)[1]));        // 4 -> 2
  CHECK(torch::equal(mpx::detail::recut({torch::tensor(7L), torch::tensor(7L)}, &qkv, &qkv, 0, 2), torch::tensor(7L)));  // a step count
  // grouped-query attention: 4 query heads of 2 rows reading 1 key/value head, shared by every rank
  const auto gqa_full = torch::arange(12 * 3, torch::kFloat).view({12, 3});
  const mpx::tp::Cut gqa2{"weight", 0, {8, 2, 2}, {1, 2, 2}}, gqa4{"weight", 0, {8, 2, 2}, {1, 4, 4}};
  auto gqa_cut = [&](const mpx::tp::Cut& s, int n) {
    std::vector<at::Tensor> out;
    for (int r = 0; r < n; ++r) out.push_back(mpx::tp::shard(gqa_full, s, r, n));
    return out;
  };
  CHECK(torch::equal(gqa_cut(gqa4, 4)[3].narrow(0, 2, 2), gqa_full.narrow(0, 8, 2)));  // every rank holds the k head
  CHECK(torch::equal(mpx::tp::join(gqa_cut(gqa2, 2), gqa2), gqa_full));
  CHECK(torch::equal(mpx::detail::recut(gqa_cut(gqa2, 2), &gqa2, &gqa4, 1, 4), gqa_cut(gqa4, 4)[1]));  // 2 -> 4
  CHECK(torch::equal(mpx::detail::recut(gqa_cut(gqa4, 4), &gqa4, nullptr, 0, 1), gqa_full));           // 4 -> 1
}
