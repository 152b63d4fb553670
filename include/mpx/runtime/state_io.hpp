// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/state_io.hpp
/// Saved training state, in a format that cannot be silently wrong. `save_training_state(w, root, ...)` (a
/// collective) writes one step-numbered directory under `root`:
///
/// ```
/// root/step-00000006/stage<I>[.tp<k>of<N>].safetensors   parameters and buffers (replica 0 writes them)
///                    stage<I>[...].optimizer.pt            its optimizer state
///                    rank<r>.rng.safetensors               rank r's random generator
///                    trainer.json                          step, loss scaler, fingerprint, degrees
///                    manifest.json                         every file's bytes and XXH3-64, written last
/// root/latest                                              "step-00000006": the newest complete checkpoint
/// ```
///
/// The phases (a crash between any two system calls leaves a complete checkpoint that `latest` names):
/// 0 `step-N.partial/` made; 1 this rank's files written and fsynced; 2 the manifest written (fsynced, then
/// renamed into place); 3 `step-N.partial` renamed to `step-N`, the root fsynced; 4 `latest` replaced the
/// same way; 5 all but the newest `keep` checkpoints pruned. (`save<k>` faults, faults.hpp, crash after phase k.)
///
/// `load_training_state(w, path, ...)` reads `path` when it is one checkpoint (it holds a manifest), else the
/// one `path/latest` names. Before anything is used: the manifest parses and has this pipeline's
/// fingerprint; each file this rank reads exists with the manifest's size and checksum; each stage file
/// was saved at the manifest's step; its tensors are exactly the model's (an error lists the missing,
/// unexpected and mis-shaped ones); dtypes match unless `allow_cast`. Every failure is a `config_error`
/// naming the file and the fix, with the other complete checkpoints to resume from; a failed load writes
/// nothing.

#include <mpx/fingerprint.hpp>              // mpx::fingerprint_v
#include <mpx/io/safetensors.hpp>           // mpx::save_safetensors, mpx::load_safetensors
#include <mpx/pipeline.hpp>                 // mpx::PipelineType
#include <mpx/runtime/errors.hpp>           // mpx::config_error
#include <mpx/runtime/faults.hpp>           // mpx::inject_fault
#include <mpx/runtime/options.hpp>          // mpx::CheckpointOptions
#include <mpx/runtime/stage_optimizers.hpp> // mpx::StageOptimizers
#include <mpx/runtime/stage_set.hpp>        // mpx::StageSet
#include <mpx/runtime/world.hpp>            // mpx::World, mpx::barrier

#include <nlohmann/json.hpp>  // nlohmann::json
#include <torch/torch.h>      // at::detail::getDefaultCPUGenerator
#define XXH_INLINE_ALL
#include <xxhash.h>  // XXH3_64bits (libxxhash-dev)

#include <fcntl.h>   // open
#include <unistd.h>  // fsync, read

#include <algorithm>   // std::sort
#include <cstdio>      // std::snprintf
#include <filesystem>  // std::filesystem
#include <fstream>     // std::ifstream, std::ofstream
#include <map>         // std::map
#include <mutex>       // std::lock_guard
#include <string>      // std::string
#include <vector>      // std::vector

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
namespace fs = std::filesystem;
inline constexpr int checkpoint_format = 2;

inline std::string step_dir_name(long step)
{
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08ld", step);
  return buf;
}
inline bool is_step_dir_name(const std::string& n)
{
  return n.size() == 13 && n.rfind("step-", 0) == 0 && n.find_first_not_of("0123456789", 5) == std::string::npos;
}

/// fsync of a file or a directory (what makes a rename durable).
inline void sync_path(const std::string& path)
{
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw config_error("mpx: cannot open " + path + " to sync it: " + std::strerror(errno));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw config_error("mpx: fsync of " + path + " failed: " + std::strerror(errno) + " (disk full or failing?)");
}

/// Writes `text` to `path` so that a crash leaves the old content or the new, never a mix.
inline void write_durably(const std::string& path, const std::string& text)
{
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << text;
    f.flush();
    if (!f) throw config_error("mpx: cannot write " + tmp + " (disk full?); the checkpoints before it are intact");
  }
  sync_path(tmp);
  fs::rename(tmp, path);
  sync_path(fs::path(path).parent_path().string());
}

