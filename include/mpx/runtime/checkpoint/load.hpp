// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/checkpoint/load.hpp
/// The load protocol, a collective: every rank reads `path` when it is one checkpoint (it holds a
/// manifest), else the one `path/latest` names. Before anything is used: the manifest parses; a checkpoint
/// of another pipeline is accepted only when this rank's stages name their parameters globally; each file
/// this rank reads exists with the manifest's size and checksum and was saved at the manifest's step; its
/// tensors are exactly the model's, over all ranks (an error lists the missing, unused and mis-shaped
/// ones); dtypes match unless `allow_cast`. Every rank stops with the same `config_error`, naming the file
/// and the fix with the other complete checkpoints to resume from; a failed load writes no file. Tensors are
/// found by name, whatever layout or degree saved them (recut.hpp).

#include <mpx/linkage.hpp>                        // MPX_DECL, MPX_DEFINITIONS
#include <mpx/runtime/checkpoint/format.hpp>      // mpx::CheckpointStage, TrainingState, CheckpointOptions
#include <mpx/runtime/checkpoint/manifest.hpp>    // mpx::detail::Manifest
#include <mpx/runtime/checkpoint/recut.hpp>       // mpx::detail::CheckpointReader
#include <mpx/runtime/world/world.hpp>            // mpx::World

#include <string>  // std::string
#include <vector>  // std::vector

namespace mpx::detail
{

/// " a b c" — at most 12 names, then how many more.
MPX_DECL std::string name_list(const std::vector<std::string>& names);

/// Copies a stage's tensors from the checkpoint by name, after checking they are exactly the model's; the
/// names it took go into `taken`.
MPX_DECL void load_stage_tensors(const Manifest& m, CheckpointReader& rd, const CheckpointStage& stage, const CheckpointOptions& co,
                               std::vector<std::string>& taken);

/// This rank's part of a load (see `load_training_state`): its stages' tensors and optimizer states by
/// name, its random generator, and the trainer's state. `taken` and `saved`: the stage tensor names it
/// took, and all the checkpoint holds (for the agreement).
MPX_DECL TrainingState load_rank_state(World& w, const Manifest& m, const std::vector<CheckpointStage>& stages, const std::string& fingerprint,
                                     TrainingState current, const CheckpointOptions& co, std::vector<std::string>& taken,
                                     std::vector<std::string>& saved);

/// The load's verdict, agreed by every rank through the store: each rank publishes its error or the tensor
/// names it took; rank 0 adds the checkpoint's tensors no rank took and publishes the first error; every
/// rank reads it and throws it (rank 0 only once the others have read it: it hosts the store).
MPX_DECL void agree_on_load(World& w, const std::string& key, const std::string& mine, const std::vector<std::string>& taken,
                          const std::vector<std::string>& saved, const Manifest& m);

/// A load (see the file comment) into `stages`, this rank's stages of a model identified by `fingerprint`.
MPX_DECL TrainingState load_checkpoint(World& w, const std::string& path, const std::vector<CheckpointStage>& stages, const std::string& fingerprint,
                                       TrainingState current, const CheckpointOptions& co);

}  // namespace mpx::detail

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----
#include <mpx/errors.hpp>                              // mpx::config_error
#include <mpx/io/safetensors.hpp>                      // mpx::load_safetensors
#include <mpx/runtime/checkpoint/optimizer_state.hpp>  // mpx::restore_optimizer_state
#include <mpx/tp/dropout.hpp>                          // mpx::tp::sharded_region_generator

#include <nlohmann/json.hpp>  // nlohmann::json

#include <fstream>   // std::ifstream
#include <map>       // std::map
#include <mutex>     // std::lock_guard
#include <optional>  // std::optional
#include <set>       // std::set

