// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/state_io.hpp
/// Saved training state, in a format that cannot be silently wrong and that moves between layouts.
/// `save_training_state(w, root, ...)` (a collective) writes one step-numbered directory under `root`:
///
/// ```
/// root/step-00000006/stage<I>[.tp<k>of<N>].safetensors            parameters and buffers (replica 0 writes them)
///                    stage<I>[...].optimizer.safetensors            its optimizer state, `<parameter>/<field>`
///                    rank<r>.rng.safetensors                        rank r's random generators (CPU, tensor-parallel split regions)
///                    trainer.json                                   step, loss scaler
///                    manifest.json                                  every file's bytes, XXH3-64 and tensor names, written last
/// root/latest                                                       "step-00000006": the newest complete checkpoint
/// ```
///
/// Parameters are saved under their global names when the stage's module declares `named_weights()`
/// (stage_set.hpp), and the optimizer state under the same names (optimizer_state.hpp; an optimizer kind
/// mpx does not know keeps LibTorch's archive, `.optimizer.pt`), so a checkpoint loads into another
/// pipeline split, schedule, replica count or tensor-parallel degree, or into one process: each rank finds
/// its tensors by name through the manifest. A tensor-parallel shard's file records how each split
/// parameter was cut (`tp::Split`: dimension, fused parts); at another degree the saved shards are joined
/// and this rank's shard cut from them, the optimizer state with them (8-bit moments through fp32).
/// `save_local_checkpoint` / `load_local_checkpoint` do the same for a model trained in one process, and
/// `export_checkpoint_weights` writes any checkpoint's whole weights as one safetensors file.
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
#include <mpx/tp/layers.hpp>                 // mpx::tp::Split, join, shard
#include <mpx/runtime/linkage.hpp>  // MPX_DECL, MPX_DEFINITIONS

#include <nlohmann/json_fwd.hpp>  // nlohmann::json (declared; defined below, for the definitions)
#include <torch/csrc/distributed/c10d/HashStore.hpp>  // c10d::HashStore (a one-process checkpoint's store)
#include <torch/torch.h>      // at::detail::getDefaultCPUGenerator
#define XXH_INLINE_ALL
#include <xxhash.h>  // XXH3_64bits (libxxhash-dev)

#include <fcntl.h>   // open
#include <unistd.h>  // fsync, read

#include <algorithm>   // std::sort, std::any_of
#include <stdexcept>   // std::invalid_argument
#include <cstdio>      // std::snprintf
#include <filesystem>  // std::filesystem
#include <fstream>     // std::ifstream, std::ofstream
#include <functional>  // std::function
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

/// One part of a model trained in one process, as a pipeline stage would hold it: its tensors under the
/// model's global names, and its optimizer (null: it does not train).
struct LocalPart
{
  std::map<std::string, at::Tensor> tensors;
  torch::optim::Optimizer* optimizer = nullptr;
};

