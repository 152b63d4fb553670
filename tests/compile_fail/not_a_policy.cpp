// EXPECT: each policy must be one of mpx::Frozen
#include "../support/archetypes.hpp"
using namespace archetypes;
#ifdef MPX_FAIL
using S = mpx::Stage<Block, mpx::CPU<0>, mpx::AdamW>;
#else
using S = mpx::Stage<Block, mpx::CPU<0>, mpx::Optimizer<mpx::AdamW>>;
#endif
static_assert(S::slot == 0);
