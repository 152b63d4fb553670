// EXPECT: Precision<mpx::FP16> needs a GPU device
#include "../support/archetypes.hpp"
using namespace archetypes;
#ifdef MPX_FAIL
using S = mpx::Stage<Text, mpx::CPU<0>, mpx::Precision<mpx::FP16>>;
#else
using S = mpx::Stage<Text, mpx::CPU<0>, mpx::Precision<mpx::BF16>>;
#endif
static_assert(S::slot == 0);