namespace detail
{
namespace fs = std::filesystem;
inline constexpr int checkpoint_format = 3;

MPX_DECL std::string step_dir_name(long step);
MPX_DECL bool is_step_dir_name(const std::string& n);

/// fsync of a file or a directory (what makes a rename durable).
MPX_DECL void sync_path(const std::string& path);

/// Writes `text` to `path` so that a crash leaves the old content or the new, never a mix.
MPX_DECL void write_durably(const std::string& path, const std::string& text);

/// A file's size, XXH3-64 (as 16 hex digits; empty when checksums are off), the tensors it holds, and for
/// a stage file how its tensors are named and how the split ones are cut (tensor parallelism).
struct FileSum
{
  std::uintmax_t bytes = 0;
  std::string xxh3;
  std::vector<std::string> tensors;
  bool global_names = false;                ///< named by the model's global names (else within the stage)
  std::map<std::string, tp::Split> splits;  ///< the split parameters: how this file's shard was cut
};
MPX_DECL nlohmann::json to_json(const FileSum& f);
MPX_DECL FileSum from_json(const nlohmann::json& e);
MPX_DECL FileSum sum_file(const std::string& path, bool checksum);

/// The complete checkpoints under `root` (directories with a manifest), oldest first.
MPX_DECL std::vector<std::string> complete_checkpoints(const std::string& root);

/// What to do instead, for an error about checkpoint `dir` under `root`: the other complete ones.
MPX_DECL std::string other_checkpoints(const std::string& root, const std::string& dir);

inline std::string stage_file(int s, const std::string& shard, const std::string& suffix) { return "stage" + std::to_string(s) + shard + suffix; }
inline std::string rng_file(int rank) { return "rank" + std::to_string(rank) + ".rng.safetensors"; }

/// The trainable ones of a stage's named tensors (what its optimizer steps).
MPX_DECL std::map<std::string, at::Tensor> trainable_of(const std::map<std::string, at::Tensor>& tensors);

/// One stage this rank holds, as a checkpoint sees it: its tensors by name, how the split ones are cut, and
/// its optimizer. A pipeline's come from its StageSet (`slots_of`); a one-process model's from its parts.
struct StageSlot
{
  int stage = 0;
  std::string shard;  ///< "" at tensor-parallel degree 1, else ".tp<k>of<N>"
  int tp_rank = 0, tp_size = 1;
  bool global_names = false;  ///< the module names its parameters globally (they may move to another stage)
  std::map<std::string, at::Tensor> tensors;
  std::map<std::string, tp::Split> splits;
  torch::optim::Optimizer* optimizer = nullptr;                      ///< none: the stage does not train here
  std::function<void(const std::string&)> save_archive, load_archive;  ///< an optimizer kind mpx does not know
};

template <PipelineType P>
std::vector<StageSlot> slots_of(StageSet<P>& stages, StageOptimizers& optimizers)
{
  std::vector<StageSlot> out;
  for (int s = 0; s < P::num_stages; ++s) {
    if (!stages.holds(s)) continue;
    StageSlot x;
    x.stage = s, x.shard = stages.shard_suffix(), x.tp_rank = stages.tp_rank(), x.tp_size = stages.tp_size();
    x.global_names = StageSet<P>::global_names(s), x.tensors = stages.state(s), x.splits = stages.splits(s);
    if (optimizers.has(s)) {
      x.optimizer = &optimizers.at(s);
      x.save_archive = [&optimizers, s](const std::string& f) { optimizers.save(s, f); };
      x.load_archive = [&optimizers, s](const std::string& f) { optimizers.load(s, f); };
    }
    out.push_back(std::move(x));
  }
  return out;
}

/// A one-process model's parts as the stages of a checkpoint (see `save_local_checkpoint`).
MPX_DECL std::vector<StageSlot> local_slots(const std::vector<LocalPart>& parts);

/// This rank's files of a save, written into `dir`: replica 0's stages (tensors, optimizer state) and every
/// rank's random generator. Returns them with their sums and tensor names.
MPX_DECL std::map<std::string, FileSum> write_rank_files(World& w, const std::string& dir, const std::vector<StageSlot>& slots, long step,
                                                       bool checksums);

/// Every rank's files, gathered on rank 0 through the store (rank 0 calls it after the others published).
MPX_DECL std::map<std::string, FileSum> gather_sums(World& w, const std::string& key);

/// Removes all but the newest `keep` complete checkpoints up to `newest` (the one just saved), and older
/// leftovers of interrupted saves. Checkpoints of later steps (an earlier, longer run into the same root)
/// are left alone: only `latest` says which one is current.
MPX_DECL void prune_checkpoints(const std::string& root, int keep, const std::string& newest);
}  // namespace detail

namespace detail
{
/// A save (see the file comment) of `slots`, this rank's stages of a model identified by `fingerprint`.
MPX_DECL void save_checkpoint(World& w, const std::string& root, const std::vector<StageSlot>& slots, const std::string& fingerprint,
                            int num_stages, const TrainingState& t, const CheckpointOptions& co);
}  // namespace detail

/// Saves the training state as a new checkpoint under `root` (see the file comment). Every rank calls it.
template <PipelineType P>
void save_training_state(World& w, const std::string& root, StageSet<P>& stages, StageOptimizers& optimizers, const TrainingState& t,
                         const CheckpointOptions& co = {})
{
  detail::save_checkpoint(w, root, detail::slots_of(stages, optimizers), std::to_string(fingerprint_v<P>), P::num_stages, t, co);
}

namespace detail
{
/// The checkpoint directory `path` names: itself when it holds a manifest, else the one `path/latest` names.
MPX_DECL std::string locate_checkpoint(const std::string& path);

struct Manifest
{
  std::string dir, root, fingerprint;
  long step = 0;
  int world_size = 0;
  bool checksums = true;
  std::map<std::string, FileSum> files;
};

/// Reads and checks `dir`'s manifest (the pipeline's fingerprint is compared by the caller).
MPX_DECL Manifest read_manifest(const std::string& dir);

/// Checks that `name` is in the manifest and on disk as the save left it; returns its path.
MPX_DECL std::string verified(const Manifest& m, const std::string& name, const CheckpointOptions& co);

/// A stage file's name taken apart: its stage, and its tensor-parallel shard ("" or ".tp<k>of<N>", the part
/// between the stage number and `tail`, ".safetensors" or ".optimizer.safetensors"), with k and N.
struct StageFileName
{
  int stage = 0;
  std::string shard;
  int tp_rank = 0, tp_size = 1;
};
MPX_DECL std::optional<StageFileName> parse_stage_file(const std::string& name, const std::string& tail);

/// The checkpoint's stage files read by tensor name, for one rank: which file holds a tensor of this
/// rank's shard (`shard`), which files hold it cut at another tensor-parallel degree, and the files read so
/// far (verified once, kept).
class CheckpointReader
{
 public:
  CheckpointReader(const Manifest& m, std::string shard, const CheckpointOptions& co, const std::string& tail);
  /// The file that holds `name` for this rank's shard, or "".
  std::string file_of(const std::string& name) const;
  /// The files that hold `name` at one tensor-parallel degree, one per shard in rank order (the smallest
  /// degree with every shard; within stage `stage` only, when it is not -1); empty when there are none.
  std::vector<std::string> pieces(const std::string& name, int stage = -1) const;
  /// Tensor `name` of `file` (verified and read on first use).
  at::Tensor get(const std::string& file, const std::string& name);
  /// Every tensor name the checkpoint holds in these files (any shard).
  std::vector<std::string> all_names() const;

