// EXPECT: fully sharded parameters (3) are not implemented yet
#include "../support/archetypes.hpp"
using namespace archetypes;
#ifdef MPX_FAIL
using S = mpx::Stage<Vision, mpx::GPU<0>, mpx::Sharded<3>>;
#else
using S = mpx::Stage<Vision, mpx::GPU<0>, mpx::Sharded<2>>;
#endif
static_assert(S::sharding >= 1);
