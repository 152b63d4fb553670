// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runtime/checkpoint/format.hpp: the names of a checkpoint's directories and files, taken apart.
#include "support/catch_torch.hpp"

#include <mpx/mpx.hpp>

TEST_CASE("A stage file's name gives its stage and tensor-parallel shard, and anything else is refused", "[rooms][format]")
{
  const auto name = mpx::detail::parse_stage_file("stage12.tp1of4.optimizer.safetensors", ".optimizer.safetensors");
  REQUIRE(name);
  CHECK(name->stage == 12);
  CHECK(name->tp_rank == 1);
  CHECK(name->tp_size == 4);
  CHECK(!mpx::detail::parse_stage_file("stage1.tp4of4.safetensors", ".safetensors"));
  CHECK(!mpx::detail::parse_stage_file("stage1.optimizer.safetensors", ".safetensors"));
  CHECK(!mpx::detail::parse_stage_file("stagex.safetensors", ".safetensors"));
  CHECK(mpx::detail::step_dir_name(6) == "step-00000006");
  CHECK(mpx::detail::is_step_dir_name("step-00000006"));
  CHECK(!mpx::detail::is_step_dir_name("step-6"));
  CHECK(!mpx::detail::is_step_dir_name("step-0000000x"));
}
