// SPDX-License-Identifier: Apache-2.0
// Tests for examples/moondream/measured_costs.hpp: the encoder's time per FLOP against the decoder's, for a frozen
// and a trained encoder; the scale multiplies the encoder's pieces only; a config it cannot time is named.
#include "../../../tests/support/catch_torch.hpp"
#include "batches.hpp"
#include "../measured_costs.hpp"

TEST_CASE("The encoder's time per FLOP against the decoder's: measured for a frozen and a trained encoder, scaling its pieces only", "[moondream][costs]")
{
  const auto c = moondream::load_config("tiny");
  const auto b = moondream::testing::two_samples(c);
  for (bool trained : {false, true}) {
    CAPTURE(trained);
    double pace = 0;
    const auto scale = moondream::measure_scale(c, b, trained, 2, &pace);
    CHECK(scale.vision_forward > 0.05);
    CHECK(scale.vision_forward < 50);
    CHECK(scale.vision_backward > 0.05);
    CHECK(scale.vision_backward < 50);
    CHECK(pace > 0);
    if (!trained) CHECK(scale.vision_backward == 1.0);  // a frozen encoder runs no backward
  }
  // the run's generator is left as it was: the model's initialisation after it draws the same
  torch::manual_seed(7);
  const auto before = torch::rand({4});
  torch::manual_seed(7);
  moondream::measure_scale(c, b, false, 1);
  CHECK(torch::equal(before, torch::rand({4})));
  // the scale multiplies the encoder's pieces only
  const auto w = moondream::workload_of({b});
  const auto flops = moondream::piece_costs(c, w), scaled = moondream::piece_costs(c, w, {2.0, 3.0});
  CHECK(scaled[0].forward == 2 * flops[0].forward);
  CHECK(scaled[1].backward == std::int64_t(3 * double(flops[1].backward)));
  CHECK(scaled.back().forward == flops.back().forward);
  // a config of one decoder layer cannot be timed this way: named
  auto one = c;
  one.text.n_layers = 1;
  CHECK_THROWS_WITH(moondream::measure_scale(one, b, false), Catch::Contains("use --costs flops"));
}
