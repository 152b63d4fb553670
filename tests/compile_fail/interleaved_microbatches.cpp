// EXPECT: Interleaved1F1B needs Microbatches to be a multiple of the slots
#include "../support/archetypes.hpp"
using namespace archetypes;
template <int M>
using P = mpx::Pipeline<mpx::Stage<Block, mpx::CPU<0>>, mpx::Stage<Block, mpx::CPU<1>>, mpx::Stage<Block, mpx::CPU<0>>,
                        mpx::Stage<Block, mpx::CPU<1>>, mpx::Schedule<mpx::Interleaved1F1B>, mpx::Microbatches<M>>;
#ifdef MPX_FAIL
static_assert(P<3>::num_stages == 4);
#else
static_assert(P<4>::num_stages == 4);
#endif
