// EXPECT: a Frozen stage has no gradients and no optimizer state to shard
#include "../support/archetypes.hpp"
using namespace archetypes;
#ifdef MPX_FAIL
using S = mpx::Stage<Vision, mpx::GPU<0>, mpx::Frozen, mpx::Sharded<1>>;
#else
using S = mpx::Stage<Vision, mpx::GPU<0>, mpx::Sharded<1>>;
#endif
static_assert(S::sharding == (S::frozen ? 0 : 1));