/// A file's size and XXH3-64 (as 16 hex digits; empty when checksums are off).
struct FileSum
{
  std::uintmax_t bytes = 0;
  std::string xxh3;
};
inline FileSum sum_file(const std::string& path, bool checksum)
{
  FileSum out;
  out.bytes = fs::file_size(path);
  if (!checksum) return out;
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw config_error("mpx: cannot read " + path + ": " + std::strerror(errno));
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  std::vector<char> buf(std::size_t(1) << 20);
  for (ssize_t n; (n = ::read(fd, buf.data(), buf.size())) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd), XXH3_freeState(st);
      throw config_error("mpx: cannot read " + path + ": " + std::strerror(errno));
    }
    XXH3_64bits_update(st, buf.data(), std::size_t(n));
  }
  ::close(fd);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(XXH3_64bits_digest(st)));
  XXH3_freeState(st);
  out.xxh3 = hex;
  return out;
}

/// The complete checkpoints under `root` (directories with a manifest), oldest first.
inline std::vector<std::string> complete_checkpoints(const std::string& root)
{
  std::vector<std::string> out;
  std::error_code ec;
  for (auto& e : fs::directory_iterator(root, ec))
    if (e.is_directory() && is_step_dir_name(e.path().filename().string()) && fs::exists(e.path() / "manifest.json"))
      out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

/// What to do instead, for an error about checkpoint `dir` under `root`: the other complete ones.
inline std::string other_checkpoints(const std::string& root, const std::string& dir)
{
  std::string list;
  for (auto& c : complete_checkpoints(root))
    if ((fs::path(root) / c).string() != dir) list += (list.empty() ? "" : ", ") + (fs::path(root) / c).string();
  return list.empty() ? "; no other complete checkpoint is kept under " + root
                      : "; resume from another complete checkpoint by passing its directory: " + list;
}

inline std::string stage_file(int s, const std::string& shard, const std::string& suffix) { return "stage" + std::to_string(s) + shard + suffix; }
inline std::string rng_file(int rank) { return "rank" + std::to_string(rank) + ".rng.safetensors"; }

/// This rank's files of a save, written into `dir`: replica 0's stages (tensors, optimizer) and every
/// rank's random generator. Returns them with their sums.
template <PipelineType P>
std::map<std::string, FileSum> write_rank_files(World& w, const std::string& dir, StageSet<P>& stages, StageOptimizers& optimizers,
                                                long step, bool checksums)
{
  std::map<std::string, FileSum> out;
  const std::map<std::string, std::string> meta{{"format", "pt"}, {"step", std::to_string(step)}};
  auto done = [&](const std::string& name) {
    sync_path(dir + "/" + name);
    out[name] = sum_file(dir + "/" + name, checksums);
  };
  if (w.replica == 0)
    for (int s = 0; s < P::num_stages; ++s) {
      if (!stages.holds(s)) continue;
      const std::string shard = stages.shard_suffix();  // a tensor-parallel rank's shard: ".tp<k>of<N>"
      save_safetensors(dir + "/" + stage_file(s, shard, ".safetensors"), stages.state(s), meta);
      done(stage_file(s, shard, ".safetensors"));
      if (optimizers.has(s)) {
        optimizers.save(s, dir + "/" + stage_file(s, shard, ".optimizer.pt"));
        done(stage_file(s, shard, ".optimizer.pt"));
      }
    }
  at::Generator g = at::detail::getDefaultCPUGenerator();
  at::Tensor rng;
  {
    std::lock_guard<std::mutex> lock(g.mutex());
    rng = g.get_state();
  }
  save_safetensors(dir + "/" + rng_file(w.env.rank), {{"cpu", rng}}, meta);
  done(rng_file(w.env.rank));
  return out;
}

/// Every rank's files, gathered on rank 0 through the store (rank 0 calls it after the others published).
inline std::map<std::string, FileSum> gather_sums(World& w, const std::string& key)
{
  std::map<std::string, FileSum> all;
  for (int r = 0; r < w.env.world_size; ++r) {
    const auto v = w.store->get(key + std::to_string(r));
    const auto files = nlohmann::json::parse(std::string(v.begin(), v.end()));  // kept: items() views it
    for (auto& [name, e] : files.items())
      all[name] = FileSum{e.at("bytes").get<std::uintmax_t>(), e.at("xxh3").get<std::string>()};
  }
  return all;
}

/// Removes all but the newest `keep` complete checkpoints up to `newest` (the one just saved), and older
/// leftovers of interrupted saves. Checkpoints of later steps (an earlier, longer run into the same root)
/// are left alone: only `latest` says which one is current.
inline void prune_checkpoints(const std::string& root, int keep, const std::string& newest)
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
}  // namespace detail