 private:
  const Manifest& m_;
  std::string shard_;
  CheckpointOptions co_;
  std::map<std::string, std::string> here_;
  std::map<std::string, std::vector<std::pair<std::string, StageFileName>>> everywhere_;
  std::map<std::string, Safetensors> open_;
};

inline bool is_buffer_name(const std::string& k) { return k.rfind("buffer.", 0) == 0; }

/// How parameter `param` was cut in the files `pieces` (null: whole in each).
MPX_DECL const tp::Split* saved_split(const Manifest& m, const std::vector<std::string>& pieces, const std::string& param);
MPX_DECL const tp::Split* split_of(const std::map<std::string, tp::Split>& splits, const std::string& param);

/// A tensor cut at another tensor-parallel degree, re-cut for shard `rank` of `size`: the saved shards
/// `pieces` joined under `saved` (when it was split; a tensor without a split dimension, a step count, is
/// whole in each), then this shard cut under `mine` (when it is split here).
MPX_DECL at::Tensor recut(const std::vector<at::Tensor>& pieces, const tp::Split* saved, const tp::Split* mine, int rank, int size);

/// Stage `slot`'s tensor `k` from the checkpoint: from this rank's own shard when it is there, else re-cut
/// from the shards of another tensor-parallel degree (a globally named parameter from any stage; a buffer,
/// or a parameter named within its stage, from the same stage only: names repeat across stages, and another
/// stage's tensor of the same name and shape must never be taken silently). Undefined when absent.
MPX_DECL at::Tensor find_tensor(const Manifest& m, CheckpointReader& rd, const StageSlot& slot, const std::string& k, std::string& from);

/// Optimizer state `k` = "<parameter>/<field>" of stage `slot` (see `find_tensor`); 8-bit moments cut
/// another way move as the fp32 moments they hold (`m`, `v`), re-quantized by the optimizer.
MPX_DECL at::Tensor find_moment(const Manifest& m, CheckpointReader& moments, CheckpointReader& tensors, const StageSlot& slot, const std::string& k);

/// " a b c" — at most 12 names, then how many more.
MPX_DECL std::string name_list(const std::vector<std::string>& names);

/// Copies a stage's tensors from the checkpoint by name, after checking they are exactly the model's; the
/// names it took go into `taken`.
MPX_DECL void load_stage_tensors(const Manifest& m, CheckpointReader& rd, const StageSlot& slot, const CheckpointOptions& co,
                               std::vector<std::string>& taken);

/// This rank's part of a load (see `load_training_state`): its stages' tensors and optimizer states by
/// name, its random generator, and the trainer's state. `taken` and `saved`: the stage tensor names it
/// took, and all the checkpoint holds (for the agreement).
MPX_DECL TrainingState load_rank_state(World& w, const Manifest& m, const std::vector<StageSlot>& slots, const std::string& fingerprint,
                                     TrainingState current, const CheckpointOptions& co, std::vector<std::string>& taken,
                                     std::vector<std::string>& saved);

/// The load's verdict, agreed by every rank through the store: each rank publishes its error or the tensor
/// names it took; rank 0 adds the checkpoint's tensors no rank took and publishes the first error; every
/// rank reads it and throws it (rank 0 only once the others have read it: it hosts the store).
MPX_DECL void agree_on_load(World& w, const std::string& key, const std::string& mine, const std::vector<std::string>& taken,
                          const std::vector<std::string>& saved, const Manifest& m);
}  // namespace detail

namespace detail
{
/// A load (see `load_training_state`) into `slots`, this rank's stages of a model identified by `fingerprint`.
MPX_DECL TrainingState load_checkpoint(World& w, const std::string& path, const std::vector<StageSlot>& slots, const std::string& fingerprint,
                                     TrainingState current, const CheckpointOptions& co);

/// A world of one process without a launcher (a one-process model's checkpoints): its own store, no group.
MPX_DECL World local_world();
}  // namespace detail

