// EXPECT: the schedule table leaves a micro-batch unfinished
#include "../support/archetypes.hpp"
using namespace archetypes;
#ifdef MPX_FAIL
using T = mpx::UserTable<"F0 B0 ; F0 B0">;
#else
using T = mpx::UserTable<"F0 B0 F1 B1 ; F0 B0 F1 B1">;
#endif
using P = mpx::Pipeline<mpx::Stage<Block, mpx::CPU<0>>, mpx::Stage<Block, mpx::CPU<1>>, mpx::Schedule<T>, mpx::Microbatches<2>>;
static_assert(P::num_stages == 2);