/// Saves the training state as a new checkpoint under `root` (see the file comment). Every rank calls it.
template <PipelineType P>
void save_training_state(World& w, const std::string& root, StageSet<P>& stages, StageOptimizers& optimizers, const TrainingState& t,
                         const CheckpointOptions& co = {})
{
  namespace fs = std::filesystem;
  static long saves = 0;  // every rank saves in the same order: the store keys of a save are never reused
  const std::string key = "mpx/save/" + std::to_string(saves++) + "/";
  const std::string name = detail::step_dir_name(t.step), final_dir = root + "/" + name, tmp = final_dir + ".partial";
  const bool lead = w.env.rank == 0;
  if (lead) {
    fs::create_directories(root);
    fs::remove_all(tmp);  // an interrupted save of this step
    fs::create_directories(tmp);
  }
  inject_fault(FaultPoint::save, w.env.rank, t.step, 0);
  barrier(w, "save: directory");
  const auto mine = detail::write_rank_files(w, tmp, stages, optimizers, t.step, co.checksums);
  nlohmann::json published = nlohmann::json::object();
  for (auto& [file, sum] : mine) published[file] = {{"bytes", sum.bytes}, {"xxh3", sum.xxh3}};
  const std::string text = published.dump();
  w.store->set(key + std::to_string(w.env.rank), std::vector<uint8_t>(text.begin(), text.end()));
  inject_fault(FaultPoint::save, w.env.rank, t.step, 1);
  barrier(w, "save: files");
  if (lead) {
    auto files = detail::gather_sums(w, key);
    const nlohmann::json trainer = {{"step", t.step}, {"loss_scale", t.loss_scale}, {"skipped", t.skipped}, {"good_steps", t.good_steps}};
    detail::write_durably(tmp + "/trainer.json", trainer.dump(1) + "\n");
    files["trainer.json"] = detail::sum_file(tmp + "/trainer.json", co.checksums);
    nlohmann::json m = {{"format", detail::checkpoint_format}, {"step", t.step}, {"fingerprint", std::to_string(fingerprint_v<P>)},
                        {"stages", P::num_stages},         {"world_size", w.env.world_size}, {"replicas", w.replicas},
                        {"checksum", co.checksums ? "xxh3-64" : "none"}, {"files", nlohmann::json::object()}};
    for (auto& [file, sum] : files) m["files"][file] = {{"bytes", sum.bytes}, {"xxh3", sum.xxh3}};
    detail::write_durably(tmp + "/manifest.json", m.dump(1) + "\n");  // last: the directory is complete
    inject_fault(FaultPoint::save, w.env.rank, t.step, 2);
    const std::string old = final_dir + ".old";  // saving a step again: the earlier copy goes only once this one is in place
    fs::remove_all(old);
    if (fs::exists(final_dir)) fs::rename(final_dir, old);
    fs::rename(tmp, final_dir);
    detail::sync_path(root);
    fs::remove_all(old);
    inject_fault(FaultPoint::save, w.env.rank, t.step, 3);
    detail::write_durably(root + "/latest", name + "\n");
    inject_fault(FaultPoint::save, w.env.rank, t.step, 4);
    detail::prune_checkpoints(root, co.keep, name);
    inject_fault(FaultPoint::save, w.env.rank, t.step, 5);
  }
  barrier(w, "save: done");
}

