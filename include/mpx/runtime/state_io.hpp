// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/state_io.hpp
/// Saved training state: a directory with each stage's parameters and buffers (`stage<I>.safetensors`),
/// its optimizer state (`stage<I>.optimizer.pt`; a tensor-parallel stage's rank k of N saves its shard as
/// `stage<I>.tp<k>of<N>.*`, resumed at the same degree) and `trainer.json` (step, pipeline fingerprint, loss
/// scaler). `save_training_state` is a collective: replica 0 writes its stages, rank 0 the JSON, all into
/// `dir.partial`, which replaces `dir` only once every rank has finished (barriers from the world), so a
/// crash mid-save keeps the previous state whole. `load_training_state` restores it on the same pipeline
/// type; a state of another pipeline (fingerprint), a missing or corrupt file is a `config_error` naming
/// the file and the fix.

#include <mpx/fingerprint.hpp>              // mpx::fingerprint_v
#include <mpx/io/safetensors.hpp>           // mpx::save_safetensors, mpx::load_safetensors
#include <mpx/pipeline.hpp>                 // mpx::PipelineType
#include <mpx/runtime/errors.hpp>           // mpx::config_error
#include <mpx/runtime/stage_optimizers.hpp> // mpx::StageOptimizers
#include <mpx/runtime/stage_set.hpp>        // mpx::StageSet
#include <mpx/runtime/world.hpp>            // mpx::World, mpx::barrier

#include <nlohmann/json.hpp>  // nlohmann::json

#include <filesystem>  // std::filesystem
#include <fstream>     // std::ifstream, std::ofstream
#include <string>      // std::string

namespace mpx
{

/// The trainer's own state besides modules and optimizers.
struct TrainingState
{
  long step = 0;          ///< optimizer steps done
  double loss_scale = 1;  ///< the loss scaler's current scale
  long skipped = 0;       ///< steps skipped for inf/NaN gradients
  long good_steps = 0;    ///< good steps since the scale last changed
};

namespace detail
{
inline std::string stage_file(const std::string& dir, int s, const std::string& suffix) { return dir + "/stage" + std::to_string(s) + suffix; }
}  // namespace detail

/// Saves the training state into `dir` (see the file comment). Every rank calls it.
template <PipelineType P>
void save_training_state(World& w, const std::string& dir, StageSet<P>& stages, StageOptimizers& optimizers, const TrainingState& t)
{
  namespace fs = std::filesystem;
  const std::string tmp = dir + ".partial";
  if (w.env.rank == 0) {
    fs::remove_all(tmp);
    fs::create_directories(tmp);
  }
  barrier(w, "save: directory");
  if (w.replica == 0)
    for (int s = 0; s < P::num_stages; ++s) {
      if (!stages.holds(s)) continue;
      const std::string shard = stages.shard_suffix();  // a tensor-parallel rank's shard: ".tp<k>of<N>"
      save_safetensors(detail::stage_file(tmp, s, shard + ".safetensors"), stages.state(s),
                       {{"format", "pt"}, {"step", std::to_string(t.step)}});
      optimizers.save(s, detail::stage_file(tmp, s, shard + ".optimizer.pt"));
    }
  if (w.env.rank == 0) {
    const nlohmann::json j = {{"step", t.step}, {"fingerprint", std::to_string(fingerprint_v<P>)}, {"stages", P::num_stages},
                              {"loss_scale", t.loss_scale}, {"skipped", t.skipped}, {"good_steps", t.good_steps}};
    std::ofstream(tmp + "/trainer.json") << j.dump(1) << "\n";
  }
  barrier(w, "save: files");
  if (w.env.rank == 0) {
    const std::string old = dir + ".old";
    fs::remove_all(old);
    if (fs::exists(dir)) fs::rename(dir, old);
    fs::rename(tmp, dir);
    fs::remove_all(old);
  }
  barrier(w, "save: rename");
}

/// Restores what `save_training_state` wrote into this rank's stages and optimizers, and returns the
/// trainer's state (`current` supplies what an older file does not record).
template <PipelineType P>
TrainingState load_training_state(const std::string& dir, StageSet<P>& stages, StageOptimizers& optimizers, TrainingState current)
{
  std::ifstream in(dir + "/trainer.json");
  if (!in) throw config_error("mpx: no checkpoint at " + dir + " (trainer.json missing); pass the directory Trainer::save wrote");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw config_error("mpx: " + dir + "/trainer.json is corrupt (" + e.what() + "); use an earlier checkpoint");
  }
  if (j.value("fingerprint", std::string()) != std::to_string(fingerprint_v<P>))
    throw config_error("mpx: the checkpoint " + dir + " was saved by a different pipeline (fingerprint " + j.value("fingerprint", std::string("?")) +
                       ", this one " + std::to_string(fingerprint_v<P>) + "); resume with the same Pipeline<...> type and layout");
  for (int s = 0; s < P::num_stages; ++s) {
    if (!stages.holds(s)) continue;
    const std::string shard = stages.shard_suffix(), f = detail::stage_file(dir, s, shard + ".safetensors");
    auto saved = load_safetensors(f);
    torch::NoGradGuard ng;
    for (auto& [k, t] : stages.state(s)) {
      auto it = saved.tensors.find(k);
      if (it == saved.tensors.end() || it->second.sizes() != t.sizes())
        throw config_error("mpx: " + f + ": tensor '" + k + "' is missing or has another shape; the checkpoint does not match this model");
      t.copy_(it->second);
    }
    optimizers.load(s, detail::stage_file(dir, s, shard + ".optimizer.pt"));
  }
  try {
    current.step = j.at("step").get<long>();
    current.loss_scale = j.value("loss_scale", current.loss_scale);
    current.skipped = j.value("skipped", 0L);
    current.good_steps = j.value("good_steps", 0L);
  } catch (const std::exception& e) {
    throw config_error("mpx: " + dir + "/trainer.json lacks a valid step (" + e.what() + "); use an earlier checkpoint");
  }
  return current;
}

}  // namespace mpx
