// EXPECT: Module must be a stage module
#include "../support/archetypes.hpp"
using namespace archetypes;
#ifdef MPX_FAIL
using S = mpx::Stage<NotAModule, mpx::CPU<0>>;
#else
using S = mpx::Stage<Block, mpx::CPU<0>>;
#endif
static_assert(S::slot == 0);
