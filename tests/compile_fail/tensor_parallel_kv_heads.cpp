// EXPECT: must divide the module's num_kv_heads
#include "../support/archetypes.hpp"
using namespace archetypes;
struct Gqa  // 8 query heads reading 2 key/value heads
{
  using input_type = Pair;
  using output_type = Tensor;
  static constexpr int num_heads = 8;
  static constexpr int num_kv_heads = 2;
  static constexpr bool tp_blocks = true;
};
#ifdef MPX_FAIL
using S = mpx::Stage<Gqa, mpx::GPU<1>, mpx::TensorParallel<4>>;
#else
using S = mpx::Stage<Gqa, mpx::GPU<1>, mpx::TensorParallel<2>>;
#endif
static_assert(S::tensor_parallel > 1);
