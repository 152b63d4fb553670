// EXPECT: L must be 1 (optimizer state), 2 (and gradients) or 3 (and parameters)
#include "../support/archetypes.hpp"
using namespace archetypes;
#ifdef MPX_FAIL
using S = mpx::Stage<Vision, mpx::GPU<0>, mpx::Sharded<4>>;
#else
using S = mpx::Stage<Vision, mpx::GPU<0>, mpx::Sharded<3>>;
#endif
static_assert(S::sharding >= 1);
