// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runtime/sampler.hpp (DistributedSampler semantics).
#include "support/catch.hpp"

#include <mpx/runtime/sampler.hpp>

#include <algorithm>
#include <set>

TEST_CASE("Replicas split one epoch-seeded permutation, padded by wrapping", "[sampler]")
{
  for (std::size_t n : {1u, 7u, 10u, 12u})
    for (int replicas : {1, 2, 3, 4}) {
      CAPTURE(n, replicas);
      std::multiset<std::size_t> seen;
      std::vector<std::vector<std::size_t>> parts;
      for (int r = 0; r < replicas; ++r) {
        mpx::DistributedSampler s{n, replicas, r, true, 7};
        auto idx = s.indices(3);
        CHECK(idx.size() == s.per_replica());
        seen.insert(idx.begin(), idx.end());
        parts.push_back(idx);
      }
      for (std::size_t i = 0; i < n; ++i) CHECK(seen.count(i) >= 1);  // every sample is read
      CHECK(seen.size() == parts[0].size() * std::size_t(replicas));
    }
}

TEST_CASE("Shuffles differ by epoch, agree across calls and replicas", "[sampler]")
{
  mpx::DistributedSampler a{100, 2, 0, true, 1}, b{100, 2, 1, true, 1};
  CHECK(a.indices(0) == a.indices(0));
  CHECK(a.indices(0) != a.indices(1));
  auto x = a.indices(5), y = b.indices(5);
  std::vector<std::size_t> both;
  both.insert(both.end(), x.begin(), x.end());
  both.insert(both.end(), y.begin(), y.end());
  std::sort(both.begin(), both.end());
  for (std::size_t i = 0; i < 100; ++i) CHECK(both[i] == i);  // a partition
  mpx::DistributedSampler plain{5, 1, 0, false, 0};
  CHECK(plain.indices(9) == std::vector<std::size_t>{0, 1, 2, 3, 4});
  CHECK_THROWS_AS((mpx::DistributedSampler{0, 1, 0}.indices(0)), mpx::config_error);
}
