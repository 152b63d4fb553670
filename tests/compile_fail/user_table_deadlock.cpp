// EXPECT: the schedule table deadlocks under blocking sends
#include "../support/archetypes.hpp"
using namespace archetypes;
// Rank 0 waits for B0's gradient before F1; rank 1 runs F1 (which needs rank 0's F1) before B0.
#ifdef MPX_FAIL
using T = mpx::UserTable<"F0 B0 F1 B1 ; F0 F1 B0 B1">;
#else
using T = mpx::UserTable<"F0 F1 B0 B1 ; F0 B0 F1 B1">;
#endif
using P = mpx::Pipeline<mpx::Stage<Block, mpx::CPU<0>>, mpx::Stage<Block, mpx::CPU<1>>, mpx::Schedule<T>, mpx::Microbatches<2>>;
static_assert(P::num_stages == 2);