namespace mpx::detail
{

MPX_DECL std::string name_list(const std::vector<std::string>& names)
{
  std::string out;
  for (std::size_t i = 0; i < names.size() && i < 12; ++i) out += " " + names[i];
  if (names.size() > 12) out += " ... and " + std::to_string(names.size() - 12) + " more";
  return out;
}

MPX_DECL void load_stage_tensors(const Manifest& m, CheckpointReader& rd, const CheckpointStage& stage, const CheckpointOptions& co,
                               std::vector<std::string>& taken)
{
  std::vector<std::string> missing, shapes, dtypes;
  std::set<std::string> files;  // those the differences are in
  std::map<std::string, at::Tensor> found;
  for (auto& [k, t] : stage.tensors) {
    at::Tensor saved;
    std::string from;
    try {
      saved = find_tensor(m, rd, stage, k, from);
    } catch (const config_error&) {
      throw;
    } catch (const std::exception& e) {  // shards that do not join or cut (another model's)
      shapes.push_back(k + " (its saved shards do not fit this model: " + std::string(e.what()).substr(0, 200) + ")"), files.insert(from);
      continue;
    }
    if (!saved.defined()) missing.push_back(k);
    else if (saved.sizes() != t.sizes())
      shapes.push_back(k + " (saved " + c10::str(saved.sizes()) + ", the model " + c10::str(t.sizes()) + ")"), files.insert(from);
    else if (saved.scalar_type() != t.scalar_type() && !co.allow_cast)
      dtypes.push_back(k + " (saved " + std::string(c10::toString(saved.scalar_type())) + ", the model " + c10::toString(t.scalar_type()) + ")"),
          files.insert(from);
    found[k] = saved;
  }
  auto bad = [&](const std::string& why) {
    std::string where = m.dir;
    if (!files.empty()) {
      where.clear();
      for (auto& f : files) where += (where.empty() ? "" : ", ") + m.dir + "/" + f;
    }
    return config_error("mpx: the checkpoint " + where + " " + why + other_checkpoints(m.root, m.dir));
  };
  if (!missing.empty() || !shapes.empty())
    throw bad("does not match this model:" + (missing.empty() ? "" : " not in the checkpoint:" + name_list(missing)) +
              (shapes.empty() ? "" : (missing.empty() ? "" : ";") + std::string(" other shapes:") + name_list(shapes)) +
              "; resume with the model and config that saved it");
  if (!dtypes.empty()) throw bad("has other dtypes:" + name_list(dtypes) + "; load with CheckpointOptions::allow_cast to convert them");
  torch::NoGradGuard ng;
  for (auto& [k, t] : stage.tensors) t.copy_(found.at(k)), taken.push_back(k);
}

MPX_DECL TrainingState load_rank_state(World& w, const Manifest& m, const std::vector<CheckpointStage>& stages, const std::string& fingerprint,
                                     TrainingState current, const CheckpointOptions& co, std::vector<std::string>& taken,
                                     std::vector<std::string>& saved)
{
  const bool same_model = m.fingerprint == fingerprint;
  for (auto& stage : stages)
    if (!same_model && !stage.global_names)
      throw config_error("mpx: the checkpoint " + m.dir + " was saved by a different pipeline (fingerprint " + m.fingerprint + ", this one " +
                         fingerprint + ") and stage " + std::to_string(stage.index) +
                         "'s module names its parameters only within the stage; resume with the same Pipeline<...> type and layout, "
                         "or give the module named_weights() (global names) so that checkpoints move between layouts");
  const std::string shard = stages.empty() ? std::string() : stages[0].shard;
  CheckpointReader tensors(m, shard, co, ".safetensors"), moments(m, shard, co, ".optimizer.safetensors");
  saved = tensors.all_names();
  for (auto& stage : stages) {
    load_stage_tensors(m, tensors, stage, co, taken);
    if (!stage.optimizer) continue;
    if (knows_optimizer(*stage.optimizer)) {
      restore_optimizer_state(*stage.optimizer, trainable_of(stage.tensors),
                              [&](const std::string& k) { return find_moment(m, moments, tensors, stage, k); });
    } else {  // LibTorch's archive: the same layout only
      const std::string pt = stage_file(stage.index, stage.shard, ".optimizer.pt");
      if (!same_model) throw config_error("mpx: " + m.dir + "/" + pt + ": this optimizer's state is a LibTorch archive, which loads only into the pipeline that saved it");
      stage.load_archive(verified(m, pt, co));
    }
  }
  const std::string tj = verified(m, "trainer.json", co);
  try {
    std::ifstream in(tj);
    const auto j = nlohmann::json::parse(in);
    current.step = j.at("step").get<long>();
    current.loss_scale = j.value("loss_scale", current.loss_scale);
    current.skipped = j.value("skipped", 0L);
    current.good_steps = j.value("good_steps", 0L);
  } catch (const std::exception& e) {
    throw config_error("mpx: " + tj + " is garbled (" + e.what() + ")" + other_checkpoints(m.root, m.dir));
  }
  if (current.step != m.step)
    throw config_error("mpx: " + tj + " is of step " + std::to_string(current.step) + ", the manifest of step " + std::to_string(m.step) +
                       other_checkpoints(m.root, m.dir));
  if (m.world_size == w.env.world_size && m.files.count(rng_file(w.env.rank))) {  // the same ranks: each its generator
    const auto st = load_safetensors(verified(m, rng_file(w.env.rank), co));
    auto restore = [&](at::Generator g, const char* name) {  // a handle: the generator itself
      auto it = st.tensors.find(name);
      if (it == st.tensors.end()) return;
      std::lock_guard<std::mutex> lock(g.mutex());
      g.set_state(it->second.clone());
    };
    restore(at::detail::getDefaultCPUGenerator(), "cpu");
    restore(tp::sharded_region_generator(), "tp_split");  // (format 3's name for the sharded regions' generator)
  }
  return current;
}

MPX_DECL void agree_on_load(World& w, const std::string& key, const std::string& mine, const std::vector<std::string>& taken,
                          const std::vector<std::string>& saved, const Manifest& m)
{
  auto bytes = [](const std::string& x) { return std::vector<uint8_t>(x.begin(), x.end()); };
  auto text = [](const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); };
  const nlohmann::json report = {{"error", mine}, {"taken", taken}};
  w.store->set(key + "rank/" + std::to_string(w.env.rank), bytes(report.dump()));
  if (w.env.rank == 0) {
    std::string verdict;
    std::set<std::string> all;
    for (int r = 0; r < w.env.world_size; ++r) {
      w.store->wait({key + "rank/" + std::to_string(r)}, w.timeout);
      const auto j = nlohmann::json::parse(text(w.store->get(key + "rank/" + std::to_string(r))));
      if (verdict.empty()) verdict = j.at("error").get<std::string>();
      for (auto& n : j.at("taken")) all.insert(n.get<std::string>());
    }
    std::vector<std::string> unused;
    for (auto& n : saved)
      if (!all.count(n)) unused.push_back(n);
    if (verdict.empty() && !unused.empty())
      verdict = "mpx: the checkpoint " + m.dir + " does not match this model: no stage of this pipeline has" + name_list(unused) +
                "; resume with the model and config that saved it" + other_checkpoints(m.root, m.dir);
    w.store->set(key + "verdict", bytes(verdict));
  }
  w.store->wait({key + "verdict"}, w.timeout);
  const std::string verdict = text(w.store->get(key + "verdict"));
  if (verdict.empty()) return;
  w.store->set(key + "read/" + std::to_string(w.env.rank), bytes("1"));
  if (w.env.rank == 0)
    for (int r = 1; r < w.env.world_size; ++r) w.store->wait({key + "read/" + std::to_string(r)}, w.timeout);
  throw config_error(verdict);
}

