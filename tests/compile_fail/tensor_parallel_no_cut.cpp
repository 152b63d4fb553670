// EXPECT: needs a module that says how it is cut
#include "../support/archetypes.hpp"
using namespace archetypes;
struct Plain  // 6 heads, but written without mpx::tp blocks
{
  using input_type = Pair;
  using output_type = Tensor;
  static constexpr int num_heads = 6;
#ifndef MPX_FAIL
  static constexpr bool tp_blocks = true;
#endif
};
using S = mpx::Stage<Plain, mpx::GPU<1>, mpx::TensorParallel<2>>;
static_assert(S::tensor_parallel == 2);
