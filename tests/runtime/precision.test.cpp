// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runtime/precision.hpp: the autocast guard and the loss scaler's rules.
#include "support/catch_torch.hpp"

#include <mpx/runtime/precision.hpp>

#include <torch/torch.h>

TEST_CASE("AutocastGuard: bf16 matmuls, fp32 master weights and gradients, fp32 regions nest", "[precision][torch]")
{
  torch::manual_seed(0);
  torch::nn::Linear fc(16, 8);
  auto x = torch::randn({4, 16});
  at::Tensor y, z;
  {
    mpx::AutocastGuard on(c10::DeviceType::CPU, true, at::kBFloat16);
    y = fc(x);
    {
      mpx::AutocastGuard off(c10::DeviceType::CPU, false);
      z = fc(x);
    }
  }
  CHECK(y.scalar_type() == at::kBFloat16);
  CHECK(z.scalar_type() == at::kFloat);
  CHECK(fc(x).scalar_type() == at::kFloat);  // restored after the region
  y.to(torch::kFloat).sum().backward();
  CHECK(fc->weight.grad().scalar_type() == at::kFloat);
  CHECK(torch::allclose(y.to(torch::kFloat), z, 5e-2, 5e-2));
}

TEST_CASE("LossScaler backs off on inf, grows after its interval, counts skipped steps", "[precision]")
{
  mpx::LossScaler s({.enabled = true, .interval = 3});
  CHECK(s.scale() == 65536);
  CHECK(!s.update(false));
  CHECK(!s.update(false));
  CHECK(!s.update(false));
  CHECK(s.scale() == 131072);  // grew after 3 good steps
  CHECK(s.update(true));       // skip
  CHECK(s.scale() == 65536);
  CHECK(s.skipped() == 1);
  mpx::LossScaler off;
  CHECK(off.scale() == 1);
  CHECK(off.update(true));  // without scaling, an inf still skips the step on every rank
}