MPX_DECL TrainingState load_checkpoint(World& w, const std::string& path, const std::vector<CheckpointStage>& stages, const std::string& fingerprint,
                                     TrainingState current, const CheckpointOptions& co)
{
  const std::string key = w.next_key("load");  // every rank loads in the same order: the same key, never reused
  std::string error;
  std::vector<std::string> taken, saved;
  std::optional<Manifest> m;
  try {
    m = read_manifest(locate_checkpoint(path));
    if (m->trainable_only != co.trainable_only)
      throw config_error("mpx: the checkpoint " + m->dir +
                         (m->trainable_only ? " holds only the parameters that trained (e.g. LoRA adapters); load it with CheckpointOptions::trainable_only, "
                                              "into the model rebuilt from the weights it started from (and its adapters added)"
                                            : " holds every parameter; load it without CheckpointOptions::trainable_only"));
    current = load_rank_state(w, *m, kept_by(co, stages), fingerprint, current, co, taken, saved);
  } catch (const config_error& e) {
    error = e.what();
  } catch (const std::exception& e) {  // a tensor op on what the files hold (shards that do not join): every rank hears it
    error = "mpx: the checkpoint at " + path + " cannot be loaded into this model: " + std::string(e.what()).substr(0, 400);
  }
  agree_on_load(w, key, error, taken, saved, m ? *m : Manifest{});
  return current;
}
}  // namespace mpx::detail
#endif  // MPX_DEFINITIONS