namespace detail
{
/// The checkpoint directory `path` names: itself when it holds a manifest, else the one `path/latest` names.
inline std::string locate_checkpoint(const std::string& path)
{
  if (fs::exists(path + "/manifest.json")) return path;
  const std::string latest = path + "/latest";
  if (!fs::exists(latest)) {
    if (fs::exists(path + "/trainer.json"))
      throw config_error("mpx: " + path + " is a checkpoint of an older mpx (no manifest.json); it cannot be verified: train again, or "
                         "resume with the mpx that wrote it");
    const auto complete = complete_checkpoints(path);
    if (!complete.empty())
      throw config_error("mpx: " + path + "/latest is missing" + other_checkpoints(path, ""));
    throw config_error("mpx: no checkpoint at " + path + " (neither manifest.json nor latest); pass the directory Trainer::save wrote");
  }
  std::ifstream in(latest);
  std::string name;
  std::getline(in, name);
  if (!is_step_dir_name(name))
    throw config_error("mpx: " + latest + " is garbled (it should name a step-NNNNNNNN directory)" + other_checkpoints(path, ""));
  const std::string dir = path + "/" + name;
  if (fs::exists(dir + "/manifest.json")) return dir;
  if (fs::exists(dir + ".old/manifest.json")) return dir + ".old";  // a crash while saving the same step again
  throw config_error("mpx: " + latest + " names " + name + ", which is not a complete checkpoint" + other_checkpoints(path, dir));
}

struct Manifest
{
  std::string dir, root;
  long step = 0;
  int world_size = 0;
  bool checksums = true;
  std::map<std::string, FileSum> files;
};

/// Reads and checks `dir`'s manifest against this pipeline's `fingerprint`.
inline Manifest read_manifest(const std::string& dir, const std::string& fingerprint)
{
  Manifest m;
  m.dir = dir;
  m.root = fs::path(dir).parent_path().string();
  const std::string f = dir + "/manifest.json";
  auto bad = [&](const std::string& why) { return config_error("mpx: " + f + " " + why + other_checkpoints(m.root, dir)); };
  nlohmann::json j;
  try {
    std::ifstream in(f);
    j = nlohmann::json::parse(in);
    if (j.at("format").get<int>() != checkpoint_format) throw bad("is of format " + j.at("format").dump() + ", this mpx reads format 2");
    if (j.at("fingerprint").get<std::string>() != fingerprint)
      throw config_error("mpx: the checkpoint " + dir + " was saved by a different pipeline (fingerprint " + j.at("fingerprint").get<std::string>() +
                         ", this one " + fingerprint + "); resume with the same Pipeline<...> type and layout");
    m.step = j.at("step").get<long>();
    m.world_size = j.at("world_size").get<int>();
    m.checksums = j.at("checksum").get<std::string>() != "none";
    for (auto& [name, e] : j.at("files").items()) m.files[name] = FileSum{e.at("bytes").get<std::uintmax_t>(), e.at("xxh3").get<std::string>()};
  } catch (const config_error&) {
    throw;
  } catch (const std::exception& e) {
    throw bad(std::string("is garbled (") + e.what() + ")");
  }
  return m;
}

/// Checks that `name` is in the manifest and on disk as the save left it; returns its path.
inline std::string verified(const Manifest& m, const std::string& name, const CheckpointOptions& co)
{
  const std::string f = m.dir + "/" + name;
  auto bad = [&](const std::string& why) { return config_error("mpx: " + f + " " + why + other_checkpoints(m.root, m.dir)); };
  const auto it = m.files.find(name);
  if (it == m.files.end())
    throw bad("is not in the checkpoint's manifest (saved by another layout, or with a stage frozen that trains now?)");
  if (!fs::exists(f)) throw bad("is missing (the manifest lists it)");
  const auto now = sum_file(f, co.checksums && m.checksums);
  if (now.bytes != it->second.bytes)
    throw bad("has " + std::to_string(now.bytes) + " bytes, the manifest says " + std::to_string(it->second.bytes) + " (truncated or replaced)");
  if (co.checksums && m.checksums && now.xxh3 != it->second.xxh3) {
    std::string from;
    try {  // a file from another save: say which step it holds
      const auto meta = load_safetensors(f).metadata;
      if (auto s = meta.find("step"); s != meta.end() && s->second != std::to_string(m.step)) from = " (it holds step " + s->second + ")";
    } catch (const std::exception&) {
    }
    throw bad("has checksum " + now.xxh3 + ", the manifest says " + it->second.xxh3 + ": the file changed after the save" +
              (from.empty() ? " (a flipped bit, or a file of another checkpoint)" : ", it is from another checkpoint" + from));
  }
  return f;
}

/// Copies a stage file's tensors into the stage's, after checking they are exactly the model's.
inline void load_stage_tensors(const Manifest& m, const std::string& f, std::map<std::string, at::Tensor> into, const CheckpointOptions& co)
{
  Safetensors saved;
  try {
    saved = load_safetensors(f);
  } catch (const config_error& e) {  // damage the checksums did not catch (they are off): the reader's words
    throw config_error(e.what() + other_checkpoints(m.root, m.dir));
  }
  auto bad = [&](const std::string& why) { return config_error("mpx: " + f + ": " + why + other_checkpoints(m.root, m.dir)); };
  if (saved.metadata["step"] != std::to_string(m.step))
    throw bad("saved at step " + saved.metadata["step"] + ", the manifest is of step " + std::to_string(m.step) + " (a file of another checkpoint)");
  std::string missing, unexpected, shapes, dtypes;
  for (auto& [k, t] : into) {
    auto it = saved.tensors.find(k);
    if (it == saved.tensors.end()) missing += " " + k;
    else if (it->second.sizes() != t.sizes())
      shapes += " " + k + " (saved " + c10::str(it->second.sizes()) + ", the model " + c10::str(t.sizes()) + ")";
    else if (it->second.scalar_type() != t.scalar_type() && !co.allow_cast)
      dtypes += " " + k + " (saved " + c10::toString(it->second.scalar_type()) + ", the model " + c10::toString(t.scalar_type()) + ")";
  }
  for (auto& [k, t] : saved.tensors)
    if (!into.count(k)) unexpected += " " + k;
  if (!missing.empty() || !unexpected.empty() || !shapes.empty())
    throw bad("the checkpoint does not match this model:" + (missing.empty() ? "" : " not in the file:" + missing) +
              (unexpected.empty() ? "" : "; not in the model:" + unexpected) + (shapes.empty() ? "" : "; other shapes:" + shapes) +
              "; resume with the model and config that saved it");
  if (!dtypes.empty()) throw bad("other dtypes:" + dtypes + "; load with CheckpointOptions::allow_cast to convert them");
  torch::NoGradGuard ng;
  for (auto& [k, t] : into) t.copy_(saved.tensors.at(k));
}
}  // namespace detail

