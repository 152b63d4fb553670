// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/tp/cut.hpp in one process: shards of a fused cut and their join, the whole size of a shard,
// which ranges of a shared cut each rank counts, and a group of one cuts nothing.
#include "support/catch_torch.hpp"

#include <mpx/tp.hpp>

TEST_CASE("A fused cut's shards join back, and a shared part counts once, on its first holder", "[rooms][cut]")
{
  const auto full = torch::arange(24 * 3, torch::kFloat).view({24, 3});  // a fused q|k|v of 8 rows each
  const mpx::tp::Cut qkv{"weight", 0, {8, 8, 8}};
  std::vector<at::Tensor> shards;
  for (int r = 0; r < 4; ++r) shards.push_back(mpx::tp::shard(full, qkv, r, 4));
  CHECK(torch::equal(shards[1].narrow(0, 0, 2), full.narrow(0, 2, 2)));  // rank 1's share of q
  CHECK(torch::equal(shards[1].narrow(0, 2, 2), full.narrow(0, 10, 2)));  // and of k
  CHECK(torch::equal(mpx::tp::join(shards, qkv), full));
  CHECK(mpx::tp::whole_size(6, qkv, 4) == 24);
  CHECK(mpx::tp::whole_size(6, mpx::tp::Cut{"weight", 0, {}}, 4) == 24);
  // grouped-query attention: 4 query heads of 2 rows reading 1 key/value head, shared by every rank
  const mpx::tp::Cut gqa4{"weight", 0, {8, 2, 2}, {1, 4, 4}};
  CHECK(gqa4.shared());
  CHECK(!qkv.shared());
  CHECK(mpx::tp::counted_ranges(gqa4, 6, 0, 4) == std::vector<std::pair<int64_t, int64_t>>{{0, 6}});  // rank 0 counts its q, k, v
  CHECK(mpx::tp::counted_ranges(gqa4, 6, 2, 4) == std::vector<std::pair<int64_t, int64_t>>{{0, 2}});  // rank 2: its q rows only
  // a group of one cuts nothing: every parameter is replicated, counted whole on its one rank
  mpx::tp::ColumnLinear lin(4, 6);
  CHECK(mpx::tp::cut_parameters(*lin).empty());
  CHECK(mpx::tp::cut_of(mpx::tp::cut_parameters(*lin), "weight") == nullptr);
  CHECK(mpx::tp::norm_terms(*lin).size() == 2);
  CHECK(!mpx::tp::has_shared_cut(*lin));
}
