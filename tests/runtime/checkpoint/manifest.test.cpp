// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runtime/checkpoint/manifest.hpp, through loads on a one-rank world: every kind of damage to
// a checkpoint is an error that names the file and the earlier checkpoint, which still loads.
#include "runtime/checkpoint/checkpoint_test.hpp"

#include <nlohmann/json.hpp>

using namespace checkpoint_test;  // Saved, flip_byte, fs, Contains

TEST_CASE("Every kind of damage names the file and the earlier checkpoint, which still loads", "[rooms][manifest]")
{
  const std::string base = test::scratch_dir("mpx-state-damage");
  auto w = test::one_rank_world<rooms::P1>();
  Saved a;
  const std::string good = base + "/good";
  mpx::save_training_state(w, good, a.stages, a.optimizers, {4, 1, 0, 0});
  mpx::save_training_state(w, good, a.stages, a.optimizers, {5, 1, 0, 0});
  Saved b;
  // damage(what, edit, expected words): a fresh copy of the checkpoints, one edit to step 5, then a load
  auto damage = [&](const std::string& what, auto edit, std::vector<std::string> words, mpx::CheckpointOptions co = {}) {
    INFO(what);
    const std::string root = base + "/" + what;
    fs::remove_all(root);
    fs::copy(good, root, fs::copy_options::recursive);
    const std::string step5 = root + "/step-00000005";
    edit(step5);
    try {
      mpx::load_training_state(w, root, b.stages, b.optimizers, {}, co);
      FAIL("loaded a damaged checkpoint");
    } catch (const mpx::config_error& e) {
      const std::string msg = e.what();
      INFO(msg);
      for (auto& word : words) CHECK(msg.find(word) != std::string::npos);
      CHECK(msg.find(root + "/step-00000004") != std::string::npos);  // the fix: the earlier checkpoint
    }
    CHECK(mpx::load_training_state(w, root + "/step-00000004", b.stages, b.optimizers, {}).step == 4);  // intact
  };
  const std::string shard = "/stage0.safetensors";
  damage("truncated", [&](auto d) { fs::resize_file(d + shard, fs::file_size(d + shard) - 3); }, {"stage0.safetensors", "truncated"});
  damage("data_byte", [&](auto d) { flip_byte(d + shard, fs::file_size(d + shard) - 5); }, {"stage0.safetensors", "checksum", "flipped bit"});
  damage("header_byte", [&](auto d) { flip_byte(d + shard, 20); }, {"stage0.safetensors", "checksum"});
  damage("missing", [&](auto d) { fs::remove(d + shard); }, {"stage0.safetensors", "is missing"});
  damage("no_manifest", [&](auto d) { fs::remove(d + "/manifest.json"); }, {"latest names step-00000005, which is not a complete checkpoint"});
  damage("garbled_manifest", [&](auto d) { std::ofstream(d + "/manifest.json") << "{\"format\": 2, \"st"; }, {"manifest.json is garbled"});
  damage("garbled_latest", [&](auto d) { std::ofstream(fs::path(d).parent_path() / "latest") << "../../etc"; }, {"latest is garbled"});
  damage("shard_of_step_4", [&](auto d) { fs::copy_file(fs::path(d).parent_path() / "step-00000004" / "stage0.safetensors", d + shard,
                                                        fs::copy_options::overwrite_existing); },
         {"stage0.safetensors", "from another checkpoint (it holds step 4)"});
  damage("optimizer_of_step_4", [&](auto d) { fs::copy_file(fs::path(d).parent_path() / "step-00000004" / "stage0.optimizer.safetensors",
                                                            d + "/stage0.optimizer.safetensors", fs::copy_options::overwrite_existing); },
         {"stage0.optimizer.safetensors", "from another checkpoint (it holds step 4)"});
  // with checksums off, the format's own checks still name the damage
  mpx::CheckpointOptions off;
  off.checksums = false;
  damage("huge_header", [&](auto d) {
    std::fstream io(d + shard, std::ios::in | std::ios::out | std::ios::binary);
    const unsigned char huge[8] = {0, 0, 0, 0, 0, 0, 0, 0x7f};
    io.write(reinterpret_cast<const char*>(huge), 8);
  }, {"stage0.safetensors", "header claims"}, off);
  damage("header_byte_unchecked", [&](auto d) { flip_byte(d + shard, 9); }, {"stage0.safetensors"}, off);
  fs::remove_all(base);
}

