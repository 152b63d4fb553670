// EXPECT: a stage takes at most one mpx::Optimizer
#include "../support/archetypes.hpp"
using namespace archetypes;
#ifdef MPX_FAIL
using S = mpx::Stage<Text, mpx::GPU<1>, mpx::Optimizer<mpx::AdamW>, mpx::Optimizer<mpx::SGD>>;
#else
using S = mpx::Stage<Text, mpx::GPU<1>, mpx::Optimizer<mpx::AdamW>>;
#endif
static_assert(S::slot == 1);
