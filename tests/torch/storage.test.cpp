// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/torch/storage.hpp: a storage's memory given back and taken again under live views.
#include "support/catch_torch.hpp"

#include <mpx/torch/storage.hpp>

#include <torch/torch.h>

TEST_CASE("A storage's memory goes and comes back under views that keep their shapes and offsets, and see what is written after", "[torch][storage]")
{
  auto flat = torch::arange(0, 1 << 20, torch::kFloat);  // 4 MiB
  auto view = flat.narrow(0, 100, 6).view({2, 3});
  const auto saved = view.t();  // what a forward might keep for its backward
  mpx::detail::free_storage(flat);
  CHECK(flat.storage().nbytes() == 0);
  CHECK(view.sizes() == at::IntArrayRef{2, 3});
  CHECK(saved.storage().nbytes() == 0);  // one storage: the view's memory went too
  CHECK(flat.storage().data() == nullptr);
  mpx::detail::refill_storage(flat, std::size_t(flat.numel()) * sizeof(float));
  flat.copy_(torch::arange(0, 1 << 20, torch::kFloat) * 2);
  CHECK(torch::equal(view, torch::arange(200, 212, 2, torch::kFloat).view({2, 3})));
  CHECK(torch::equal(saved, view.t()));
  mpx::detail::refill_storage(flat, std::size_t(flat.numel()) * sizeof(float));  // as long already: the values stay
  CHECK(view[0][0].item<float>() == 200.f);
}
