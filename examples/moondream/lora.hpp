// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file examples/moondream/lora.hpp
/// `--lora RANK`: moondream fine-tuned through LoRA adapters (mpx::lora) instead of every weight. The
/// targets are a regular expression over the linears' global names, by default every linear of the text
/// decoder's blocks (`text.blocks.N.attn.{qkv,proj}`, `text.blocks.N.mlp.{fc1,fc2}`); the pattern is checked
/// against the whole model's linears before any stage is built, so a typo stops every layout alike. The
/// base is frozen everywhere (the vision encoder too, unless --freeze-vision off and the pattern names
/// vision linears); the export is the merged model (`model/`, loads as the plain model) beside the adapters
/// alone (`model/adapters/`), and checkpoints hold only the adapters and their optimizer state.

#include "config.hpp"  // moondream::Config
#include "recipe.hpp"  // moondream::Options

#include <mpx/mpx.hpp>

#include <fmt/format.h>  // fmt::format

#include <filesystem>  // std::filesystem
#include <map>     // std::map
#include <regex>   // std::regex
#include <string>  // std::string
#include <vector>  // std::vector

namespace moondream
{

/// Every linear of the model that can take an adapter (an mpx linear), by global name.
inline std::vector<std::string> adaptable_linears(const Config& c)
{
  std::vector<std::string> out;
  for (int i = 0; i < c.vision.enc_n_layers; ++i)
    for (const char* l : {"attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2"}) out.push_back(fmt::format("vision.blocks.{}.{}", i, l));
  out.push_back("vision.proj_mlp.fc1"), out.push_back("vision.proj_mlp.fc2");
  for (int i = 0; i < c.text.n_layers; ++i)
    for (const char* l : {"attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2"}) out.push_back(fmt::format("text.blocks.{}.{}", i, l));
  out.push_back("text.lm_head");
  return out;
}

/// The adapters' options of `o` (alpha 0: alpha = rank, the term unscaled).
inline mpx::lora::Options lora_options(const Options& o)
{
  mpx::lora::Options l;
  l.rank = o.lora, l.alpha = o.lora_alpha > 0 ? o.lora_alpha : double(o.lora), l.dropout = o.lora_dropout;
  l.targets = o.lora_targets, l.seed = o.seed, l.require_match = false;  // a stage may hold none of them: checked whole by check_lora
  return l;
}

/// Stops before anything is built when --lora's pattern names no linear of the model, names only the
/// patch embedding (a plain linear), or names vision linears of a frozen encoder.
inline void check_lora(const Options& o, const Config& c)
{
  if (o.lora <= 0) return;
  std::regex pattern;
  try {
    pattern = std::regex(o.lora_targets);
  } catch (const std::regex_error& e) {
    throw mpx::config_error("moondream_train: --lora-targets '" + o.lora_targets + "' is not a regular expression (" + e.what() + ")");
  }
  int matched = 0;
  std::string vision;
  for (const auto& n : adaptable_linears(c))
    if (std::regex_match(n, pattern)) {
      ++matched;
      if (vision.empty() && n.starts_with("vision.")) vision = n;
    }
  if (std::regex_match("vision.patch_emb", pattern))
    throw mpx::config_error("moondream_train: --lora-targets names vision.patch_emb, a plain linear without an adapter; narrow the pattern");
  if (matched == 0)
    throw mpx::config_error("moondream_train: --lora-targets '" + o.lora_targets + "' names no linear of config " + c.name +
                            "; the linears are named like text.blocks.0.attn.qkv, text.blocks.0.mlp.fc1, text.lm_head, vision.blocks.0.mlp.fc2");
  if (!vision.empty() && !o.train_vision())
    throw mpx::config_error("moondream_train: --lora-targets names " + vision + ", but the vision encoder is frozen; pass --freeze-vision off to "
                            "adapt it, or leave vision out of the pattern");
}

/// Adapters on stage module `m` (global names from its named_weights()), its base frozen.
template <class M>
void apply_lora(const Options& o, M& m)
{
  if (o.lora > 0) mpx::lora::apply(m, lora_options(o), m.named_weights());
}

/// The adapters' file metadata: their rank and alpha, so that a reader (load_adapters) rebuilds the same term.
inline std::map<std::string, std::string> adapter_metadata(const Options& o)
{
  return {{"format", "pt"}, {"lora_rank", std::to_string(o.lora)}, {"lora_alpha", fmt::format("{}", lora_options(o).alpha)}};
}

/// Adapters that moondream_train exported (`<save>/model/adapters`: a directory of safetensors files, or one
/// file) put on `m`, whose base weights are in place: each named linear gets an adapter of the files' rank
/// and alpha, then the saved A and B. Anything that does not fit is an error naming the file and the tensor.
template <class M>
void load_adapters(M& m, const std::string& path)
{
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  if (fs::is_directory(path)) {
    for (auto& e : fs::directory_iterator(path))
      if (e.path().extension() == ".safetensors") files.push_back(e.path().string());
  } else if (fs::exists(path)) {
    files.push_back(path);
  }
  if (files.empty()) throw mpx::config_error("moondream: no adapters (.safetensors) at " + path + "; pass <save>/model/adapters of a moondream_train --lora run");
  std::map<std::string, at::Tensor> adapters;
  std::string rank, alpha, targets;
  for (const auto& f : files) {
    auto st = mpx::load_safetensors(f);
    auto r = st.metadata.find("lora_rank"), a = st.metadata.find("lora_alpha");
    if (r == st.metadata.end() || a == st.metadata.end())
      throw mpx::config_error("moondream: " + f + " has no lora_rank and lora_alpha metadata: not the adapters of a moondream_train --lora run");
    if ((!rank.empty() && rank != r->second) || (!alpha.empty() && alpha != a->second))
      throw mpx::config_error("moondream: the adapter files at " + path + " disagree on the rank or alpha (" + f + ": rank " + r->second + ", alpha " + a->second + ")");
    rank = r->second, alpha = a->second;
    for (auto& [n, t] : st.tensors) {
      if (!mpx::lora::is_adapter(n)) throw mpx::config_error("moondream: " + f + " holds " + n + ", which is not an adapter's tensor");
      adapters[n] = t;
      if (n.ends_with(".lora_a")) {
        std::string escaped;
        for (char ch : n.substr(0, n.size() - 7)) escaped += ch == '.' ? std::string("\\.") : std::string(1, ch);
        targets += (targets.empty() ? "" : "|") + escaped;
      }
    }
  }
  mpx::lora::Options l;
  try {
    l.rank = std::stol(rank), l.alpha = std::stod(alpha);
  } catch (const std::exception&) {
    throw mpx::config_error("moondream: the adapters at " + path + " have a garbled rank or alpha (" + rank + ", " + alpha + ")");
  }
  l.targets = "(" + targets + ")";
  mpx::lora::apply(m, l, m.named_weights());
  const auto params = m.named_weights();
  torch::NoGradGuard ng;
  for (auto& [n, t] : adapters) {
    auto it = params.find(n);
    if (it == params.end()) throw mpx::config_error("moondream: the adapters at " + path + " hold " + n + ", which this model has no linear for");
    if (it->second.sizes() != t.sizes())
      throw mpx::config_error("moondream: " + n + " at " + path + " is " + c10::str(t.sizes()) + ", this model's " + c10::str(it->second.sizes()) +
                              "; pass the config the adapters were trained with");
    it->second.copy_(t.to(it->second.scalar_type()));
  }
  for (auto& [n, p] : params)
    if (mpx::lora::is_adapter(n) && !adapters.count(n)) throw mpx::config_error("moondream: the adapters at " + path + " have no " + n);
}

/// The weights to export: with --lora the merged ones (what loads as the plain model); `adapters` gets the
/// adapters' own tensors.
inline std::map<std::string, at::Tensor> export_weights(const Options& o, const std::map<std::string, at::Tensor>& whole,
                                                        std::map<std::string, at::Tensor>& adapters)
{
  if (o.lora <= 0) return whole;
  for (const auto& [n, t] : whole)
    if (mpx::lora::is_adapter(n)) adapters[n] = t;
  return mpx::lora::merged(whole, lora_options(o).alpha);
}

}  // namespace moondream
