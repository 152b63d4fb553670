// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/checkpoint/export.hpp
/// A checkpoint's whole weights as one file: `consolidated_weights` reads every stage file by global name
/// (tensor-parallel shards joined; the tensors of a stage that names them within itself, and buffers, as
/// "stage<I>/<name>"), and `export_checkpoint_weights` writes them as one safetensors file, which LibTorch,
/// Python's safetensors or a few lines of Python read (docs/08; the `mpx_checkpoint` tool).

#include <mpx/linkage.hpp>                      // MPX_DECL, MPX_DEFINITIONS
#include <mpx/runtime/checkpoint/format.hpp>    // mpx::CheckpointOptions
#include <mpx/runtime/checkpoint/manifest.hpp>  // mpx::detail::Manifest

#include <torch/torch.h>  // at::Tensor

#include <map>     // std::map
#include <string>  // std::string

namespace mpx
{

/// The whole weights of the checkpoint `m` (or `path`) describes, by global name (see the file comment).
MPX_DECL std::map<std::string, at::Tensor> consolidated_weights(const detail::Manifest& m, const CheckpointOptions& co = {});
MPX_DECL std::map<std::string, at::Tensor> consolidated_weights(const std::string& path, const CheckpointOptions& co = {});

/// Writes the checkpoint's whole weights (`consolidated_weights`) as one safetensors file `out`.
MPX_DECL void export_checkpoint_weights(const std::string& path, const std::string& out, const CheckpointOptions& co = {});

}  // namespace mpx

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----
#include <mpx/errors.hpp>                    // mpx::config_error
#include <mpx/io/safetensors.hpp>            // mpx::save_safetensors
#include <mpx/runtime/checkpoint/recut.hpp>  // mpx::detail::CheckpointReader, recut

namespace mpx
{

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
      out[global ? k : "stage" + std::to_string(sf->stage) + "/" + k] = detail::recut(ps, detail::saved_cut(m, files, k), nullptr, 0, 1);
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
