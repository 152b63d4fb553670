// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/checkpoint/save.hpp
/// The save protocol, a collective: every rank writes its files into `step-N.partial/` (replica 0 its
/// stages' tensors and optimizer state, every rank its random generators) and publishes their sums in the
/// store; rank 0 writes `trainer.json` and the manifest, renames the directory into place, points `latest`
/// at it and prunes the checkpoints beyond `CheckpointOptions::keep`. The phases and what a crash after
/// each leaves: phases.hpp. The format: format.hpp.

#include <mpx/linkage.hpp>                        // MPX_DECL, MPX_DEFINITIONS
#include <mpx/runtime/checkpoint/format.hpp>      // mpx::CheckpointStage, TrainingState, CheckpointOptions
#include <mpx/runtime/checkpoint/manifest.hpp>    // mpx::detail::FileSum
#include <mpx/runtime/world/world.hpp>            // mpx::World

#include <map>     // std::map
#include <string>  // std::string
#include <vector>  // std::vector

namespace mpx::detail
{

/// Where a save of one step writes: `root/step-N.partial`, renamed to `root/step-N` once complete.
struct SaveDirs
{
  SaveDirs(std::string root_, long step) : root(std::move(root_)), name(step_dir_name(step)), final_dir(root + "/" + name), partial(final_dir + ".partial") {}
  std::string root, name, final_dir, partial;
};

/// This rank's files of a save, written into `dir`: replica 0's stages (tensors, optimizer state) and every
/// rank's random generators. Returns them with their sums and tensor names.
MPX_DECL std::map<std::string, FileSum> write_rank_files(World& w, const std::string& dir, const std::vector<CheckpointStage>& stages, long step,
                                                         bool checksums);

/// Publishes this rank's sums under `key` + rank, for rank 0's manifest.
MPX_DECL void publish_sums(World& w, const std::string& key, const std::map<std::string, FileSum>& mine);

/// Every rank's files, gathered on rank 0 through the store (rank 0 calls it after the others published).
MPX_DECL std::map<std::string, FileSum> gather_sums(World& w, const std::string& key);

/// Rank 0: `trainer.json`, then the manifest of every rank's files (`key`: where they published them).
MPX_DECL void write_manifest(World& w, const SaveDirs& d, const std::string& key, const std::string& fingerprint, int num_stages,
                             const TrainingState& t, const CheckpointOptions& co);

/// Rank 0: `step-N.partial` becomes `step-N` (an earlier copy of the same step kept as `.old` until then).
MPX_DECL void rename_into_place(const SaveDirs& d);

/// Removes all but the newest `keep` complete checkpoints up to `newest` (the one just saved), and older
/// leftovers of interrupted saves. Checkpoints of later steps (an earlier, longer run into the same root)
/// are left alone: only `latest` says which one is current.
MPX_DECL void prune_checkpoints(const std::string& root, int keep, const std::string& newest);

/// A save (see the file comment) of `stages`, this rank's stages of a model identified by `fingerprint`.
MPX_DECL void save_checkpoint(World& w, const std::string& root, const std::vector<CheckpointStage>& stages, const std::string& fingerprint,
                              int num_stages, const TrainingState& t, const CheckpointOptions& co);

}  // namespace mpx::detail

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----
#include <mpx/io/safetensors.hpp>                      // mpx::save_safetensors
#include <mpx/runtime/checkpoint/optimizer_state.hpp>  // mpx::named_optimizer_state
#include <mpx/runtime/checkpoint/phases.hpp>           // mpx::detail::SavePhase, phase_done
#include <mpx/tp/dropout.hpp>                          // mpx::tp::sharded_region_generator

#include <nlohmann/json.hpp>  // nlohmann::json

#include <algorithm>   // std::max
#include <filesystem>  // std::filesystem
#include <mutex>       // std::lock_guard

