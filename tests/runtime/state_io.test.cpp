// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/runtime/state_io.hpp on a one-rank world: a saved checkpoint loads back whole (parameters,
// optimizer, step, scaler, random generator), `latest` and pruning, and every kind of damage is an error
// that names the file and the earlier checkpoint, which still loads.
#include "support/rooms.hpp"
#include "support/scratch_dir.hpp"

#include <fstream>
#include <nlohmann/json.hpp>

namespace
{
namespace fs = std::filesystem;
using Catch::Contains;

/// A stage, its optimizer after one step (so it has state), saved at `step` under `root`.
struct Saved
{
  mpx::StageSet<rooms::P1> stages{0, torch::kCPU, rooms::make, {}};
  mpx::StageOptimizers optimizers{stages, {}};
  Saved()
  {
    for (auto& p : stages.parameters(0)) p.mutable_grad() = torch::ones_like(p);
    optimizers.step(1e-2);
  }
};

void flip_byte(const std::string& f, std::uintmax_t at)
{
  std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
  io.seekg(std::streamoff(at));
  char c = 0;
  io.get(c);
  io.seekp(std::streamoff(at));
  io.put(char(c ^ 0x10));
}
std::uintmax_t header_bytes(const std::string& f)
{
  std::ifstream in(f, std::ios::binary);
  unsigned char b[8];
  in.read(reinterpret_cast<char*>(b), 8);
  std::uintmax_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | b[i];
  return n;
}
}  // namespace

TEST_CASE("A checkpoint loads back (parameters, optimizer, step, scaler, random generator), latest names it, old ones are pruned", "[rooms][state_io]")
{
  const std::string root = test::scratch_dir("mpx-state-io") + "/ckpt";
  auto w = test::one_rank_world<rooms::P1>();
  Saved a;
  fs::create_directories(root + "/step-00000007.partial");  // a crash's leftovers: replaced
  torch::manual_seed(123);
  const auto rng = torch::rand({4});  // what the generator draws next after the save
  torch::manual_seed(123);
  mpx::save_training_state(w, root, a.stages, a.optimizers, {7, 512.0, 2, 3});
  const auto after = torch::rand({4});
  CHECK(torch::equal(rng, after));
  for (auto f : {"stage0.safetensors", "stage0.optimizer.safetensors", "rank0.rng.safetensors", "trainer.json", "manifest.json"})
    CHECK(fs::exists(root + "/step-00000007/" + f));
  CHECK(!fs::exists(root + "/step-00000007.partial"));
  std::ifstream latest(root + "/latest");
  std::string name;
  latest >> name;
  CHECK(name == "step-00000007");

  Saved b;
  torch::manual_seed(999);
  const auto t = mpx::load_training_state(w, root, b.stages, b.optimizers, {});
  CHECK(t.step == 7);
  CHECK(t.loss_scale == 512.0);
  CHECK(t.skipped == 2);
  CHECK(t.good_steps == 3);
  for (std::size_t i = 0; i < a.stages.parameters(0).size(); ++i) CHECK(torch::equal(a.stages.parameters(0)[i], b.stages.parameters(0)[i]));
  CHECK(torch::equal(torch::rand({4}), rng));  // the generator continues where the saved run's did

  // keep = 2: a third save prunes the oldest; a step dir itself also loads
  mpx::save_training_state(w, root, a.stages, a.optimizers, {8, 1, 0, 0});
  mpx::save_training_state(w, root, a.stages, a.optimizers, {9, 1, 0, 0});
  CHECK(!fs::exists(root + "/step-00000007"));
  CHECK(fs::exists(root + "/step-00000008"));
  CHECK(mpx::load_training_state(w, root, b.stages, b.optimizers, {}).step == 9);
  // a shorter run into the same root: latest is its step; the longer run's later checkpoints stay
  mpx::save_training_state(w, root, a.stages, a.optimizers, {2, 1, 0, 0});
  CHECK(mpx::load_training_state(w, root, b.stages, b.optimizers, {}).step == 2);
  CHECK(fs::exists(root + "/step-00000009"));
  CHECK(mpx::load_training_state(w, root + "/step-00000008", b.stages, b.optimizers, {}).step == 8);
  mpx::save_training_state(w, root, a.stages, a.optimizers, {3, 1, 0, 0});
  mpx::save_training_state(w, root, a.stages, a.optimizers, {4, 1, 0, 0});
  CHECK(!fs::exists(root + "/step-00000002"));  // pruned: the two newest up to step 4 are 3 and 4
  CHECK(fs::exists(root + "/step-00000003"));
  CHECK_THROWS_WITH(mpx::load_training_state(w, root + "/none", b.stages, b.optimizers, {}), Contains("no checkpoint at"));
  fs::remove_all(fs::path(root).parent_path());
}

TEST_CASE("Every kind of damage names the file and the earlier checkpoint, which still loads", "[rooms][state_io]")
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

