// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/balance.hpp: the proof under declared costs, the balancer against every possible partition, ranges
// computed at compile time feeding Layers<b, e>, and print's per-slot load.
#include "support/archetypes.hpp"
#include "support/catch.hpp"

#include <mpx/balance.hpp>
#include <mpx/print.hpp>

#include <sstream>

using namespace mpx;

namespace
{
/// The shortest predicted step over every partition of `layers` into `slots` non-empty ranges (brute force).
template <class Tag>
constexpr std::int64_t best_step(std::span<const LayerCost> layers, int slots, int m, int frozen = 0, std::span<const double> speeds = {})
{
  const int L = int(layers.size());
  std::int64_t best = -1;
  Partition c{};
  c[std::size_t(slots)] = L;
  // odometer over the interior edges 0 < c[1] < ... < c[slots-1] < L
  for (int k = 1; k < slots; ++k) c[std::size_t(k)] = k;
  while (true) {
    const std::int64_t t = predict_partition<Tag>(layers, c, slots, m, frozen, speeds).makespan;
    if (best < 0 || t < best) best = t;
    int k = slots - 1;
    while (k >= 1 && c[std::size_t(k)] == L - (slots - k)) --k;
    if (k < 1) break;
    ++c[std::size_t(k)];
    for (int j = k + 1; j < slots; ++j) c[std::size_t(j)] = c[std::size_t(j) - 1] + 1;
  }
  return best;
}

template <class Tag>
constexpr std::int64_t step_of(std::span<const LayerCost> layers, const Partition& c, int slots, int m, int frozen = 0,
                               std::span<const double> speeds = {})
{
  return predict_partition<Tag>(layers, c, slots, m, frozen, speeds).makespan;
}

constexpr std::array<LayerCost, 8> uniform{{{1, 2}, {1, 2}, {1, 2}, {1, 2}, {1, 2}, {1, 2}, {1, 2}, {1, 2}}};
// an embedding-heavy first layer and a head-heavy last one, uneven blocks between
constexpr std::array<LayerCost, 9> uneven{{{9, 18}, {2, 4}, {2, 4}, {3, 6}, {1, 2}, {1, 2}, {4, 8}, {2, 4}, {6, 12}}};
// moondream's shape: a frozen vision encoder (4 layers, about 1.3 of 7.3 in the text's forward + backward) then 8 text layers
constexpr std::array<LayerCost, 12> vlm{{{3, 6}, {3, 6}, {3, 6}, {3, 6}, {6, 12}, {6, 12}, {6, 12}, {6, 12}, {6, 12}, {6, 12}, {6, 12}, {6, 12}}};

/// A module that declares its layers' costs: the balancer computes its ranges at compile time.
struct Toy
{
  using input_type = archetypes::Tensor;
  using hidden_type = archetypes::Tensor;
  using output_type = archetypes::Tensor;
  static constexpr int num_layers = 9;
  static constexpr std::array<LayerCost, 9> layer_costs = uneven;
  archetypes::Tensor forward(archetypes::Tensor);
};
}  // namespace

TEST_CASE("Under unit costs the weighted proof is the proof", "[balance][static]")
{
  constexpr Layout l = Layout::looped(4, 4, 8);
  StageCosts unit;
  for (int s = 0; s < 4; ++s) unit.forward[s] = 1, unit.backward[s] = 2;
  unit.split_evenly(4);
  STATIC_REQUIRE(prove(OneFOneB::runs(l)).makespan == predict<OneFOneB>(l, [] {
                   StageCosts u;
                   for (int s = 0; s < 4; ++s) u.forward[s] = 1, u.backward[s] = 2;
                   u.split_evenly(4);
                   return u;
                 }()).makespan);
  CHECK(predict<ZBH1>(l, unit).makespan == prove(ZBH1::runs(l)).makespan);
  CHECK(prove(GPipe::table(l), nullptr, &unit).makespan == prove(GPipe::runs(l)).makespan);
}

TEST_CASE("Declared costs move the predicted step: a stage twice as heavy sets the steady state", "[balance][static]")
{
  constexpr Layout l = Layout::looped(2, 2, 8);
  constexpr StageCosts c = [] {
    StageCosts x;
    x.forward[0] = 2, x.backward[0] = 4;  // stage 0 costs 6 per micro-batch, stage 1 costs 3
    x.forward[1] = 1, x.backward[1] = 2;
    x.split_evenly(2);
    return x;
  }();
  constexpr Proof p = predict<OneFOneB>(l, c);
  STATIC_REQUIRE(p.ok());
  STATIC_REQUIRE(p.busy[0] == 48);
  STATIC_REQUIRE(p.busy[1] == 24);
  STATIC_REQUIRE(p.makespan > 48);       // the bottleneck's work, and its wait for stage 1's first backward
  STATIC_REQUIRE(p.makespan < 48 + 6);
  STATIC_REQUIRE(prove(OneFOneB::table(l), nullptr, &c).makespan == p.makespan);  // flat and compressed agree
}

