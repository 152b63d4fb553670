// EXPECT: must divide the module's num_heads
#include "../support/archetypes.hpp"
using namespace archetypes;
// Text has 6 heads
#ifdef MPX_FAIL
using S = mpx::Stage<Text, mpx::GPU<1>, mpx::TensorParallel<4>>;
#else
using S = mpx::Stage<Text, mpx::GPU<1>, mpx::TensorParallel<3>>;
#endif
static_assert(S::tensor_parallel > 1);
