// EXPECT: must divide the module's ffn_width
#include "../support/archetypes.hpp"
using namespace archetypes;
struct Mlp  // 4 heads, an MLP 6 wide
{
  using input_type = Pair;
  using output_type = Tensor;
  static constexpr int num_heads = 4;
  static constexpr long ffn_width = 6;
  static constexpr bool tp_blocks = true;
};
#ifdef MPX_FAIL
using S = mpx::Stage<Mlp, mpx::GPU<1>, mpx::TensorParallel<4>>;
#else
using S = mpx::Stage<Mlp, mpx::GPU<1>, mpx::TensorParallel<2>>;
#endif
static_assert(S::tensor_parallel > 1);
