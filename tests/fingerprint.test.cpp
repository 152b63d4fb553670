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

TEST_CASE("A checkpoint's fingerprint leaves out the stages' ZeRO levels: how replicas hold the state, not what it is", "[fingerprint][static]")
{
  using A = Pipeline<Stage<Vision, CPU<0>, Checkpointed>, Stage<Text, CPU<1>>, Microbatches<4>>;
  using Z1 = Pipeline<Stage<Vision, CPU<0>, Sharded<1>, Checkpointed>, Stage<Text, CPU<1>>, Microbatches<4>>;
  using Z2 = Pipeline<Stage<Vision, CPU<0>, Checkpointed, Sharded<2>>, Stage<Text, CPU<1>, Sharded<2>>, Microbatches<4>>;
  using F = Pipeline<Stage<Vision, CPU<0>, Frozen>, Stage<Text, CPU<1>, Sharded<2>>, Microbatches<4>>;
  STATIC_REQUIRE(model_fingerprint_v<A> == fingerprint_v<A>);  // nothing sharded: the same as before
  STATIC_REQUIRE(model_fingerprint_v<Z1> == model_fingerprint_v<A>);
  STATIC_REQUIRE(model_fingerprint_v<Z2> == model_fingerprint_v<A>);
  STATIC_REQUIRE(model_fingerprint_v<F> != model_fingerprint_v<A>);  // another model stays another
  STATIC_REQUIRE(fingerprint_v<Z1> != fingerprint_v<A>);            // ranks of one run still agree on everything
  STATIC_REQUIRE(fingerprint_v<Z1> != fingerprint_v<Z2>);
}
