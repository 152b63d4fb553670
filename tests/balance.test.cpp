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
constexpr std::int64_t best_step(std::span<const LayerCost> layers, int slots, int m, int frozen = 0)
{
  const int L = int(layers.size());
  std::int64_t best = -1;
  Partition c{};
  c[std::size_t(slots)] = L;
  // odometer over the interior edges 0 < c[1] < ... < c[slots-1] < L
  for (int k = 1; k < slots; ++k) c[std::size_t(k)] = k;
  while (true) {
    const std::int64_t t = predict<Tag>(partition_layout(c, slots, m, frozen), stage_costs(layers, c, slots, frozen)).makespan;
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
constexpr std::int64_t step_of(std::span<const LayerCost> layers, const Partition& c, int slots, int m, int frozen = 0)
{
  return predict<Tag>(partition_layout(c, slots, m, frozen), stage_costs(layers, c, slots, frozen)).makespan;
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
