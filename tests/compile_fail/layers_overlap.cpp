// EXPECT: ranges of one module must tile its layers exactly once
#include "../support/archetypes.hpp"
using namespace archetypes;
#ifdef MPX_FAIL
using P = mpx::Pipeline<mpx::Stage<Vision, mpx::CPU<0>>, mpx::Stage<Text, mpx::CPU<1>, mpx::Layers<0, 5>>,
                        mpx::Stage<Text, mpx::CPU<2>, mpx::Layers<4, mpx::to_end>>>;
#else
using P = mpx::Pipeline<mpx::Stage<Vision, mpx::CPU<0>>, mpx::Stage<Text, mpx::CPU<1>, mpx::Layers<0, 5>>,
                        mpx::Stage<Text, mpx::CPU<2>, mpx::Layers<5, mpx::to_end>>>;
#endif
static_assert(P::num_stages == 3);