TEST_CASE("A model of another shape or dtype is refused with the differences listed", "[rooms][state_io]")
{
  const std::string root = test::scratch_dir("mpx-state-model") + "/ckpt";
  auto w = test::one_rank_world<rooms::P1>();
  Saved a;
  mpx::save_training_state(w, root, a.stages, a.optimizers, {3, 1, 0, 0});
  Saved b;
  auto state = b.stages.state(0);
  const std::string first = state.begin()->first;
  {
    torch::NoGradGuard ng;
    state.begin()->second.set_data(state.begin()->second.data().to(torch::kDouble));  // another dtype
  }
  CHECK_THROWS_WITH(mpx::load_training_state(w, root, b.stages, b.optimizers, {}),
                    Contains("stage0.safetensors") && Contains("other dtypes: " + first + " (saved Float, the model Double)") &&
                        Contains("allow_cast"));
  mpx::CheckpointOptions cast;
  cast.allow_cast = true;
  CHECK(mpx::load_training_state(w, root, b.stages, b.optimizers, {}, cast).step == 3);
  {
    torch::NoGradGuard ng;
    state.begin()->second.set_data(torch::zeros({3, 3}));  // another shape
  }
  CHECK_THROWS_WITH(mpx::load_training_state(w, root, b.stages, b.optimizers, {}),
                    Contains("does not match this model") && Contains("other shapes: " + first + " (saved ["));
  fs::remove_all(fs::path(root).parent_path());
}

TEST_CASE("A one-process model's checkpoint loads back by name, and any checkpoint exports its whole weights as one file", "[rooms][state_io]")
{
  const std::string base = test::scratch_dir("mpx-state-local"), root = base + "/ckpt";
  auto model = [](int seed) {
    torch::manual_seed(seed);
    return std::pair{torch::nn::Linear(6, 4), torch::nn::Linear(4, 3)};
  };
  auto named = [](torch::nn::Linear& l, const std::string& prefix) {
    return std::map<std::string, at::Tensor>{{prefix + ".weight", l->weight}, {prefix + ".bias", l->bias}};
  };
  auto [a1, a2] = model(1);
  torch::optim::AdamW opt(std::vector<at::Tensor>{a2->weight, a2->bias}, torch::optim::AdamWOptions(1e-2));
  a2(a1(torch::ones({2, 6}))).sum().backward();
  opt.step();
  const std::vector<mpx::LocalPart> saved{{named(a1, "first"), nullptr}, {named(a2, "second"), &opt}};
  mpx::save_local_checkpoint(root, saved, {5, 1, 0, 0});

  auto [b1, b2] = model(2);
  torch::optim::AdamW opt_b(std::vector<at::Tensor>{b2->weight, b2->bias}, torch::optim::AdamWOptions(1e-2));
  CHECK(mpx::load_local_checkpoint(root, {{named(b1, "first"), nullptr}, {named(b2, "second"), &opt_b}}).step == 5);
  CHECK(torch::equal(a1->weight, b1->weight));
  CHECK(torch::equal(a2->bias, b2->bias));
  auto moments = mpx::named_optimizer_state(opt_b, named(b2, "second"));
  REQUIRE(moments);
  CHECK(torch::equal(moments->at("second.weight/exp_avg"), mpx::named_optimizer_state(opt, named(a2, "second"))->at("second.weight/exp_avg")));

  // the parts may be grouped otherwise (one part holding both): found by name in whichever file
  auto [c1, c2] = model(3);
  auto both = named(c1, "first");
  both.merge(named(c2, "second"));
  CHECK(mpx::load_local_checkpoint(root, {{both, nullptr}}).step == 5);
  CHECK(torch::equal(a2->weight, c2->weight));
  // a model without one of the saved tensors: the verdict names it
  CHECK_THROWS_WITH(mpx::load_local_checkpoint(root, {{named(c1, "first"), nullptr}}), Contains("no stage of this pipeline has second.bias second.weight"));

  {  // a manifest whose split record is hostile (a negative dimension): garbled, not a crash
    const std::string mf = root + "/step-00000005/manifest.json";
    std::ifstream in(mf);
    auto j = nlohmann::json::parse(in);
    in.close();
    const std::string text = j.dump();
    j["files"]["stage1.safetensors"]["splits"]["second.weight"] = {{"dim", -3}, {"parts", {1}}};
    std::ofstream(mf) << j.dump();
    CHECK_THROWS_WITH(mpx::load_local_checkpoint(root, saved), Contains("manifest.json is garbled") && Contains("second.weight"));
    std::ofstream(mf) << text;
  }
  mpx::export_checkpoint_weights(root, base + "/whole.safetensors");
  const auto whole = mpx::load_safetensors(base + "/whole.safetensors");
  CHECK(whole.tensors.size() == 4);
  CHECK(torch::equal(whole.tensors.at("second.weight"), a2->weight));
  CHECK(whole.metadata.at("step") == "5");
  fs::remove_all(base);
}