TEST_CASE("The balancer finds the shortest predicted step of every possible partition", "[balance]")
{
  STATIC_REQUIRE(balance<OneFOneB>(uniform, 4, 8) == Partition{0, 2, 4, 6, 8});
  STATIC_REQUIRE(balance<GPipe>(uniform, 2, 4)[1] == 4);
  for (int slots : {2, 3, 4}) {
    for (int m : {1, 4, 8}) {
      CAPTURE(slots, m);
      const Partition c1 = balance<OneFOneB>(uneven, slots, m), cz = balance<ZBH1>(uneven, slots, m);
      CHECK(step_of<OneFOneB>(uneven, c1, slots, m) == best_step<OneFOneB>(uneven, slots, m));
      CHECK(step_of<ZBH1>(uneven, cz, slots, m) <= best_step<ZBH1>(uneven, slots, m) * 105 / 100);  // within 5 %
      CHECK(step_of<GPipe>(uneven, balance<GPipe>(uneven, slots, m), slots, m) == best_step<GPipe>(uneven, slots, m));
    }
  }
}

TEST_CASE("The naive partition divides by layer count, the longer ranges first", "[balance][static]")
{
  STATIC_REQUIRE(even_partition(8, 4) == Partition{0, 2, 4, 6, 8});
  STATIC_REQUIRE(even_partition(7, 3) == Partition{0, 3, 5, 7});
  STATIC_REQUIRE(even_partition(3, 4)[4] == 0);  // more slots than layers: no partition
}

TEST_CASE("With a frozen encoder in front the balancer gives its slot text layers too, and a forward-only encoder slot when that is best", "[balance][frozen]")
{
  // 4 frozen vision layers (forward 3 each), 8 text layers (6 + 12): the naive vision | text x 3 split
  constexpr Partition naive{0, 4, 7, 10, 12};
  constexpr Partition part = balance<OneFOneB>(vlm, 4, 8, 4);
  STATIC_REQUIRE(part[1] > 4);  // the encoder's slot takes text layers: its 12 units of forwards alone leave it idle
  CHECK(step_of<OneFOneB>(vlm, part, 4, 8, 4) == best_step<OneFOneB>(vlm, 4, 8, 4));
  CHECK(step_of<OneFOneB>(vlm, part, 4, 8, 4) < step_of<OneFOneB>(vlm, naive, 4, 8, 4));
  // the naive split's first stage is forward only, and predicted that way
  STATIC_REQUIRE(partition_layout(naive, 4, 8, 4).forward_only == 1);
  STATIC_REQUIRE(partition_layout(part, 4, 8, 4).forward_only == 0);
  STATIC_REQUIRE(predict<OneFOneB>(partition_layout(naive, 4, 8, 4), stage_costs(vlm, naive, 4, 4)).peak_in_flight[0] == 0);
  // when the encoder is the heaviest part it stays alone, forward only
  constexpr std::array<LayerCost, 3> heavy{{{20, 40}, {1, 2}, {1, 2}}};
  STATIC_REQUIRE(balance<OneFOneB>(heavy, 2, 4, 1) == Partition{0, 1, 3});
}

TEST_CASE("Layers<b, e> ranges computed at compile time from a module's declared costs", "[balance][static]")
{
  constexpr Partition part = balance<OneFOneB>(Toy::layer_costs, 3, 8);
  using P = Pipeline<Stage<Toy, CPU<0>, Layers<part[0], part[1]>>, Stage<Toy, CPU<1>, Layers<part[1], part[2]>>,
                     Stage<Toy, CPU<2>, Layers<part[2], part[3]>>, Microbatches<8>>;
  STATIC_REQUIRE(P::declares_costs);
  STATIC_REQUIRE(part == Partition{0, 2, 7, 9});  // 33, 33 and 24 units of the 90
  STATIC_REQUIRE(P::stage_costs.forward[0] == 11);
  STATIC_REQUIRE(P::stage_costs.backward[2] == 16);
  STATIC_REQUIRE(P::predicted.ok());
  STATIC_REQUIRE(P::predicted.makespan == best_step<OneFOneB>(uneven, 3, 8));
  std::ostringstream os;
  os << print<P>;
  CAPTURE(os.str());
  CHECK(os.str().find("declared cost per micro-batch (forward + backward): slot 0 33, slot 1 33, slot 2 24\n") != std::string::npos);
  CHECK(os.str().find("predicted step ") != std::string::npos);
  using Naive = Pipeline<Stage<Toy, CPU<0>, Layers<0, 3>>, Stage<Toy, CPU<1>, Layers<3, 6>>, Stage<Toy, CPU<2>, Layers<6, 9>>,
                         Microbatches<8>>;
  STATIC_REQUIRE(Naive::predicted.makespan > P::predicted.makespan);
}

