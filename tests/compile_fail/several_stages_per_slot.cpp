// EXPECT: a slot holds several stages but the schedule runs one stage per slot
#include "../support/archetypes.hpp"
using namespace archetypes;
#ifdef MPX_FAIL
using Sched = mpx::Schedule<mpx::OneFOneB>;
#else
using Sched = mpx::Schedule<mpx::Interleaved1F1B>;
#endif
using P = mpx::Pipeline<mpx::Stage<Block, mpx::CPU<0>>, mpx::Stage<Block, mpx::CPU<1>>, mpx::Stage<Block, mpx::CPU<0>>,
                        mpx::Stage<Block, mpx::CPU<1>>, Sched, mpx::Microbatches<4>>;
static_assert(P::num_stages == 4);
