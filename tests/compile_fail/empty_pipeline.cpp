// EXPECT: a pipeline needs at least one mpx::Stage
#include "../support/archetypes.hpp"
using namespace archetypes;
#ifdef MPX_FAIL
using P = mpx::Pipeline<mpx::Microbatches<2>>;
#else
using P = mpx::Pipeline<mpx::Stage<Block, mpx::CPU<0>>, mpx::Microbatches<2>>;
#endif
static_assert(P::num_stages == 1);
