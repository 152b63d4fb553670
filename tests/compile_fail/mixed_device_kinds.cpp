// EXPECT: one slot holds both GPU and CPU stages
#include "../support/archetypes.hpp"
using namespace archetypes;
#ifdef MPX_FAIL
using P = mpx::Pipeline<mpx::Stage<Block, mpx::GPU<0>>, mpx::Stage<Block, mpx::GPU<1>>, mpx::Stage<Block, mpx::CPU<0>>,
                        mpx::Stage<Block, mpx::GPU<1>>, mpx::Schedule<mpx::Interleaved1F1B>, mpx::Microbatches<2>>;
#else
using P = mpx::Pipeline<mpx::Stage<Block, mpx::GPU<0>>, mpx::Stage<Block, mpx::GPU<1>>, mpx::Stage<Block, mpx::GPU<0>>,
                        mpx::Stage<Block, mpx::GPU<1>>, mpx::Schedule<mpx::Interleaved1F1B>, mpx::Microbatches<2>>;
#endif
static_assert(P::num_stages == 4);