/// Restores the checkpoint `path` names (see the file comment) into this rank's stages, optimizers and
/// random generator, and returns the trainer's state (`current` supplies what the file does not record).
template <PipelineType P>
TrainingState load_training_state(const World& w, const std::string& path, StageSet<P>& stages, StageOptimizers& optimizers,
                                  TrainingState current, const CheckpointOptions& co = {})
{
  const auto m = detail::read_manifest(detail::locate_checkpoint(path), std::to_string(fingerprint_v<P>));
  const std::string shard = stages.shard_suffix();
  for (int s = 0; s < P::num_stages; ++s) {  // every file is verified before any is used
    if (!stages.holds(s)) continue;
    detail::verified(m, detail::stage_file(s, shard, ".safetensors"), co);
    if (optimizers.has(s)) detail::verified(m, detail::stage_file(s, shard, ".optimizer.pt"), co);
  }
  const std::string tj = detail::verified(m, "trainer.json", co);
  const bool same_world = m.world_size == w.env.world_size && m.files.count(detail::rng_file(w.env.rank));
  const std::string rng = same_world ? detail::verified(m, detail::rng_file(w.env.rank), co) : std::string();
  nlohmann::json j;
  try {
    std::ifstream in(tj);
    j = nlohmann::json::parse(in);
    current.step = j.at("step").get<long>();
    current.loss_scale = j.value("loss_scale", current.loss_scale);
    current.skipped = j.value("skipped", 0L);
    current.good_steps = j.value("good_steps", 0L);
  } catch (const std::exception& e) {
    throw config_error("mpx: " + tj + " is garbled (" + e.what() + ")" + detail::other_checkpoints(m.root, m.dir));
  }
  if (current.step != m.step)
    throw config_error("mpx: " + tj + " is of step " + std::to_string(current.step) + ", the manifest of step " + std::to_string(m.step) +
                       detail::other_checkpoints(m.root, m.dir));
  for (int s = 0; s < P::num_stages; ++s) {
    if (!stages.holds(s)) continue;
    detail::load_stage_tensors(m, m.dir + "/" + detail::stage_file(s, shard, ".safetensors"), stages.state(s), co);
    if (optimizers.has(s)) optimizers.load(s, m.dir + "/" + detail::stage_file(s, shard, ".optimizer.pt"));
  }
  if (!rng.empty()) {
    at::Generator g = at::detail::getDefaultCPUGenerator();  // a handle: the default generator itself
    std::lock_guard<std::mutex> lock(g.mutex());
    g.set_state(load_safetensors(rng).tensors.at("cpu").clone());
  }
  return current;
}

}  // namespace mpx
