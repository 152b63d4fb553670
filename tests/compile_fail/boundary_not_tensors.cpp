// EXPECT: a stage boundary must be a tensor or a Boost.Hana struct of tensors
#include "../support/archetypes.hpp"
using namespace archetypes;
struct Producer { NotATensor forward(Tensor); };
struct Consumer { Tensor forward(NotATensor); };
struct Producer2 { Tensor forward(Tensor); };
struct Consumer2 { Tensor forward(Tensor); };
#ifdef MPX_FAIL
using P = mpx::Pipeline<mpx::Stage<Producer, mpx::CPU<0>>, mpx::Stage<Consumer, mpx::CPU<1>>>;
#else
using P = mpx::Pipeline<mpx::Stage<Producer2, mpx::CPU<0>>, mpx::Stage<Consumer2, mpx::CPU<1>>>;
#endif
static_assert(P::num_stages == 2);