TEST_CASE("Devices of different speeds: a slot twice as fast gets twice the work, and the balancer finds the shortest step", "[balance][speeds][static]")
{
  static constexpr std::array<LayerCost, 6> six{{{1, 2}, {1, 2}, {1, 2}, {1, 2}, {1, 2}, {1, 2}}};
  static constexpr std::array<double, 2> fast_first{2.0, 1.0};
  // slot 0 computes 4 layers in 4 x 3 / 2 = 6 units, slot 1 two layers in 6: the known optimum
  STATIC_REQUIRE(balance<OneFOneB>(six, 2, 8, 0, fast_first) == Partition{0, 4, 6});
  STATIC_REQUIRE(balance<OneFOneB>(six, 2, 8) == Partition{0, 3, 6});  // equal speeds: equal halves
  // equal speeds in any unit change nothing; the prediction is in the fastest slot's time
  static constexpr std::array<double, 3> equal{7.0, 7.0, 7.0};
  STATIC_REQUIRE(balance<OneFOneB>(uneven, 3, 8, 0, equal) == balance<OneFOneB>(uneven, 3, 8));
  STATIC_REQUIRE(at_speeds(stage_costs(uneven, Partition{0, 2, 7, 9}, 3), 3, equal).forward[1] == 11);
  static constexpr std::array<double, 3> slow_middle{1.0, 0.5, 1.0};
  STATIC_REQUIRE(at_speeds(stage_costs(uneven, Partition{0, 2, 7, 9}, 3), 3, slow_middle).forward[1] == 22);
  // against every partition, speeds in every order, three schedules
  static constexpr std::array<std::array<double, 3>, 4> cases{{{1.0, 0.5, 1.0}, {0.5, 1.0, 1.0}, {1.0, 1.0, 0.25}, {0.8, 0.6, 1.0}}};
  for (const auto& sp : cases)
    for (int m : {4, 8}) {
      CAPTURE(sp[0], sp[1], sp[2], m);
      const std::span<const double> v(sp.data(), 3);
      CHECK(step_of<OneFOneB>(uneven, balance<OneFOneB>(uneven, 3, m, 0, v), 3, m, 0, v) == best_step<OneFOneB>(uneven, 3, m, 0, v));
      CHECK(step_of<GPipe>(uneven, balance<GPipe>(uneven, 3, m, 0, v), 3, m, 0, v) == best_step<GPipe>(uneven, 3, m, 0, v));
      CHECK(step_of<ZBH1>(uneven, balance<ZBH1>(uneven, 3, m, 0, v), 3, m, 0, v) <= best_step<ZBH1>(uneven, 3, m, 0, v) * 105 / 100);
      // a frozen encoder in front, the slow slot anywhere
      CHECK(step_of<OneFOneB>(vlm, balance<OneFOneB>(vlm, 3, m, 4, v), 3, m, 4, v) == best_step<OneFOneB>(vlm, 3, m, 4, v));
    }
  // the speed-aware cut beats the equal-speed cut on the devices as they are
  constexpr std::span<const double> slow(slow_middle.data(), 3);
  STATIC_REQUIRE(step_of<OneFOneB>(uneven, balance<OneFOneB>(uneven, 3, 8, 0, slow), 3, 8, 0, slow) <
                 step_of<OneFOneB>(uneven, balance<OneFOneB>(uneven, 3, 8), 3, 8, 0, slow));
  // speeds that do not suit the slots give no partition (part[slots] == 0), as too many slots do
  static constexpr std::array<double, 2> two{1.0, 1.0};
  static constexpr std::array<double, 3> zero{1.0, 0.0, 1.0};
  STATIC_REQUIRE(balance<OneFOneB>(uneven, 3, 8, 0, two)[3] == 0);
  STATIC_REQUIRE(balance<OneFOneB>(uneven, 3, 8, 0, zero)[3] == 0);
  STATIC_REQUIRE(!valid_speeds(zero, 3));
  STATIC_REQUIRE(valid_speeds({}, 3));
}

TEST_CASE("Layers<b, e> ranges computed at compile time from declared costs and declared device speeds", "[balance][speeds][static]")
{
  static constexpr std::array<double, 3> speeds{1.0, 1.0, 0.5};  // the last slot's device half as fast
  constexpr Partition part = balance<OneFOneB>(Toy::layer_costs, 3, 8, 0, speeds);
  using P = Pipeline<Stage<Toy, CPU<0>, Layers<part[0], part[1]>>, Stage<Toy, CPU<1>, Layers<part[1], part[2]>>,
                     Stage<Toy, CPU<2>, Layers<part[2], part[3]>>, Microbatches<8>>;
  STATIC_REQUIRE(P::declares_costs);
  STATIC_REQUIRE(part[3] == 9);
  STATIC_REQUIRE(part[3] - part[2] == 1);  // the slow slot keeps only the last layer (18 of the 90 units, 36 at its speed)
  STATIC_REQUIRE(step_of<OneFOneB>(uneven, part, 3, 8, 0, speeds) == best_step<OneFOneB>(uneven, 3, 8, 0, speeds));
}