TEST_CASE("A tensor cut at one tensor-parallel degree is re-cut for another, fused parts included", "[rooms][state_io]")
{
  const auto full = torch::arange(24 * 3, torch::kFloat).view({24, 3});  // a fused q|k|v of 8 rows each
  const mpx::tp::Split qkv{"weight", 0, {8, 8, 8}};
  auto cut = [&](int n) {
    std::vector<at::Tensor> out;
    for (int r = 0; r < n; ++r) out.push_back(mpx::tp::shard(full, qkv, r, n));
    return out;
  };
  CHECK(torch::equal(cut(2)[1].narrow(0, 0, 4), full.narrow(0, 4, 4)));  // rank 1's share of q
  CHECK(torch::equal(mpx::tp::join(cut(2), qkv), full));
  CHECK(torch::equal(mpx::detail::recut(cut(2), &qkv, nullptr, 0, 1), full));         // 2 -> 1
  CHECK(torch::equal(mpx::detail::recut({full}, nullptr, &qkv, 3, 4), cut(4)[3]));     // 1 -> 4
  CHECK(torch::equal(mpx::detail::recut(cut(4), &qkv, &qkv, 1, 2), cut(2)[1]));        // 4 -> 2
  CHECK(torch::equal(mpx::detail::recut({torch::tensor(7L), torch::tensor(7L)}, &qkv, &qkv, 0, 2), torch::tensor(7L)));  // a step count
  // grouped-query attention: 4 query heads of 2 rows reading 1 key/value head, shared by every rank
  const auto gqa_full = torch::arange(12 * 3, torch::kFloat).view({12, 3});
  const mpx::tp::Split gqa2{"weight", 0, {8, 2, 2}, {1, 2, 2}}, gqa4{"weight", 0, {8, 2, 2}, {1, 4, 4}};
  auto gqa_cut = [&](const mpx::tp::Split& s, int n) {
    std::vector<at::Tensor> out;
    for (int r = 0; r < n; ++r) out.push_back(mpx::tp::shard(gqa_full, s, r, n));
    return out;
  };
  CHECK(torch::equal(gqa_cut(gqa4, 4)[3].narrow(0, 2, 2), gqa_full.narrow(0, 8, 2)));  // every rank holds the k head
  CHECK(torch::equal(mpx::tp::join(gqa_cut(gqa2, 2), gqa2), gqa_full));
  CHECK(torch::equal(mpx::detail::recut(gqa_cut(gqa2, 2), &gqa2, &gqa4, 1, 4), gqa_cut(gqa4, 4)[1]));  // 2 -> 4
  CHECK(torch::equal(mpx::detail::recut(gqa_cut(gqa4, 4), &gqa4, nullptr, 0, 1), gqa_full));           // 4 -> 1
  CHECK(mpx::tp::counted_ranges(gqa4, 6, 0, 4) == std::vector<std::pair<int64_t, int64_t>>{{0, 6}});  // rank 0 counts its q, k, v
  CHECK(mpx::tp::counted_ranges(gqa4, 6, 2, 4) == std::vector<std::pair<int64_t, int64_t>>{{0, 2}});  // rank 2: its q rows only
  const auto name = mpx::detail::parse_stage_file("stage12.tp1of4.optimizer.safetensors", ".optimizer.safetensors");
  REQUIRE(name);
  CHECK(name->stage == 12);
  CHECK(name->tp_rank == 1);
  CHECK(name->tp_size == 4);
  CHECK(!mpx::detail::parse_stage_file("stage1.tp4of4.safetensors", ".safetensors"));
  CHECK(!mpx::detail::parse_stage_file("stage1.optimizer.safetensors", ".safetensors"));
  CHECK(!mpx::detail::parse_stage_file("stagex.safetensors", ".safetensors"));
}

TEST_CASE("8-bit AdamW takes fp32 moments for a large parameter and quantizes them (a re-cut shard's)", "[rooms][state_io]")
{
  auto p = torch::zeros({64, 80}, torch::requires_grad());  // 5120 values: 8-bit moments
  mpx::AdamW8bitOptimizer opt({p}, torch::optim::AdamWOptions(1e-3));
  const auto m = torch::randn({64, 80}) * 1e-3, v = torch::rand({64, 80}) * 1e-6;
  opt.set_param_state(p, {{"step", torch::tensor(3L)}, {"m", m}, {"v", v}});
  const auto st = opt.param_state(p);
  REQUIRE(st.count("m8"));
  const auto back = mpx::detail::dense_moment(st.at("m8"), st.at("m8max"), p.sizes(), true);
  CHECK((back - m).abs().max().item<float>() <= 0.02f * m.abs().max().item<float>());
  const auto vback = mpx::detail::dense_moment(st.at("v8"), st.at("v8max"), p.sizes(), false);
  CHECK((vback - v).abs().max().item<float>() <= 0.02f * v.abs().max().item<float>());
}
