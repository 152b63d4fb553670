// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/torch/blas.hpp: LibTorch must not run on the reference BLAS (about 40x slower).
#include "support/catch_torch.hpp"

#include <mpx/torch/blas.hpp>

#include <torch/torch.h>

TEST_CASE("LibTorch runs on an optimised BLAS, not the reference one", "[torch][blas]")
{
  const auto a = torch::randn({64, 64});
  const auto c = torch::mm(a, a);  // make sure the BLAS is loaded and used
  CHECK(c.size(0) == 64);
  const std::string lib = mpx::blas_library();
  INFO("BLAS library mapped: " << lib);
  // a shared BLAS (Debian's LibTorch), or one linked into LibTorch itself (the CUDA wheels carry MKL)
  REQUIRE((!lib.empty() || at::hasMKL()));
  REQUIRE_FALSE(mpx::blas_is_reference());
  REQUIRE_NOTHROW(mpx::check_blas());
}
