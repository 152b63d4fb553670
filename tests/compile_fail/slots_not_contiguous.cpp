// EXPECT: device slots must be contiguous from 0
#include "../support/archetypes.hpp"
using namespace archetypes;
#ifdef MPX_FAIL
using P = mpx::Pipeline<mpx::Stage<Block, mpx::GPU<0>>, mpx::Stage<Block, mpx::GPU<2>>>;
#else
using P = mpx::Pipeline<mpx::Stage<Block, mpx::GPU<0>>, mpx::Stage<Block, mpx::GPU<1>>>;
#endif
static_assert(P::num_stages == 2);
