// EXPECT: Device must be a device tag such as mpx::GPU<0>
#include "../support/archetypes.hpp"
using namespace archetypes;
#ifdef MPX_FAIL
using S = mpx::Stage<Vision, int>;
#else
using S = mpx::Stage<Vision, mpx::GPU<0>>;
#endif
static_assert(S::slot >= 0);
