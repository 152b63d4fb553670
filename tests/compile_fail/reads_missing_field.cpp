// EXPECT: a stage Reads a batch field that the pipeline's mpx::Batch<B> does not have
#include "../support/archetypes.hpp"
using namespace archetypes;
#ifdef MPX_FAIL
using Reads = mpx::Reads<"label">;
#else
using Reads = mpx::Reads<"labels">;
#endif
using P = mpx::Pipeline<mpx::Stage<Vision, mpx::CPU<0>>, mpx::Stage<Text, mpx::CPU<1>, Reads>, mpx::Batch<archetypes::Batch>>;
static_assert(P::num_stages == 2);
