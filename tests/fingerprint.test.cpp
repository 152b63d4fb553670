// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/fingerprint.hpp.
#include "support/archetypes.hpp"
#include "support/catch.hpp"

using namespace mpx;
using namespace archetypes;

TEST_CASE("Fingerprints differ when anything that ranks must agree on differs", "[fingerprint][static]")
{
  using A = Pipeline<Stage<Vision, CPU<0>>, Stage<Text, CPU<1>>>;
  using A2 = Pipeline<Stage<Vision, CPU<0>>, Stage<Text, CPU<1>>>;
  using M = Pipeline<Stage<Vision, CPU<0>>, Stage<Text, CPU<1>>, Microbatches<4>>;
  using S = Pipeline<Stage<Vision, CPU<0>>, Stage<Text, CPU<1>>, Schedule<GPipe>>;
  using F = Pipeline<Stage<Vision, CPU<0>, Frozen>, Stage<Text, CPU<1>>>;
  using D = Pipeline<Stage<Vision, GPU<0>>, Stage<Text, GPU<1>>>;
  STATIC_REQUIRE(fingerprint_v<A> == fingerprint_v<A2>);
  STATIC_REQUIRE(fingerprint_v<A> != fingerprint_v<M>);
  STATIC_REQUIRE(fingerprint_v<A> != fingerprint_v<S>);
  STATIC_REQUIRE(fingerprint_v<A> != fingerprint_v<F>);
  STATIC_REQUIRE(fingerprint_v<A> != fingerprint_v<D>);
  STATIC_REQUIRE(fingerprint_v<M> != fingerprint_v<S>);
}
