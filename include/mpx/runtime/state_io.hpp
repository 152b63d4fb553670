// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/state_io.hpp
/// Saved training state, in a format that cannot be silently wrong and that moves between layouts.
/// `save_training_state(w, root, ...)` (a collective) writes one step-numbered directory under `root`:
///
/// ```
/// root/step-00000006/stage<I>[.tp<k>of<N>].safetensors            parameters and buffers (replica 0 writes them)
///                    stage<I>[...].optimizer.safetensors            its optimizer state, `<parameter>/<field>`
///                    rank<r>.rng.safetensors                        rank r's random generator
///                    trainer.json                                   step, loss scaler
///                    manifest.json                                  every file's bytes, XXH3-64 and tensor names, written last
/// root/latest                                                       "step-00000006": the newest complete checkpoint
/// ```
///
/// Parameters are saved under their global names when the stage's module declares `named_weights()`
/// (stage_set.hpp), and the optimizer state under the same names (optimizer_state.hpp; an optimizer kind
/// mpx does not know keeps LibTorch's archive, `.optimizer.pt`), so a checkpoint loads into another
/// pipeline split, schedule or replica count: each rank finds its tensors by name through the manifest.
///
/// The phases of a save (a crash between any two system calls leaves a complete checkpoint that `latest`
/// names): 0 `step-N.partial/` made; 1 this rank's files written and fsynced; 2 the manifest written
/// (fsynced, then renamed into place); 3 `step-N.partial` renamed to `step-N`, the root fsynced; 4 `latest`
/// replaced the same way; 5 all but the newest `keep` checkpoints pruned. (`save<k>` faults, faults.hpp,
/// crash after phase k.)
///
/// `load_training_state(w, path, ...)` (a collective) reads `path` when it is one checkpoint (it holds a
/// manifest), else the one `path/latest` names. Before anything is used: the manifest parses; a checkpoint
/// of another pipeline is accepted only when this rank's stages name their parameters globally; each file
/// this rank reads exists with the manifest's size and checksum and was saved at the manifest's step; its
/// tensors are exactly the model's, over all ranks (an error lists the missing, unused and mis-shaped
/// ones); dtypes match unless `allow_cast`. Every rank stops with the same `config_error`, naming the file
/// and the fix with the other complete checkpoints to resume from; a failed load writes no file.

#include <mpx/fingerprint.hpp>              // mpx::fingerprint_v
#include <mpx/io/safetensors.hpp>           // mpx::save_safetensors, mpx::load_safetensors
#include <mpx/pipeline.hpp>                 // mpx::PipelineType
#include <mpx/runtime/errors.hpp>           // mpx::config_error
#include <mpx/runtime/faults.hpp>           // mpx::inject_fault
#include <mpx/runtime/optimizer_state.hpp>  // mpx::named_optimizer_state, mpx::restore_optimizer_state
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
#include <cctype>      // std::isdigit
#include <map>         // std::map
#include <optional>    // std::optional
#include <set>         // std::set
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
inline constexpr int checkpoint_format = 3;

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

/// A file's size, XXH3-64 (as 16 hex digits; empty when checksums are off) and the tensors it holds.
struct FileSum
{
  std::uintmax_t bytes = 0;
  std::string xxh3;
  std::vector<std::string> tensors;
};
inline nlohmann::json to_json(const FileSum& f) { return {{"bytes", f.bytes}, {"xxh3", f.xxh3}, {"tensors", f.tensors}}; }
inline FileSum from_json(const nlohmann::json& e)
{
  return {e.at("bytes").get<std::uintmax_t>(), e.at("xxh3").get<std::string>(), e.value("tensors", std::vector<std::string>{})};
}
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

/// The trainable ones of a stage's named tensors (what its optimizer steps).
inline std::map<std::string, at::Tensor> trainable_of(const std::map<std::string, at::Tensor>& tensors)
{
  std::map<std::string, at::Tensor> out;
  for (auto& [k, t] : tensors)
    if (t.requires_grad()) out[k] = t;
  return out;
}

