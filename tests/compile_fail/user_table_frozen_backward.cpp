// EXPECT: gives a backward (B, I or W) to a forward-only stage
#include "../support/archetypes.hpp"
using namespace archetypes;
#ifdef MPX_FAIL
using T = mpx::UserTable<"F0 F1 B0 B1 ; F0 B0 F1 B1">;  // stage 0 is Frozen with nothing before it: forward only
#else
using T = mpx::UserTable<"F0 F1 ; F0 B0 F1 B1">;
#endif
using P = mpx::Pipeline<mpx::Stage<Block, mpx::CPU<0>, mpx::Frozen>, mpx::Stage<Block, mpx::CPU<1>>, mpx::Schedule<T>, mpx::Microbatches<2>>;
static_assert(P::num_stages == 2);
