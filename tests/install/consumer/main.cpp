// SPDX-License-Identifier: Apache-2.0
// A downstream program: declares a pipeline, checks it at compile time, prints it.
#include <mpx/core.hpp>

#include <iostream>

struct Tensor {};
template <> struct mpx::tensor_traits<Tensor> { static constexpr bool is_tensor = true; };
struct Block { Tensor forward(Tensor); };

using P = mpx::Pipeline<mpx::Stage<Block, mpx::CPU<0>>, mpx::Stage<Block, mpx::CPU<1>>, mpx::Microbatches<4>>;
static_assert(mpx::proof_v<P>.ok());

int main()
{
  std::cout << mpx::print<P>;
  std::cout << "consumer ok\n";
}
