// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/checkpoint/recut.hpp
/// Finding a stage's tensors in a checkpoint by name, whatever layout saved it. `CheckpointReader` knows
/// which stage file holds each tensor name, for this rank's tensor-parallel shard and for every degree the
/// checkpoint was saved at (files verified and read on first use). A tensor saved at this rank's degree is
/// taken as it is; one saved at another degree is *re-cut*: the saved shards joined under their recorded
/// cut, then this rank's shard cut from the whole under its own (`recut`). Optimizer state moves the same
/// way, by `<parameter>/<field>`; AdamW8bit's 8-bit moments re-cut as the fp32 moments they stand for.

#include <mpx/linkage.hpp>                        // MPX_DECL, MPX_DEFINITIONS
#include <mpx/io/safetensors.hpp>                 // mpx::Safetensors
#include <mpx/runtime/checkpoint/format.hpp>      // mpx::CheckpointStage, detail::StageFileName
#include <mpx/runtime/checkpoint/manifest.hpp>    // mpx::detail::Manifest
#include <mpx/tp/cut.hpp>                         // mpx::tp::Cut, join, shard

#include <map>      // std::map
#include <string>   // std::string
#include <utility>  // std::pair
#include <vector>   // std::vector

namespace mpx::detail
{

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

/// How parameter `param` was cut in the files `pieces` (null: whole in each).
MPX_DECL const tp::Cut* saved_cut(const Manifest& m, const std::vector<std::string>& pieces, const std::string& param);
/// How parameter `param` is cut on this rank (null: whole).
MPX_DECL const tp::Cut* cut_of(const std::map<std::string, tp::Cut>& cuts, const std::string& param);
/// A tensor cut at another tensor-parallel degree, re-cut for shard `rank` of `size`: the saved shards
/// `pieces` joined under `saved` (when it was cut; a tensor without a cut dimension, a step count, is
/// whole in each), then this shard cut under `mine` (when it is cut here).
MPX_DECL at::Tensor recut(const std::vector<at::Tensor>& pieces, const tp::Cut* saved, const tp::Cut* mine, int rank, int size);

/// Stage `stage`'s tensor `k` from the checkpoint: from this rank's own shard when it is there, else re-cut
/// from the shards of another tensor-parallel degree (a globally named parameter from any stage; a buffer,
/// or a parameter named within its stage, from the same stage only: names repeat across stages, and another
/// stage's tensor of the same name and shape must never be taken silently). Undefined when absent.
MPX_DECL at::Tensor find_tensor(const Manifest& m, CheckpointReader& rd, const CheckpointStage& stage, const std::string& k, std::string& from);

/// Optimizer state `k` = "<parameter>/<field>" of stage `stage` (see `find_tensor`); 8-bit moments cut
/// another way move as the fp32 moments they hold (`m`, `v`), re-quantized by the optimizer.
MPX_DECL at::Tensor find_moment(const Manifest& m, CheckpointReader& moments, CheckpointReader& tensors, const CheckpointStage& stage, const std::string& k);


}  // namespace mpx::detail

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----
#include <mpx/errors.hpp>                       // mpx::config_error
#include <mpx/optim/adamw8bit.hpp>              // mpx::AdamW8bitOptimizer::Field, detail::dense_moment

namespace mpx::detail
{

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

MPX_DECL const tp::Cut* saved_cut(const Manifest& m, const std::vector<std::string>& pieces, const std::string& param)
{
  if (pieces.size() < 2) return nullptr;
  const auto f = m.files.find(pieces[0]);
  if (f == m.files.end()) return nullptr;
  const auto it = f->second.cuts.find(param);
  return it == f->second.cuts.end() ? nullptr : &it->second;
}

MPX_DECL const tp::Cut* cut_of(const std::map<std::string, tp::Cut>& cuts, const std::string& param)
{
  const auto it = cuts.find(param);
  return it == cuts.end() ? nullptr : &it->second;
}

MPX_DECL at::Tensor recut(const std::vector<at::Tensor>& pieces, const tp::Cut* saved, const tp::Cut* mine, int rank, int size)
{
  const at::Tensor full = saved && pieces.at(0).dim() > saved->dim ? tp::join(pieces, *saved) : pieces.at(0);
  return mine && full.dim() > mine->dim ? tp::shard(full, *mine, rank, size) : full;
}

MPX_DECL at::Tensor find_tensor(const Manifest& m, CheckpointReader& rd, const CheckpointStage& stage, const std::string& k, std::string& from)
{
  const bool anywhere = stage.global_names && !is_buffer_name(k);
  const std::string own = stage_file(stage.index, stage.shard, ".safetensors");
  if (const std::string f = rd.file_of(k); !f.empty() && (anywhere || f == own)) return from = f, rd.get(f, k);
  const auto files = rd.pieces(k, anywhere ? -1 : stage.index);
  if (files.empty()) return {};
  from = files[0];
  std::vector<at::Tensor> ps;
  for (auto& f : files) ps.push_back(rd.get(f, k));
  return recut(ps, saved_cut(m, files, k), cut_of(stage.cuts, k), stage.tp_rank, stage.tp_size);
}

MPX_DECL at::Tensor find_moment(const Manifest& m, CheckpointReader& moments, CheckpointReader& tensors, const CheckpointStage& stage,
                                const std::string& k)
{
  using Fields = AdamW8bitOptimizer;
  const std::string own = stage_file(stage.index, stage.shard, ".optimizer.safetensors");
  if (const std::string f = moments.file_of(k); !f.empty() && (stage.global_names || f == own)) return moments.get(f, k);
  const auto slash = k.rfind('/');
  if (slash == std::string::npos) return {};
  const std::string param = k.substr(0, slash), field = k.substr(slash + 1);
  if (Fields::is_quantized_field(field)) return {};  // they move as the fp32 moment they stand for (below)
  const int in_stage = stage.global_names ? -1 : stage.index;
  auto files = moments.pieces(k, in_stage);
  std::vector<at::Tensor> ps;
  for (auto& f : files) ps.push_back(moments.get(f, k));
  if (const auto [codes_field, absmax_field] = Fields::quantized_fields(field); ps.empty() && codes_field) {  // 8-bit moments: dequantized shard by shard
    const std::string codes_name = param + "/" + codes_field, absmax_name = param + "/" + absmax_field;
    const auto codes = moments.pieces(codes_name, in_stage), absmax = moments.pieces(absmax_name, in_stage);
    const auto shapes = tensors.pieces(param, in_stage);
    if (codes.empty() || codes.size() != absmax.size() || codes.size() != shapes.size()) return {};
    for (std::size_t j = 0; j < codes.size(); ++j)
      ps.push_back(dense_moment(moments.get(codes[j], codes_name), moments.get(absmax[j], absmax_name), tensors.get(shapes[j], param).sizes(),
                                field == Fields::Field::m));
    files = codes;
  }
  if (ps.empty()) return {};
  return recut(ps, saved_cut(m, files, param), cut_of(stage.cuts, param), stage.tp_rank, stage.tp_size);
}

}  // namespace mpx::detail
#endif  // MPX_DEFINITIONS