/// This rank's files of a save, written into `dir`: replica 0's stages (tensors, optimizer state) and every
/// rank's random generator. Returns them with their sums and tensor names.
template <PipelineType P>
std::map<std::string, FileSum> write_rank_files(World& w, const std::string& dir, StageSet<P>& stages, StageOptimizers& optimizers,
                                                long step, bool checksums)
{
  std::map<std::string, FileSum> out;
  const std::map<std::string, std::string> meta{{"format", "pt"}, {"step", std::to_string(step)}};
  auto write = [&](const std::string& name, const std::map<std::string, at::Tensor>& tensors) {
    save_safetensors(dir + "/" + name, tensors, meta);
    sync_path(dir + "/" + name);
    out[name] = sum_file(dir + "/" + name, checksums);
    for (auto& [k, t] : tensors) out[name].tensors.push_back(k);
  };
  if (w.replica == 0)
    for (int s = 0; s < P::num_stages; ++s) {
      if (!stages.holds(s)) continue;
      const std::string shard = stages.shard_suffix();  // a tensor-parallel rank's shard: ".tp<k>of<N>"
      const auto tensors = stages.state(s);
      write(stage_file(s, shard, ".safetensors"), tensors);
      if (!optimizers.has(s)) continue;
      if (auto named = named_optimizer_state(optimizers.at(s), trainable_of(tensors))) {
        write(stage_file(s, shard, ".optimizer.safetensors"), *named);
      } else {  // an optimizer mpx does not know: LibTorch's archive (resumes only in the same layout)
        const std::string pt = stage_file(s, shard, ".optimizer.pt");
        optimizers.save(s, dir + "/" + pt);
        sync_path(dir + "/" + pt);
        out[pt] = sum_file(dir + "/" + pt, checksums);
      }
    }
  at::Generator g = at::detail::getDefaultCPUGenerator();
  at::Tensor rng;
  {
    std::lock_guard<std::mutex> lock(g.mutex());
    rng = g.get_state();
  }
  write(rng_file(w.env.rank), {{"cpu", rng}});
  return out;
}

