// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runtime/world/world.hpp (and mesh.hpp, its definition's phases) in one process: a one-rank
// world's place and groups, the mesh's rank arithmetic, store keys that never repeat, and the checks a rank
// makes alone before any rendezvous.
#include "support/rooms.hpp"


TEST_CASE("A world of one rank: its place, its groups, a barrier", "[rooms][world]")
{
  auto w = test::one_rank_world<rooms::P1>();
  CHECK(w.slots == 1);
  CHECK(w.replicas == 1);
  CHECK(w.slot == 0);
  CHECK(w.replica == 0);
  CHECK(w.tp_size == 1);
  CHECK(w.world);
  CHECK(w.pp);
  CHECK(w.dp);
  CHECK(w.lanes.size() == 1);
  CHECK(w.device == torch::Device(torch::kCPU));
  CHECK_NOTHROW(mpx::barrier(w, "a test"));
}

TEST_CASE("The mesh's arithmetic: global ranks, slots, lanes", "[rooms][world]")
{
  mpx::World w;  // two slots of tensor-parallel degrees 1 and 2: three ranks per replica
  w.slots = 2, w.ranks_per_replica = 3, w.degree = {1, 2}, w.first_rank = {0, 1};
  CHECK(w.global_rank(0, 0) == 0);
  CHECK(w.global_rank(1, 1, 1) == 5);
  CHECK(w.slot_of(0) == 0);
  CHECK(w.slot_of(2) == 1);
  CHECK(w.slot_of(4) == 1);  // replica 1's rank 1: slot 1
  w.tp_size = 2, w.tp_rank = 1;
  CHECK(w.in_lane(1));
  CHECK(!w.in_lane(0));
}

TEST_CASE("Store keys of a world's collective uses never repeat, and agree across ranks by order", "[rooms][world]")
{
  mpx::World a, b;
  CHECK(a.next_key("save") == "mpx/save/0/");
  CHECK(a.next_key("save") == "mpx/save/1/");
  CHECK(a.next_key("load") == "mpx/load/0/");
  CHECK(b.next_key("save") == "mpx/save/0/");  // another rank making the same uses in the same order
}

TEST_CASE("WORLD_SIZE that is not a multiple of a pipeline's ranks stops before any rendezvous, naming the fix", "[rooms][world]")
{
  mpx::Env env;
  env.world_size = 3, env.rank = 0;
  CHECK_THROWS_WITH(mpx::make_world<rooms::P2>(env), Catch::Contains("WORLD_SIZE (3) is not a multiple of the ranks of one pipeline (2, its slots)") &&
                                                  Catch::Contains("--nproc-per-node 2"));
}

TEST_CASE("A GPU rank's device: its LOCAL_RANK among the node's devices, device 0 when it sees one, else a named error", "[rooms][world]")
{
  using mpx::detail::cuda_device_index;
  CHECK(cuda_device_index(8, 3, 8) == 3);  // the node's ranks share its 8 devices
  CHECK(cuda_device_index(8, 1, 2) == 1);
  CHECK(cuda_device_index(1, 5, 8) == 0);  // one GPU per task: each rank sees its own as device 0
  CHECK_THROWS_WITH(cuda_device_index(2, 3, 4), Catch::Contains("this node runs 4 ranks but each sees 2 CUDA devices") &&
                                                    Catch::Contains("CUDA_VISIBLE_DEVICES per rank, SLURM --gpus-per-task=1"));
}
