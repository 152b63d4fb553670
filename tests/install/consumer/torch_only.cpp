// SPDX-License-Identifier: Apache-2.0
// The downstream project's own LibTorch program, beside its use of mpx (find_package(Torch) before
// add_subdirectory(mpx)).
#include <torch/torch.h>

#include <iostream>

int main()
{
  const auto x = torch::ones({2, 2});
  std::cout << "torch consumer ok: " << x.sum().item<float>() << "\n";
}
