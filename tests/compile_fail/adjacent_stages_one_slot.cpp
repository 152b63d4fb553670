// EXPECT: two adjacent stages sit on one slot
#include "../support/archetypes.hpp"
using namespace archetypes;
#ifdef MPX_FAIL
using P = mpx::Pipeline<mpx::Stage<Vision, mpx::GPU<0>>, mpx::Stage<Text, mpx::GPU<0>>>;
#else
using P = mpx::Pipeline<mpx::Stage<Vision, mpx::GPU<0>>, mpx::Stage<Text, mpx::GPU<1>>>;
#endif
static_assert(P::num_stages == 2);