/// Restores the checkpoint `path` names (see the file comment) into this rank's stages, optimizers and
/// random generator, and returns the trainer's state (`current` supplies what the file does not record).
/// A collective: every rank calls it.
template <PipelineType P>
TrainingState load_training_state(World& w, const std::string& path, StageSet<P>& stages, StageOptimizers& optimizers, TrainingState current,
                                  const CheckpointOptions& co = {})
{
  return detail::load_checkpoint(w, path, detail::slots_of(stages, optimizers), std::to_string(fingerprint_v<P>), current, co);
}

/// Saves a model trained in one process (plain LibTorch, no pipeline) as a checkpoint under `root`, in
/// the same format: part i is written as stage i would be, so the checkpoint resumes in any pipeline
/// whose stages name their parameters globally, and `load_local_checkpoint` takes any such pipeline's.
MPX_DECL void save_local_checkpoint(const std::string& root, const std::vector<LocalPart>& parts, const TrainingState& t,
                                  const CheckpointOptions& co = {});

/// Restores the checkpoint `path` names into a model trained in one process (see `save_local_checkpoint`):
/// tensors found by global name in whatever stage, degree or replica saved them, optimizer state with them.
MPX_DECL TrainingState load_local_checkpoint(const std::string& path, const std::vector<LocalPart>& parts, TrainingState current = {},
                                           const CheckpointOptions& co = {});

/// The whole weights of the checkpoint `path` names, by global name (tensor-parallel shards joined; the
/// tensors of a stage that names them within itself, and buffers, as "stage<I>/<name>"): what
/// `export_checkpoint_weights` writes.
MPX_DECL std::map<std::string, at::Tensor> consolidated_weights(const detail::Manifest& m, const CheckpointOptions& co = {});
MPX_DECL std::map<std::string, at::Tensor> consolidated_weights(const std::string& path, const CheckpointOptions& co = {});

/// Writes the checkpoint's whole weights (`consolidated_weights`) as one safetensors file `out`, which
/// LibTorch, Python's safetensors or a few lines of Python read (docs/08).
MPX_DECL void export_checkpoint_weights(const std::string& path, const std::string& out, const CheckpointOptions& co = {});

}  // namespace mpx

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: runtime/linkage.hpp) ----
#include <nlohmann/json.hpp>  // nlohmann::json

