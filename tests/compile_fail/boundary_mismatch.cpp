// EXPECT: the output type of a stage is not accepted by the next stage's input
#include "../support/archetypes.hpp"
using namespace archetypes;
#ifdef MPX_FAIL
using P = mpx::Pipeline<mpx::Stage<Block, mpx::CPU<0>>, mpx::Stage<Text, mpx::CPU<1>>>;  // Tensor -> Pair
#else
using P = mpx::Pipeline<mpx::Stage<Vision, mpx::CPU<0>>, mpx::Stage<Text, mpx::CPU<1>>>;  // Pair -> Pair
#endif
static_assert(P::num_stages == 2);
