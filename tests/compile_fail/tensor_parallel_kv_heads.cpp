// EXPECT: must divide the module's num_kv_heads or be a multiple of it
#include "../support/archetypes.hpp"
using namespace archetypes;
struct Gqa  // 12 query heads reading 3 key/value heads
{
  using input_type = Pair;
  using output_type = Tensor;
  static constexpr int num_heads = 12;
  static constexpr int num_kv_heads = 3;
  static constexpr bool tp_blocks = true;
};
#ifdef MPX_FAIL
using S = mpx::Stage<Gqa, mpx::GPU<1>, mpx::TensorParallel<4>>;  // 4 neither divides 3 nor is a multiple of it
#else
using S = mpx::Stage<Gqa, mpx::GPU<1>, mpx::TensorParallel<6>>;  // 6 ranks: each key/value head on 2 of them
#endif
static_assert(S::tensor_parallel > 1);
