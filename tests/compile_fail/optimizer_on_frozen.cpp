// EXPECT: a Frozen stage has no gradients and takes no mpx::Optimizer
#include "../support/archetypes.hpp"
using namespace archetypes;
#ifdef MPX_FAIL
using S = mpx::Stage<Vision, mpx::GPU<0>, mpx::Frozen, mpx::Optimizer<mpx::AdamW>>;
#else
using S = mpx::Stage<Vision, mpx::GPU<0>, mpx::Frozen>;
#endif
static_assert(S::frozen);