/// Every rank's files, gathered on rank 0 through the store (rank 0 calls it after the others published).
inline std::map<std::string, FileSum> gather_sums(World& w, const std::string& key)
{
  std::map<std::string, FileSum> all;
  for (int r = 0; r < w.env.world_size; ++r) {
    const auto v = w.store->get(key + std::to_string(r));
    const auto files = nlohmann::json::parse(std::string(v.begin(), v.end()));  // kept: items() views it
    for (auto& [name, e] : files.items()) all[name] = from_json(e);
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
  for (auto& [file, sum] : mine) published[file] = detail::to_json(sum);
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
    for (auto& [file, sum] : files) m["files"][file] = detail::to_json(sum);
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
  std::string dir, root, fingerprint;
  long step = 0;
  int world_size = 0;
  bool checksums = true;
  std::map<std::string, FileSum> files;
};

/// Reads and checks `dir`'s manifest (the pipeline's fingerprint is compared by the caller).
inline Manifest read_manifest(const std::string& dir)
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
    if (j.at("format").get<int>() != checkpoint_format)
      throw bad("is of format " + j.at("format").dump() + ", this mpx reads format " + std::to_string(checkpoint_format));
    m.fingerprint = j.at("fingerprint").get<std::string>();
    m.step = j.at("step").get<long>();
    m.world_size = j.at("world_size").get<int>();
    m.checksums = j.at("checksum").get<std::string>() != "none";
    for (auto& [name, e] : j.at("files").items()) m.files[name] = from_json(e);
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

/// The tensor-parallel shard a stage file holds: "" for a whole stage, ".tp0of2" (the part between the
/// stage number and ".safetensors" / ".optimizer.safetensors"); nullopt for a file that is no stage file.
inline std::optional<std::string> stage_file_shard(const std::string& name, const std::string& tail)
{
  if (name.rfind("stage", 0) != 0 || !name.ends_with(tail) || name.size() <= 5 + tail.size()) return std::nullopt;
  std::size_t i = 5;
  while (i < name.size() && std::isdigit(static_cast<unsigned char>(name[i]))) ++i;
  const std::string shard = name.substr(i, name.size() - tail.size() - i);
  if (i == 5 || (!shard.empty() && shard.rfind(".tp", 0) != 0) || shard.find(".optimizer") != std::string::npos) return std::nullopt;
  return shard;
}

/// The checkpoint's stage files read by tensor name, for one rank: which file holds a tensor of this
/// rank's shard (`shard`), and the files read so far (verified once, kept mapped).
class CheckpointReader
{
 public:
  CheckpointReader(const Manifest& m, std::string shard, const CheckpointOptions& co, const std::string& tail)
      : m_(m), shard_(std::move(shard)), co_(co)
  {
    for (auto& [file, sum] : m.files) {
      const auto sh = stage_file_shard(file, tail);
      if (!sh) continue;
      for (auto& t : sum.tensors) (*sh == shard_ ? here_ : elsewhere_)[t] = file;
    }
  }
  /// The file that holds `name` for this rank, or "" (and in `other`, a file of another shard that does).
  std::string file_of(const std::string& name, std::string* other = nullptr) const
  {
    if (auto it = here_.find(name); it != here_.end()) return it->second;
    if (auto it = elsewhere_.find(name); other && it != elsewhere_.end()) *other = it->second;
    return {};
  }
  /// Tensor `name` of `file` (verified and read on first use).
  at::Tensor get(const std::string& file, const std::string& name)
  {
    auto it = open_.find(file);
    if (it == open_.end()) {
      const std::string f = verified(m_, file, co_);
      Safetensors st;
      try {
        st = load_safetensors(f);
      } catch (const config_error& e) {  // damage the checksums did not catch (they are off): the reader's words
        throw config_error(e.what() + other_checkpoints(m_.root, m_.dir));
      }
      if (st.metadata["step"] != std::to_string(m_.step))
        throw config_error("mpx: " + f + ": saved at step " + st.metadata["step"] + ", the manifest is of step " + std::to_string(m_.step) +
                           " (a file of another checkpoint)" + other_checkpoints(m_.root, m_.dir));
      it = open_.emplace(file, std::move(st)).first;
    }
    auto t = it->second.tensors.find(name);
    return t == it->second.tensors.end() ? at::Tensor() : t->second;
  }
  /// Every tensor name the checkpoint holds in these files (any shard).
  std::vector<std::string> all_names() const
  {
    std::vector<std::string> out;
    for (auto& [n, f] : here_) out.push_back(n);
    for (auto& [n, f] : elsewhere_)
      if (!here_.count(n)) out.push_back(n);
    return out;
  }

 private:
  const Manifest& m_;
  std::string shard_;
  CheckpointOptions co_;
  std::map<std::string, std::string> here_, elsewhere_;
  std::map<std::string, Safetensors> open_;
};

/// The file tensor `k` of a stage is read from: by name anywhere in the checkpoint when the stage's module
/// names its parameters globally, else (and for buffers, whose names are the module's) only in the stage's
/// own file `own` — module names repeat across stages, and another stage's tensor of the same name and
/// shape must never be taken silently.
inline std::string locate(const Manifest& m, const CheckpointReader& rd, const std::string& k, const std::string& own, bool global,
                          std::string* other = nullptr)
{
  if (global && k.rfind("buffer.", 0) != 0) return rd.file_of(k, other);
  auto it = m.files.find(own);
  if (it == m.files.end()) return {};
  return std::find(it->second.tensors.begin(), it->second.tensors.end(), k) != it->second.tensors.end() ? own : std::string();
}

/// " a b c" — at most 12 names, then how many more.
inline std::string name_list(const std::vector<std::string>& names)
{
  std::string out;
  for (std::size_t i = 0; i < names.size() && i < 12; ++i) out += " " + names[i];
  if (names.size() > 12) out += " ... and " + std::to_string(names.size() - 12) + " more";
  return out;
}

/// Copies a stage's tensors from the checkpoint by name, after checking they are exactly the model's; the
/// names it took go into `taken`.
inline void load_stage_tensors(const Manifest& m, CheckpointReader& rd, std::map<std::string, at::Tensor> into, const CheckpointOptions& co,
                               std::vector<std::string>& taken, const std::string& own, bool global)
{
  std::vector<std::string> missing, shapes, dtypes, split;
  std::set<std::string> files;  // those the differences are in
  std::map<std::string, at::Tensor> found;
  for (auto& [k, t] : into) {
    std::string other;
    const std::string file = locate(m, rd, k, own, global, &other);
    if (file.empty()) {
      if (other.empty()) missing.push_back(k);
      else split.push_back(k + " (in " + other + ")"), files.insert(other);
      continue;
    }
    at::Tensor saved = rd.get(file, k);
    if (saved.sizes() != t.sizes())
      shapes.push_back(k + " (saved " + c10::str(saved.sizes()) + ", the model " + c10::str(t.sizes()) + ")"), files.insert(file);
    else if (saved.scalar_type() != t.scalar_type() && !co.allow_cast)
      dtypes.push_back(k + " (saved " + std::string(c10::toString(saved.scalar_type())) + ", the model " + c10::toString(t.scalar_type()) + ")"),
          files.insert(file);
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
  if (!split.empty())
    throw bad("holds these tensors split by another tensor-parallel degree:" + name_list(split) +
              "; resume at the degree that saved them (moving between degrees is not supported yet), or start from the exported whole weights");
  if (!missing.empty() || !shapes.empty())
    throw bad("does not match this model:" + (missing.empty() ? "" : " not in the checkpoint:" + name_list(missing)) +
              (shapes.empty() ? "" : (missing.empty() ? "" : ";") + std::string(" other shapes:") + name_list(shapes)) +
              "; resume with the model and config that saved it");
  if (!dtypes.empty()) throw bad("has other dtypes:" + name_list(dtypes) + "; load with CheckpointOptions::allow_cast to convert them");
  torch::NoGradGuard ng;
  for (auto& [k, t] : into) t.copy_(found.at(k)), taken.push_back(k);
}

/// This rank's part of a load (see `load_training_state`): its stages' tensors and optimizer states by
/// name, its random generator, and the trainer's state. `taken` and `saved`: the stage tensor names it
/// took, and all the checkpoint holds (for the agreement).
template <PipelineType P>
TrainingState load_rank_state(World& w, const Manifest& m, StageSet<P>& stages, StageOptimizers& optimizers, TrainingState current,
                              const CheckpointOptions& co, std::vector<std::string>& taken, std::vector<std::string>& saved)
{
  const bool same_pipeline = m.fingerprint == std::to_string(fingerprint_v<P>);
  for (int s = 0; s < P::num_stages; ++s)
    if (stages.holds(s) && !same_pipeline && !StageSet<P>::global_names(s))
      throw config_error("mpx: the checkpoint " + m.dir + " was saved by a different pipeline (fingerprint " + m.fingerprint + ", this one " +
                         std::to_string(fingerprint_v<P>) + ") and stage " + std::to_string(s) +
                         "'s module names its parameters only within the stage; resume with the same Pipeline<...> type and layout, "
                         "or give the module named_weights() (global names) so that checkpoints move between layouts");
  const std::string shard = stages.shard_suffix();
  CheckpointReader tensors(m, shard, co, ".safetensors"), moments(m, shard, co, ".optimizer.safetensors");
  saved = tensors.all_names();
  for (int s = 0; s < P::num_stages; ++s) {
    if (!stages.holds(s)) continue;
    const auto state = stages.state(s);
    const bool global = StageSet<P>::global_names(s);
    load_stage_tensors(m, tensors, state, co, taken, stage_file(s, shard, ".safetensors"), global);
    if (!optimizers.has(s)) continue;
    if (named_optimizer_state(optimizers.at(s), {})) {
      restore_optimizer_state(optimizers.at(s), trainable_of(state), [&](const std::string& k) {
        const std::string file = locate(m, moments, k, stage_file(s, shard, ".optimizer.safetensors"), global);
        return file.empty() ? at::Tensor() : moments.get(file, k);
      });
    } else {  // LibTorch's archive: the same layout only
      const std::string pt = stage_file(s, shard, ".optimizer.pt");
      if (!same_pipeline) throw config_error("mpx: " + m.dir + "/" + pt + ": this optimizer's state is a LibTorch archive, which loads only into the pipeline that saved it");
      optimizers.load(s, verified(m, pt, co));
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
    at::Generator g = at::detail::getDefaultCPUGenerator();  // a handle: the default generator itself
    std::lock_guard<std::mutex> lock(g.mutex());
    g.set_state(st.tensors.at("cpu").clone());
  }
  return current;
}

/// The load's verdict, agreed by every rank through the store: each rank publishes its error or the tensor
/// names it took; rank 0 adds the checkpoint's tensors no rank took and publishes the first error; every
/// rank reads it and throws it (rank 0 only once the others have read it: it hosts the store).
inline void agree_on_load(World& w, const std::string& key, const std::string& mine, const std::vector<std::string>& taken,
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
}  // namespace detail

/// Restores the checkpoint `path` names (see the file comment) into this rank's stages, optimizers and
/// random generator, and returns the trainer's state (`current` supplies what the file does not record).
/// A collective: every rank calls it.
template <PipelineType P>
TrainingState load_training_state(World& w, const std::string& path, StageSet<P>& stages, StageOptimizers& optimizers, TrainingState current,
                                  const CheckpointOptions& co = {})
{
  static long loads = 0;  // every rank loads in the same order: the store keys of a load are never reused
  const std::string key = "mpx/load/" + std::to_string(loads++) + "/";
  std::string error;
  std::vector<std::string> taken, saved;
  std::optional<detail::Manifest> m;
  try {
    m = detail::read_manifest(detail::locate_checkpoint(path));
    current = detail::load_rank_state(w, *m, stages, optimizers, current, co, taken, saved);
  } catch (const config_error& e) {
    error = e.what();
  }
  detail::agree_on_load(w, key, error, taken, saved, m ? *m : detail::Manifest{});
  return current;
}

}  // namespace mpx
