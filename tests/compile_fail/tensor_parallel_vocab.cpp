// EXPECT: must divide the module's vocab_size
#include "../support/archetypes.hpp"
using namespace archetypes;
struct Lm  // GPT-2's vocabulary: 50257 = 29 x 1733, odd
{
  using input_type = Pair;
  using output_type = Tensor;
  static constexpr int num_heads = 4;
#ifdef MPX_FAIL
  static constexpr long vocab_size = 50257;
#else
  static constexpr long vocab_size = 50304;  // padded to a multiple of 64
#endif
  static constexpr bool tp_blocks = true;
};
using S = mpx::Stage<Lm, mpx::GPU<1>, mpx::TensorParallel<2>>;
static_assert(S::tensor_parallel == 2);