namespace mpx::detail
{

MPX_DECL std::string step_dir_name(long step)
{
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08ld", step);
  return buf;
}

MPX_DECL bool is_step_dir_name(const std::string& n)
{
  return n.size() == 13 && n.rfind("step-", 0) == 0 && n.find_first_not_of("0123456789", 5) == std::string::npos;
}

MPX_DECL void sync_path(const std::string& path)
{
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw config_error("mpx: cannot open " + path + " to sync it: " + std::strerror(errno));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw config_error("mpx: fsync of " + path + " failed: " + std::strerror(errno) + " (disk full or failing?)");
}

MPX_DECL void write_durably(const std::string& path, const std::string& text)
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

MPX_DECL nlohmann::json to_json(const FileSum& f)
{
  nlohmann::json j = {{"bytes", f.bytes}, {"xxh3", f.xxh3}, {"tensors", f.tensors}};
  if (f.global_names) j["global_names"] = true;
  for (auto& [name, sp] : f.splits) {
    j["splits"][name] = {{"dim", sp.dim}, {"parts", sp.parts}};
    if (sp.shared()) j["splits"][name]["shares"] = sp.shares;
  }
  return j;
}

MPX_DECL FileSum from_json(const nlohmann::json& e)
{
  FileSum f;
  f.bytes = e.at("bytes").get<std::uintmax_t>(), f.xxh3 = e.at("xxh3").get<std::string>();
  f.tensors = e.value("tensors", std::vector<std::string>{}), f.global_names = e.value("global_names", false);
  if (e.contains("splits"))
    for (auto& [name, sp] : e.at("splits").items()) {
      tp::Split s{name, sp.at("dim").get<int64_t>(), sp.at("parts").get<std::vector<int64_t>>(),
                  sp.value("shares", std::vector<int64_t>{})};
      auto positive = [](const std::vector<int64_t>& v) { return std::all_of(v.begin(), v.end(), [](int64_t p) { return p > 0; }); };
      if (s.dim < 0 || s.dim > 16 || !positive(s.parts) || !positive(s.shares) ||
          (!s.shares.empty() && s.shares.size() != std::max<std::size_t>(s.parts.size(), 1)))
        throw std::invalid_argument("the split of " + name + " is not a dimension, positive part sizes and positive shares, one per part");
      f.splits[name] = std::move(s);
    }
  return f;
}

MPX_DECL FileSum sum_file(const std::string& path, bool checksum)
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

MPX_DECL std::vector<std::string> complete_checkpoints(const std::string& root)
{
  std::vector<std::string> out;
  std::error_code ec;
  for (auto& e : fs::directory_iterator(root, ec))
    if (e.is_directory() && is_step_dir_name(e.path().filename().string()) && fs::exists(e.path() / "manifest.json"))
      out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

MPX_DECL std::string other_checkpoints(const std::string& root, const std::string& dir)
{
  std::string list;
  for (auto& c : complete_checkpoints(root))
    if ((fs::path(root) / c).string() != dir) list += (list.empty() ? "" : ", ") + (fs::path(root) / c).string();
  return list.empty() ? "; no other complete checkpoint is kept under " + root
                      : "; resume from another complete checkpoint by passing its directory: " + list;
}

MPX_DECL std::map<std::string, at::Tensor> trainable_of(const std::map<std::string, at::Tensor>& tensors)
{
  std::map<std::string, at::Tensor> out;
  for (auto& [k, t] : tensors)
    if (t.requires_grad()) out[k] = t;
  return out;
}

MPX_DECL std::vector<StageSlot> local_slots(const std::vector<LocalPart>& parts)
{
  std::vector<StageSlot> out;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    StageSlot x;
    x.stage = int(i), x.global_names = true, x.tensors = parts[i].tensors, x.optimizer = parts[i].optimizer;
    x.save_archive = x.load_archive = [](const std::string& f) {
      throw config_error("mpx: " + f + ": a one-process checkpoint needs an optimizer whose state mpx names (AdamW, AdamW8bit, SGD)");
    };
    out.push_back(std::move(x));
  }
  return out;
}

MPX_DECL std::map<std::string, FileSum> write_rank_files(World& w, const std::string& dir, const std::vector<StageSlot>& slots, long step,
                                                       bool checksums)
{
  std::map<std::string, FileSum> out;
  const std::map<std::string, std::string> meta{{"format", "pt"}, {"step", std::to_string(step)}};
  auto write = [&](const std::string& name, const std::map<std::string, at::Tensor>& tensors, const StageSlot* slot) {
    save_safetensors(dir + "/" + name, tensors, meta);
    sync_path(dir + "/" + name);
    out[name] = sum_file(dir + "/" + name, checksums);
    for (auto& [k, t] : tensors) out[name].tensors.push_back(k);
    if (slot) out[name].global_names = slot->global_names, out[name].splits = slot->splits;
  };
  if (w.replica == 0)
    for (auto& slot : slots) {
      write(stage_file(slot.stage, slot.shard, ".safetensors"), slot.tensors, &slot);
      if (!slot.optimizer) continue;
      if (auto named = named_optimizer_state(*slot.optimizer, trainable_of(slot.tensors))) {
        write(stage_file(slot.stage, slot.shard, ".optimizer.safetensors"), *named, &slot);
      } else {  // an optimizer mpx does not know: LibTorch's archive (resumes only in the same layout)
        const std::string pt = stage_file(slot.stage, slot.shard, ".optimizer.pt");
        slot.save_archive(dir + "/" + pt);
        sync_path(dir + "/" + pt);
        out[pt] = sum_file(dir + "/" + pt, checksums);
      }
    }
  auto state_of = [](at::Generator g) {
    std::lock_guard<std::mutex> lock(g.mutex());
    return g.get_state();
  };
  write(rng_file(w.env.rank), {{"cpu", state_of(at::detail::getDefaultCPUGenerator())}, {"tp_split", state_of(tp::split_region_generator())}}, nullptr);
  return out;
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

MPX_DECL void save_checkpoint(World& w, const std::string& root, const std::vector<StageSlot>& slots, const std::string& fingerprint,
                            int num_stages, const TrainingState& t, const CheckpointOptions& co)
{
  static long saves = 0;  // every rank saves in the same order: the store keys of a save are never reused
  const std::string key = "mpx/save/" + std::to_string(saves++) + "/";
  const std::string name = step_dir_name(t.step), final_dir = root + "/" + name, tmp = final_dir + ".partial";
  const bool lead = w.env.rank == 0;
  if (lead) {
    fs::create_directories(root);
    fs::remove_all(tmp);  // an interrupted save of this step
    fs::create_directories(tmp);
  }
  inject_fault(FaultPoint::save, w.env.rank, t.step, 0);
  barrier(w, "save: directory");
  const auto mine = write_rank_files(w, tmp, slots, t.step, co.checksums);
  nlohmann::json published = nlohmann::json::object();
  for (auto& [file, sum] : mine) published[file] = to_json(sum);
  const std::string text = published.dump();
  w.store->set(key + std::to_string(w.env.rank), std::vector<uint8_t>(text.begin(), text.end()));
  inject_fault(FaultPoint::save, w.env.rank, t.step, 1);
  barrier(w, "save: files");
  if (lead) {
    auto files = gather_sums(w, key);
    const nlohmann::json trainer = {{"step", t.step}, {"loss_scale", t.loss_scale}, {"skipped", t.skipped}, {"good_steps", t.good_steps}};
    write_durably(tmp + "/trainer.json", trainer.dump(1) + "\n");
    files["trainer.json"] = sum_file(tmp + "/trainer.json", co.checksums);
    nlohmann::json m = {{"format", checkpoint_format}, {"step", t.step}, {"fingerprint", fingerprint},
                        {"stages", num_stages},         {"world_size", w.env.world_size}, {"replicas", w.replicas},
                        {"checksum", co.checksums ? "xxh3-64" : "none"}, {"files", nlohmann::json::object()}};
    for (auto& [file, sum] : files) m["files"][file] = to_json(sum);
    write_durably(tmp + "/manifest.json", m.dump(1) + "\n");  // last: the directory is complete
    inject_fault(FaultPoint::save, w.env.rank, t.step, 2);
    const std::string old = final_dir + ".old";  // saving a step again: the earlier copy goes only once this one is in place
    fs::remove_all(old);
    if (fs::exists(final_dir)) fs::rename(final_dir, old);
    fs::rename(tmp, final_dir);
    sync_path(root);
    fs::remove_all(old);
    inject_fault(FaultPoint::save, w.env.rank, t.step, 3);
    write_durably(root + "/latest", name + "\n");
    inject_fault(FaultPoint::save, w.env.rank, t.step, 4);
    prune_checkpoints(root, co.keep, name);
    inject_fault(FaultPoint::save, w.env.rank, t.step, 5);
  }
  barrier(w, "save: done");
}

MPX_DECL std::string locate_checkpoint(const std::string& path)
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

MPX_DECL Manifest read_manifest(const std::string& dir)
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

MPX_DECL std::string verified(const Manifest& m, const std::string& name, const CheckpointOptions& co)
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

MPX_DECL std::optional<StageFileName> parse_stage_file(const std::string& name, const std::string& tail)
{
  if (name.rfind("stage", 0) != 0 || !name.ends_with(tail) || name.size() <= 5 + tail.size()) return std::nullopt;
  std::size_t i = 5;
  while (i < name.size() && std::isdigit(static_cast<unsigned char>(name[i]))) ++i;
  if (i == 5 || i - 5 > 6) return std::nullopt;
  StageFileName out;
  out.stage = std::stoi(name.substr(5, i - 5)), out.shard = name.substr(i, name.size() - tail.size() - i);
  if (out.shard.empty()) return out;
  int k = -1, n = -1, used = 0;
  if (out.shard.size() > 20 || std::sscanf(out.shard.c_str(), ".tp%6dof%6d%n", &k, &n, &used) != 2 || used != int(out.shard.size()) || n < 1 ||
      k < 0 || k >= n)
    return std::nullopt;  // (at most 6 digits each: no overflow from a hostile name)
  out.tp_rank = k, out.tp_size = n;
  return out;
}

MPX_DECL CheckpointReader::CheckpointReader(const Manifest& m, std::string shard, const CheckpointOptions& co, const std::string& tail)
    : m_(m), shard_(std::move(shard)), co_(co)
{
  for (auto& [file, sum] : m.files) {
    const auto sf = parse_stage_file(file, tail);
    if (!sf) continue;
    for (auto& t : sum.tensors) {
      if (sf->shard == shard_) here_[t] = file;
      everywhere_[t].push_back({file, *sf});
    }
  }
}

MPX_DECL std::string CheckpointReader::file_of(const std::string& name) const
{
  auto it = here_.find(name);
  return it == here_.end() ? std::string() : it->second;
}

MPX_DECL std::vector<std::string> CheckpointReader::pieces(const std::string& name, int stage) const
{
  auto it = everywhere_.find(name);
  if (it == everywhere_.end()) return {};
  std::map<int, std::map<int, std::string>> by_degree;
  for (auto& [file, sf] : it->second)
    if (stage < 0 || sf.stage == stage) by_degree[sf.tp_size][sf.tp_rank] = file;
  for (auto& [n, files] : by_degree)
    if (int(files.size()) == n) {
      std::vector<std::string> out;
      for (auto& [k, f] : files) out.push_back(f);
      return out;
    }
  return {};
}

MPX_DECL at::Tensor CheckpointReader::get(const std::string& file, const std::string& name)
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

MPX_DECL std::vector<std::string> CheckpointReader::all_names() const
{
  std::vector<std::string> out;
  for (auto& [n, f] : everywhere_) out.push_back(n);
  return out;
}

MPX_DECL const tp::Split* saved_split(const Manifest& m, const std::vector<std::string>& pieces, const std::string& param)
{
  if (pieces.size() < 2) return nullptr;
  const auto f = m.files.find(pieces[0]);
  if (f == m.files.end()) return nullptr;
  const auto it = f->second.splits.find(param);
  return it == f->second.splits.end() ? nullptr : &it->second;
}

MPX_DECL const tp::Split* split_of(const std::map<std::string, tp::Split>& splits, const std::string& param)
{
  const auto it = splits.find(param);
  return it == splits.end() ? nullptr : &it->second;
}

MPX_DECL at::Tensor recut(const std::vector<at::Tensor>& pieces, const tp::Split* saved, const tp::Split* mine, int rank, int size)
{
  const at::Tensor full = saved && pieces.at(0).dim() > saved->dim ? tp::join(pieces, *saved) : pieces.at(0);
  return mine && full.dim() > mine->dim ? tp::shard(full, *mine, rank, size) : full;
}

MPX_DECL at::Tensor find_tensor(const Manifest& m, CheckpointReader& rd, const StageSlot& slot, const std::string& k, std::string& from)
{
  const bool anywhere = slot.global_names && !is_buffer_name(k);
  const std::string own = stage_file(slot.stage, slot.shard, ".safetensors");
  if (const std::string f = rd.file_of(k); !f.empty() && (anywhere || f == own)) return from = f, rd.get(f, k);
  const auto files = rd.pieces(k, anywhere ? -1 : slot.stage);
  if (files.empty()) return {};
  from = files[0];
  std::vector<at::Tensor> ps;
  for (auto& f : files) ps.push_back(rd.get(f, k));
  return recut(ps, saved_split(m, files, k), split_of(slot.splits, k), slot.tp_rank, slot.tp_size);
}

MPX_DECL at::Tensor find_moment(const Manifest& m, CheckpointReader& moments, CheckpointReader& tensors, const StageSlot& slot, const std::string& k)
{
  const std::string own = stage_file(slot.stage, slot.shard, ".optimizer.safetensors");
  if (const std::string f = moments.file_of(k); !f.empty() && (slot.global_names || f == own)) return moments.get(f, k);
  const auto slash = k.rfind('/');
  if (slash == std::string::npos) return {};
  const std::string param = k.substr(0, slash), field = k.substr(slash + 1);
  if (field == "m8" || field == "m8max" || field == "v8" || field == "v8max") return {};  // as `m`, `v` (below)
  const int stage = slot.global_names ? -1 : slot.stage;
  auto files = moments.pieces(k, stage);
  std::vector<at::Tensor> ps;
  for (auto& f : files) ps.push_back(moments.get(f, k));
  if (ps.empty() && (field == "m" || field == "v")) {  // 8-bit moments: dequantized shard by shard
    const auto codes = moments.pieces(param + "/" + field + "8", stage), absmax = moments.pieces(param + "/" + field + "8max", stage);
    const auto shapes = tensors.pieces(param, stage);
    if (codes.empty() || codes.size() != absmax.size() || codes.size() != shapes.size()) return {};
    for (std::size_t j = 0; j < codes.size(); ++j)
      ps.push_back(dense_moment(moments.get(codes[j], param + "/" + field + "8"), moments.get(absmax[j], param + "/" + field + "8max"),
                                tensors.get(shapes[j], param).sizes(), field == "m"));
    files = codes;
  }
  if (ps.empty()) return {};
  return recut(ps, saved_split(m, files, param), split_of(slot.splits, param), slot.tp_rank, slot.tp_size);
}

MPX_DECL std::string name_list(const std::vector<std::string>& names)
{
  std::string out;
  for (std::size_t i = 0; i < names.size() && i < 12; ++i) out += " " + names[i];
  if (names.size() > 12) out += " ... and " + std::to_string(names.size() - 12) + " more";
  return out;
}

MPX_DECL void load_stage_tensors(const Manifest& m, CheckpointReader& rd, const StageSlot& slot, const CheckpointOptions& co,
                               std::vector<std::string>& taken)
{
  std::vector<std::string> missing, shapes, dtypes;
  std::set<std::string> files;  // those the differences are in
  std::map<std::string, at::Tensor> found;
  for (auto& [k, t] : slot.tensors) {
    at::Tensor saved;
    std::string from;
    try {
      saved = find_tensor(m, rd, slot, k, from);
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
  for (auto& [k, t] : slot.tensors) t.copy_(found.at(k)), taken.push_back(k);
}

MPX_DECL TrainingState load_rank_state(World& w, const Manifest& m, const std::vector<StageSlot>& slots, const std::string& fingerprint,
                                     TrainingState current, const CheckpointOptions& co, std::vector<std::string>& taken,
                                     std::vector<std::string>& saved)
{
  const bool same_model = m.fingerprint == fingerprint;
  for (auto& slot : slots)
    if (!same_model && !slot.global_names)
      throw config_error("mpx: the checkpoint " + m.dir + " was saved by a different pipeline (fingerprint " + m.fingerprint + ", this one " +
                         fingerprint + ") and stage " + std::to_string(slot.stage) +
                         "'s module names its parameters only within the stage; resume with the same Pipeline<...> type and layout, "
                         "or give the module named_weights() (global names) so that checkpoints move between layouts");
  const std::string shard = slots.empty() ? std::string() : slots[0].shard;
  CheckpointReader tensors(m, shard, co, ".safetensors"), moments(m, shard, co, ".optimizer.safetensors");
  saved = tensors.all_names();
  for (auto& slot : slots) {
    load_stage_tensors(m, tensors, slot, co, taken);
    if (!slot.optimizer) continue;
    if (knows_optimizer(*slot.optimizer)) {
      restore_optimizer_state(*slot.optimizer, trainable_of(slot.tensors), [&](const std::string& k) { return find_moment(m, moments, tensors, slot, k); });
    } else {  // LibTorch's archive: the same layout only
      const std::string pt = stage_file(slot.stage, slot.shard, ".optimizer.pt");
      if (!same_model) throw config_error("mpx: " + m.dir + "/" + pt + ": this optimizer's state is a LibTorch archive, which loads only into the pipeline that saved it");
      slot.load_archive(verified(m, pt, co));
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
    restore(tp::split_region_generator(), "tp_split");
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

MPX_DECL TrainingState load_checkpoint(World& w, const std::string& path, const std::vector<StageSlot>& slots, const std::string& fingerprint,
                                     TrainingState current, const CheckpointOptions& co)
{
  static long loads = 0;  // every rank loads in the same order: the store keys of a load are never reused
  const std::string key = "mpx/load/" + std::to_string(loads++) + "/";
  std::string error;
  std::vector<std::string> taken, saved;
  std::optional<Manifest> m;
  try {
    m = read_manifest(locate_checkpoint(path));
    current = load_rank_state(w, *m, slots, fingerprint, current, co, taken, saved);
  } catch (const config_error& e) {
    error = e.what();
  } catch (const std::exception& e) {  // a tensor op on what the files hold (shards that do not join): every rank hears it
    error = "mpx: the checkpoint at " + path + " cannot be loaded into this model: " + std::string(e.what()).substr(0, 400);
  }
  agree_on_load(w, key, error, taken, saved, m ? *m : Manifest{});
  return current;
}

MPX_DECL World local_world()
{
  World w;
  w.store = c10::make_intrusive<c10d::HashStore>();
  return w;
}

}  // namespace mpx::detail

namespace mpx
{

MPX_DECL void save_local_checkpoint(const std::string& root, const std::vector<LocalPart>& parts, const TrainingState& t,
                                  const CheckpointOptions& co)
{
  auto w = detail::local_world();
  detail::save_checkpoint(w, root, detail::local_slots(parts), "one-process", int(parts.size()), t, co);
}

MPX_DECL TrainingState load_local_checkpoint(const std::string& path, const std::vector<LocalPart>& parts, TrainingState current,
                                           const CheckpointOptions& co)
{
  auto w = detail::local_world();
  return detail::load_checkpoint(w, path, detail::local_slots(parts), "one-process", current, co);
}

MPX_DECL std::map<std::string, at::Tensor> consolidated_weights(const detail::Manifest& m, const CheckpointOptions& co)
{
  detail::CheckpointReader rd(m, "", co, ".safetensors");
  std::map<std::string, at::Tensor> out;
  for (auto& [file, sum] : m.files) {
    const auto sf = detail::parse_stage_file(file, ".safetensors");
    if (!sf || sf->tp_rank != 0) continue;  // each tensor once: from its first shard's file
    for (auto& k : sum.tensors) {
      const bool global = sum.global_names && !detail::is_buffer_name(k);
      const auto files = rd.pieces(k, global ? -1 : sf->stage);
      if (files.empty())
        throw config_error("mpx: the checkpoint " + m.dir + " lacks a tensor-parallel shard of " + k + detail::other_checkpoints(m.root, m.dir));
      std::vector<at::Tensor> ps;
      for (auto& f : files) ps.push_back(rd.get(f, k));
      out[global ? k : "stage" + std::to_string(sf->stage) + "/" + k] = detail::recut(ps, detail::saved_split(m, files, k), nullptr, 0, 1);
    }
  }
  return out;
}

MPX_DECL std::map<std::string, at::Tensor> consolidated_weights(const std::string& path, const CheckpointOptions& co)
{
  return consolidated_weights(detail::read_manifest(detail::locate_checkpoint(path)), co);
}

MPX_DECL void export_checkpoint_weights(const std::string& path, const std::string& out, const CheckpointOptions& co)
{
  const auto m = detail::read_manifest(detail::locate_checkpoint(path));
  save_safetensors(out, consolidated_weights(m, co), {{"format", "pt"}, {"step", std::to_string(m.step)}});
}

}  // namespace mpx
#endif  // MPX_DEFINITIONS
