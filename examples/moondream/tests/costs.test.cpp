// SPDX-License-Identifier: Apache-2.0
// Tests for examples/moondream/costs.hpp: the pieces' costs from the config, and the layouts' partitions — layouts
// 2 and 4 as moondream_train always partition them, 2b and 4b balanced (never predicted slower, and faster where
// the encoder and the decoder are unequal).
#include "../../../tests/support/catch_torch.hpp"
#include "../costs.hpp"

namespace
{
const moondream::Workload shapes{4, 2, 20, 3};  // 4 samples of 2 crops and 20 tokens (3 answer tokens)

moondream::Plan plan(const char* config, const char* layout, bool frozen, const char* schedule = "1f1b")
{
  const auto c = moondream::load_config(config);
  return moondream::plan_of(layout, schedule, c, shapes, 4, frozen);
}
}  // namespace

TEST_CASE("The pieces' costs: md2's frozen encoder forward against the decoder's forward and backward, as the seed says (about 3 : 7)", "[moondream][costs]")
{
  const auto c = moondream::load_config("md2");
  const auto pieces = moondream::piece_costs(c, {1, 2, 200, 20});  // one sample: 2 crops, 200 tokens
  REQUIRE(pieces.size() == std::size_t(c.vision.enc_n_layers + c.text.n_layers));
  double vision = 0, text = 0;
  for (int i = 0; i < c.vision.enc_n_layers; ++i) vision += double(pieces[std::size_t(i)].forward);
  for (std::size_t i = std::size_t(c.vision.enc_n_layers); i < pieces.size(); ++i) text += double(pieces[i].forward + pieces[i].backward);
  CAPTURE(vision / 1e12, text / 1e12);
  CHECK(vision / 1e12 == Approx(1.33).epsilon(0.1));  // ~1.3 TFLOP per sample of 2 crops
  CHECK(text / 1e12 == Approx(7.3).epsilon(0.1));     // ~7.3 TFLOP forward + backward
}

TEST_CASE("Layouts 2 and 4 partitioned as moondream_train always did: vision alone, text in equal ranges", "[moondream][costs]")
{
  const auto p4 = plan("md2", "4", true);
  CHECK(p4.vision_alone());
  CHECK(p4.frozen_slots == 1);
  CHECK(p4.text_range(1) == std::pair{0, 8});
  CHECK(p4.text_range(2) == std::pair{8, 16});
  CHECK(p4.text_range(3) == std::pair{16, 24});
  const auto p2 = plan("medium", "2", false);
  CHECK(p2.vision_alone());
  CHECK(p2.frozen_slots == 0);
  CHECK(p2.text_range(1) == std::pair{0, 6});
}

TEST_CASE("Balanced layouts give md2's first device text layers beside the frozen encoder, and split medium's heavy encoder over two", "[moondream][costs]")
{
  for (const char* schedule : {"gpipe", "1f1b", "zbh1"}) {
    CAPTURE(schedule);
    for (const char* config : {"tiny", "medium", "md2"}) {
      CAPTURE(config);
      for (auto [naive, balanced] : {std::pair{"2", "2b"}, std::pair{"4", "4b"}}) {
        const auto n = plan(config, naive, true, schedule), b = plan(config, balanced, true, schedule);
        CAPTURE(balanced, b.part[1], b.part[2]);
        CHECK(b.predicted.makespan <= n.predicted.makespan);
      }
    }
  }
  const auto md2 = plan("md2", "2b", true);
  CHECK(md2.text_range(0).second > 0);  // vision + text [0, k)
  CHECK(md2.frozen_slots == 0);         // so the first stage trains
  const auto md2_4 = plan("md2", "4b", true);
  CHECK(md2_4.predicted.makespan < plan("md2", "4", true).predicted.makespan * 95 / 100);
  const auto medium = plan("medium", "4b", true);  // the encoder is ~47% of medium's work
  CHECK(medium.part[1] < medium.vision_blocks);
  CHECK(medium.frozen_slots >= 1);
  CHECK(medium.predicted.makespan < plan("medium", "4", true).predicted.makespan * 80 / 100);
}
