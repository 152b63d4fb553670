// EXPECT: sends and receives between two stages do not match in order
#include "../support/archetypes.hpp"
using namespace archetypes;
#ifdef MPX_FAIL
using T = mpx::UserTable<"F0 F1 B0 B1 ; F1 B1 F0 B0">;
#else
using T = mpx::UserTable<"F1 F0 B1 B0 ; F1 B1 F0 B0">;
#endif
using P = mpx::Pipeline<mpx::Stage<Block, mpx::CPU<0>>, mpx::Stage<Block, mpx::CPU<1>>, mpx::Schedule<T>, mpx::Microbatches<2>>;
static_assert(P::num_stages == 2);