namespace mpx::detail
{
namespace fs = std::filesystem;

MPX_DECL std::map<std::string, FileSum> write_rank_files(World& w, const std::string& dir, const std::vector<CheckpointStage>& stages, long step,
                                                         bool checksums)
{
  std::map<std::string, FileSum> out;
  const std::map<std::string, std::string> meta{{"format", "pt"}, {"step", std::to_string(step)}};
  auto write = [&](const std::string& name, const std::map<std::string, at::Tensor>& tensors, const CheckpointStage* stage) {
    save_safetensors(dir + "/" + name, tensors, meta);
    sync_path(dir + "/" + name);
    out[name] = sum_file(dir + "/" + name, checksums);
    for (auto& [k, t] : tensors) out[name].tensors.push_back(k);
    if (stage) out[name].global_names = stage->global_names, out[name].cuts = stage->cuts;
  };
  if (w.replica == 0)
    for (auto& stage : stages) {
      write(stage_file(stage.index, stage.shard, ".safetensors"), stage.tensors, &stage);
      if (!stage.optimizer) continue;
      if (auto named = named_optimizer_state(*stage.optimizer, trainable_of(stage.tensors))) {
        write(stage_file(stage.index, stage.shard, ".optimizer.safetensors"), *named, &stage);
      } else {  // an optimizer mpx does not know: LibTorch's archive (resumes only in the same layout)
        const std::string pt = stage_file(stage.index, stage.shard, ".optimizer.pt");
        stage.save_archive(dir + "/" + pt);
        sync_path(dir + "/" + pt);
        out[pt] = sum_file(dir + "/" + pt, checksums);
      }
    }
  auto state_of = [](at::Generator g) {
    std::lock_guard<std::mutex> lock(g.mutex());
    return g.get_state();
  };
  // ("tp_split": the sharded regions' generator, under the name format 3 gave it)
  write(rng_file(w.env.rank), {{"cpu", state_of(at::detail::getDefaultCPUGenerator())}, {"tp_split", state_of(tp::sharded_region_generator())}},
        nullptr);
  return out;
}

MPX_DECL void publish_sums(World& w, const std::string& key, const std::map<std::string, FileSum>& mine)
{
  nlohmann::json published = nlohmann::json::object();
  for (auto& [file, sum] : mine) published[file] = to_json(sum);
  const std::string text = published.dump();
  w.store->set(key + std::to_string(w.env.rank), std::vector<uint8_t>(text.begin(), text.end()));
}

MPX_DECL std::map<std::string, FileSum> gather_sums(World& w, const std::string& key)
{
  std::map<std::string, FileSum> all;
  for (int r = 0; r < w.env.world_size; ++r) {
    const auto v = w.store->get(key + std::to_string(r));
    const auto files = nlohmann::json::parse(std::string(v.begin(), v.end()));  // kept: items() views it
    for (auto& [name, e] : files.items()) all[name] = from_json(e);
  }
  return all;
}

MPX_DECL void write_manifest(World& w, const SaveDirs& d, const std::string& key, const std::string& fingerprint, int num_stages,
                             const TrainingState& t, const CheckpointOptions& co)
{
  auto files = gather_sums(w, key);
  const nlohmann::json trainer = {{"step", t.step}, {"loss_scale", t.loss_scale}, {"skipped", t.skipped}, {"good_steps", t.good_steps}};
  write_durably(d.partial + "/trainer.json", trainer.dump(1) + "\n");
  files["trainer.json"] = sum_file(d.partial + "/trainer.json", co.checksums);
  nlohmann::json m = {{"format", checkpoint_format}, {"step", t.step}, {"fingerprint", fingerprint},
                      {"stages", num_stages},         {"world_size", w.env.world_size}, {"replicas", w.replicas},
                      {"checksum", co.checksums ? "xxh3-64" : "none"}, {"trainable_only", co.trainable_only}, {"files", nlohmann::json::object()}};
  for (auto& [file, sum] : files) m["files"][file] = to_json(sum);
  write_durably(d.partial + "/manifest.json", m.dump(1) + "\n");  // last: the directory is complete
}

MPX_DECL void rename_into_place(const SaveDirs& d)
{
  const std::string old = d.final_dir + ".old";  // saving a step again: the earlier copy goes only once this one is in place
  fs::remove_all(old);
  if (fs::exists(d.final_dir)) fs::rename(d.final_dir, old);
  fs::rename(d.partial, d.final_dir);
  sync_path(d.root);
  fs::remove_all(old);
}

MPX_DECL void prune_checkpoints(const std::string& root, int keep, const std::string& newest)
{
  auto complete = complete_checkpoints(root);
  std::erase_if(complete, [&](const std::string& c) { return c > newest; });
  for (std::size_t i = 0; i + std::size_t(std::max(keep, 1)) < complete.size(); ++i) fs::remove_all(fs::path(root) / complete[i]);
  std::error_code ec;
  for (auto& e : fs::directory_iterator(root, ec)) {
    const std::string n = e.path().filename().string();
    if (n.size() > 8 && n.ends_with(".partial") && n.substr(0, n.size() - 8) < newest) fs::remove_all(e.path());
  }
}

MPX_DECL void save_checkpoint(World& w, const std::string& root, const std::vector<CheckpointStage>& stages, const std::string& fingerprint,
                              int num_stages, const TrainingState& t, const CheckpointOptions& co)
{
  const std::string key = w.next_key("save");  // every rank saves in the same order: the same key, never reused
  const SaveDirs d(root, t.step);
  auto done = [&](SavePhase p) { phase_done(w.env, t.step, p); };
  const bool lead = w.env.rank == 0;
  if (lead) {
    fs::create_directories(root);
    fs::remove_all(d.partial);  // an interrupted save of this step
    fs::create_directories(d.partial);
  }
  done(SavePhase::directory);
  barrier(w, "save: directory");
  publish_sums(w, key, write_rank_files(w, d.partial, kept_by(co, stages), t.step, co.checksums));
  done(SavePhase::files);
  barrier(w, "save: files");
  if (lead) {
    write_manifest(w, d, key, fingerprint, num_stages, t, co);
    done(SavePhase::manifest);
    rename_into_place(d);
    done(SavePhase::renamed);
    write_durably(root + "/latest", d.name + "\n");
    done(SavePhase::latest);
    prune_checkpoints(root, co.keep, d.name);
    done(SavePhase::pruned);
  }
  barrier(w, "save: done");
}

}  // namespace mpx::detail
#endif  // MPX_DEFINITIONS
