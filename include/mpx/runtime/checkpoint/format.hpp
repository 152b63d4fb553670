// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/checkpoint/format.hpp
/// A checkpoint on disk: one step-numbered directory under a root, its files named for what they hold.
///
/// ```
/// root/step-00000006/stage<I>[.tp<k>of<N>].safetensors            parameters and buffers (replica 0 writes them)
///                    stage<I>[...].optimizer.safetensors            its optimizer state, `<parameter>/<field>`
///                    rank<r>.rng.safetensors                        rank r's random generators (CPU, tensor-parallel sharded regions)
///                    trainer.json                                   step, loss scaler
///                    manifest.json                                  every file's bytes, XXH3-64 and tensor names, written last
/// root/latest                                                       "step-00000006": the newest complete checkpoint
/// ```
///
/// Parameters are saved under their global names when the stage's module declares `named_weights()`, and
/// the optimizer state under the same names (optimizer_state.hpp; an optimizer kind mpx does not know keeps
/// LibTorch's archive, `.optimizer.pt`), so a checkpoint loads into another pipeline partition, schedule,
/// replica count or tensor-parallel degree, or into one process (recut.hpp). A stage as a checkpoint sees
/// it is a `CheckpointStage`; the rooms beside this one: manifest.hpp (sums and verification), phases.hpp
/// and save.hpp (the save protocol), load.hpp, recut.hpp, local.hpp (one-process models), export.hpp.
/// Files reach the disk through `write_durably` and `sync_path`: a crash leaves the old content or the new.

#include <mpx/linkage.hpp>  // MPX_DECL, MPX_DEFINITIONS
#include <mpx/tp/cut.hpp>   // mpx::tp::Cut

#include <torch/optim/optimizer.h>  // torch::optim::Optimizer

#include <functional>  // std::function
#include <map>         // std::map
#include <optional>    // std::optional
#include <string>      // std::string
#include <vector>      // std::vector

namespace mpx
{

/// How checkpoints are written and read.
struct CheckpointOptions
{
  int keep = 2;             ///< complete checkpoints kept (the newest; older ones are pruned after a save)
  bool checksums = true;    ///< xxHash (XXH3-64) of every file in the manifest, verified on load; off: sizes only
  bool allow_cast = false;  ///< load a tensor saved in another dtype, converted (else an error names both dtypes)
  /// Only the parameters that train (require a gradient) and their optimizer state, no frozen parameter
  /// nor buffer: a LoRA run's adapters (lora/adapters.hpp), a small file. The frozen rest is the program's
  /// to rebuild as it started (from its base weights) before it loads; the manifest records the choice,
  /// and a load with the other one stops, naming it.
  bool trainable_only = false;
};

/// The trainer's own state besides modules and optimizers.
struct TrainingState
{
  long step = 0;          ///< optimizer steps done
  double loss_scale = 1;  ///< the loss scaler's current scale
  long skipped = 0;       ///< steps skipped for inf/NaN gradients
  long good_steps = 0;    ///< good steps since the scale last changed
};

/// One stage this rank holds, as a checkpoint sees it: its tensors by name, how the cut ones are cut, and
/// its optimizer. A pipeline's come from its StageSet (runtime/training_state.hpp); a one-process model's
/// from its parts (local.hpp).
struct CheckpointStage
{
  int index = 0;      ///< the stage's index in the pipeline
  std::string shard;  ///< "" at tensor-parallel degree 1, else ".tp<k>of<N>"
  int tp_rank = 0, tp_size = 1;
  bool global_names = false;  ///< the module names its parameters globally (they may move to another stage)
  std::map<std::string, at::Tensor> tensors;
  std::map<std::string, tp::Cut> cuts;
  torch::optim::Optimizer* optimizer = nullptr;                        ///< none: the stage does not train here
  std::function<void(const std::string&)> save_archive, load_archive;  ///< an optimizer kind mpx does not know
};

namespace detail
{
inline constexpr int checkpoint_format = 3;

/// "step-00000006".
MPX_DECL std::string step_dir_name(long step);
MPX_DECL bool is_step_dir_name(const std::string& n);

inline std::string stage_file(int s, const std::string& shard, const std::string& suffix) { return "stage" + std::to_string(s) + shard + suffix; }
inline std::string rng_file(int rank) { return "rank" + std::to_string(rank) + ".rng.safetensors"; }
inline bool is_buffer_name(const std::string& k) { return k.rfind("buffer.", 0) == 0; }

/// A stage file's name taken apart: its stage, and its tensor-parallel shard ("" or ".tp<k>of<N>", the part
/// between the stage number and `tail`, ".safetensors" or ".optimizer.safetensors"), with k and N.
struct StageFileName
{
  int stage = 0;
  std::string shard;
  int tp_rank = 0, tp_size = 1;
};
MPX_DECL std::optional<StageFileName> parse_stage_file(const std::string& name, const std::string& tail);

/// The trainable ones of a stage's named tensors (what its optimizer steps).
MPX_DECL std::map<std::string, at::Tensor> trainable_of(const std::map<std::string, at::Tensor>& tensors);

/// What of `stages` a checkpoint under `co` holds: all of them, or with `trainable_only` their trainable
/// tensors (and those tensors' cuts).
MPX_DECL std::vector<CheckpointStage> kept_by(const CheckpointOptions& co, std::vector<CheckpointStage> stages);

/// fsync of a file or a directory (what makes a rename durable).
MPX_DECL void sync_path(const std::string& path);

/// Writes `text` to `path` so that a crash leaves the old content or the new, never a mix.
MPX_DECL void write_durably(const std::string& path, const std::string& text);
}  // namespace detail

}  // namespace mpx

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----
#include <mpx/errors.hpp>  // mpx::config_error

#include <fcntl.h>   // open
#include <unistd.h>  // fsync, close

#include <cctype>      // std::isdigit
#include <cerrno>      // errno
#include <cstdio>      // std::snprintf, std::sscanf
#include <cstring>     // std::strerror
#include <filesystem>  // std::filesystem
#include <fstream>     // std::ofstream

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

MPX_DECL std::map<std::string, at::Tensor> trainable_of(const std::map<std::string, at::Tensor>& tensors)
{
  std::map<std::string, at::Tensor> out;
  for (auto& [k, t] : tensors)
    if (t.requires_grad()) out[k] = t;
  return out;
}

MPX_DECL std::vector<CheckpointStage> kept_by(const CheckpointOptions& co, std::vector<CheckpointStage> stages)
{
  if (!co.trainable_only) return stages;
  for (auto& s : stages) {
    s.tensors = trainable_of(s.tensors);
    for (auto it = s.cuts.begin(); it != s.cuts.end();) it = s.tensors.count(it->first) ? std::next(it) : s.cuts.erase(it);
  }
  return stages;
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
  std::filesystem::rename(tmp, path);
  sync_path(std::filesystem::path(path).parent_path().string());
}

}  // namespace mpx::detail
#endif  // MPX_DEFINITIONS
