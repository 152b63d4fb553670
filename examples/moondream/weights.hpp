// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file examples/moondream/weights.hpp
/// Moondream weights in safetensors files (moondream-spec.md §5): both naming schemes (the state-dict
/// "new" names, optionally prefixed `model.`, and the 2024 "old" training names), any of bf16/fp16/fp32,
/// one file or a directory of shards. Loading is strict against the config: every missing, unexpected
/// or mis-shaped tensor is listed in one error. The region head and `kv_cache` buffers are skipped with a
/// note (this port does not include the region head).

#include "config.hpp"  // moondream::Config

#include <mpx/io/safetensors.hpp>  // mpx::load_safetensors, mpx::save_safetensors

#include <filesystem>  // std::filesystem
#include <map>         // std::map
#include <regex>       // std::regex
#include <string>      // std::string
#include <vector>      // std::vector

namespace moondream
{

using Shapes = std::map<std::string, std::vector<int64_t>>;

/// Every tensor of the model (vision + text) under its new-scheme name, with its shape.
inline Shapes expected_shapes(const Config& c)
{
  Shapes s;
  const auto& v = c.vision;
  const int64_t E = v.enc_dim, F = v.enc_ff_dim;
  s["vision.patch_emb.weight"] = {E, v.patch_features()}, s["vision.patch_emb.bias"] = {E};
  s["vision.pos_emb"] = {1, v.tokens(), E};
  for (int i = 0; i < v.enc_n_layers; ++i) {
    const std::string b = "vision.blocks." + std::to_string(i) + ".";
    s[b + "ln1.weight"] = s[b + "ln1.bias"] = s[b + "ln2.weight"] = s[b + "ln2.bias"] = {E};
    s[b + "attn.qkv.weight"] = {3 * E, E}, s[b + "attn.qkv.bias"] = {3 * E};
    s[b + "attn.proj.weight"] = {E, E}, s[b + "attn.proj.bias"] = {E};
    s[b + "mlp.fc1.weight"] = {F, E}, s[b + "mlp.fc1.bias"] = {F};
    s[b + "mlp.fc2.weight"] = {E, F}, s[b + "mlp.fc2.bias"] = {E};
  }
  s["vision.post_ln.weight"] = s["vision.post_ln.bias"] = {E};
  s["vision.proj_mlp.fc1.weight"] = {v.proj_inner_dim, 2 * E}, s["vision.proj_mlp.fc1.bias"] = {v.proj_inner_dim};
  s["vision.proj_mlp.fc2.weight"] = {v.proj_out_dim, v.proj_inner_dim}, s["vision.proj_mlp.fc2.bias"] = {v.proj_out_dim};
  const auto& t = c.text;
  const int64_t D = t.dim, Q = t.qkv_dim(), FF = t.ff_dim, V = t.vocab_size;
  s["text.wte"] = {V, D};
  for (int i = 0; i < t.n_layers; ++i) {
    const std::string b = "text.blocks." + std::to_string(i) + ".";
    s[b + "ln.weight"] = s[b + "ln.bias"] = {D};
    s[b + "attn.qkv.weight"] = {Q, D}, s[b + "attn.qkv.bias"] = {Q};
    s[b + "attn.proj.weight"] = {D, D}, s[b + "attn.proj.bias"] = {D};
    s[b + "mlp.fc1.weight"] = {FF, D}, s[b + "mlp.fc1.bias"] = {FF};
    s[b + "mlp.fc2.weight"] = {D, FF}, s[b + "mlp.fc2.bias"] = {D};
  }
  s["text.post_ln.weight"] = s["text.post_ln.bias"] = {D};
  s["text.lm_head.weight"] = {V, D}, s["text.lm_head.bias"] = {V};
  return s;
}

namespace detail
{
/// The two naming schemes side by side (§5 table): one tensor's old and new name as patterns whose groups
/// (layer index, weight|bias, ...) come in the same order on both sides, so one table renames both ways.
inline const std::vector<std::pair<std::string, std::string>>& name_pairs()
{
  static const std::vector<std::pair<std::string, std::string>> pairs = {
      {R"(vision_encoder\.encoder\.model\.visual\.patch_embed\.linear\.(weight|bias))", R"(vision\.patch_emb\.(weight|bias))"},
      {R"(vision_encoder\.encoder\.model\.visual\.pos_embed)", R"(vision\.pos_emb)"},
      {R"(vision_encoder\.encoder\.model\.visual\.blocks\.(\d+)\.norm1\.(weight|bias))", R"(vision\.blocks\.(\d+)\.ln1\.(weight|bias))"},
      {R"(vision_encoder\.encoder\.model\.visual\.blocks\.(\d+)\.norm2\.(weight|bias))", R"(vision\.blocks\.(\d+)\.ln2\.(weight|bias))"},
      {R"(vision_encoder\.encoder\.model\.visual\.blocks\.(\d+)\.attn\.(qkv|proj)\.(weight|bias))",
       R"(vision\.blocks\.(\d+)\.attn\.(qkv|proj)\.(weight|bias))"},
      {R"(vision_encoder\.encoder\.model\.visual\.blocks\.(\d+)\.mlp\.(fc1|fc2)\.(weight|bias))",
       R"(vision\.blocks\.(\d+)\.mlp\.(fc1|fc2)\.(weight|bias))"},
      {R"(vision_encoder\.encoder\.model\.visual\.norm\.(weight|bias))", R"(vision\.post_ln\.(weight|bias))"},
      {R"(vision_encoder\.projection\.mlp\.(fc1|fc2)\.(weight|bias))", R"(vision\.proj_mlp\.(fc1|fc2)\.(weight|bias))"},
      {R"(text_model\.transformer\.embd\.wte\.weight)", R"(text\.wte)"},
      {R"(text_model\.transformer\.h\.(\d+)\.ln\.(weight|bias))", R"(text\.blocks\.(\d+)\.ln\.(weight|bias))"},
      {R"(text_model\.transformer\.h\.(\d+)\.mixer\.Wqkv\.(weight|bias))", R"(text\.blocks\.(\d+)\.attn\.qkv\.(weight|bias))"},
      {R"(text_model\.transformer\.h\.(\d+)\.mixer\.out_proj\.(weight|bias))", R"(text\.blocks\.(\d+)\.attn\.proj\.(weight|bias))"},
      {R"(text_model\.transformer\.h\.(\d+)\.mlp\.(fc1|fc2)\.(weight|bias))", R"(text\.blocks\.(\d+)\.mlp\.(fc1|fc2)\.(weight|bias))"},
      {R"(text_model\.lm_head\.ln\.(weight|bias))", R"(text\.post_ln\.(weight|bias))"},
      {R"(text_model\.lm_head\.linear\.(weight|bias))", R"(text\.lm_head\.(weight|bias))"},
  };
  return pairs;
}

/// A name pattern as a `std::regex_replace` format: its groups become $1, $2, ... and `\.` a dot.
inline std::string as_format(const std::string& pattern)
{
  std::string out;
  int group = 0, depth = 0;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    const char ch = pattern[i];
    if (ch == '(' && depth++ == 0) out.append(1, '$').append(std::to_string(++group));  // not "$" + string: GCC 12 -Wstringop-overflow
    else if (ch == ')') --depth;
    else if (depth == 0) {
      if (ch == '\\' && i + 1 < pattern.size()) out += pattern[++i];
      else out += ch;
    }
  }
  return out;
}

/// Renames from one scheme to the other with name_pairs(); "" for a name that is not a vision/text tensor.
class Renamer
{
 public:
  explicit Renamer(bool from_old)
  {
    for (auto& [o, n] : name_pairs()) rules_.emplace_back(std::regex(from_old ? o : n), as_format(from_old ? n : o));
  }
  std::string operator()(const std::string& k) const
  {
    for (auto& [re, to] : rules_)
      if (std::regex_match(k, re)) return std::regex_replace(k, re, to);
    return "";
  }

 private:
  std::vector<std::pair<std::regex, std::string>> rules_;
};
}  // namespace detail

/// The new-scheme name of an old-scheme one, or "" if it is not a vision/text tensor. `_orig_mod` (left
/// by torch.compile) is ignored wherever it sits.
inline std::string from_old_name(std::string k)
{
  static const detail::Renamer rename(/*from_old=*/true);
  for (auto p = k.find("._orig_mod"); p != std::string::npos; p = k.find("._orig_mod")) k.erase(p, 10);
  if (k.rfind("_orig_mod.", 0) == 0) k.erase(0, 10);
  return rename(k);
}

/// The old-scheme name of a new-scheme one (for writing old-format files), or "" if none.
inline std::string to_old_name(const std::string& k)
{
  static const detail::Renamer rename(/*from_old=*/false);
  return rename(k);
}

/// What a file (or a directory of shards) held, under new-scheme names, after the strict check.
struct Weights
{
  std::map<std::string, at::Tensor> tensors;
  std::string scheme;                  ///< "new" or "old"
  std::vector<std::string> skipped;    ///< region head, kv caches
};

/// The .safetensors files at `path`: a directory's, sorted, or `path` itself.
inline std::vector<std::string> weight_files(const std::string& path)
{
  namespace fs = std::filesystem;
  if (!fs::is_directory(path)) return {path};
  std::vector<std::string> files;
  for (auto& e : fs::directory_iterator(path))
    if (e.path().extension() == ".safetensors") files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

/// Reads `path` (a .safetensors file or a directory of them), renames to the new scheme and checks it
/// against the config: the error lists every missing, unexpected and mis-shaped tensor.
inline Weights read_weights(const std::string& path, const Config& c)
{
  const auto files = weight_files(path);
  if (files.empty()) throw mpx::config_error("moondream: no .safetensors file in " + path + "; pass a weights file or a directory of shards");
  std::map<std::string, at::Tensor> raw;
  for (auto& f : files) {
    auto st = mpx::load_safetensors(f);
    for (auto& [k, t] : st.tensors)
      if (!raw.emplace(k, t).second) throw mpx::config_error("moondream: tensor '" + k + "' appears in two shards of " + path + "; remove the duplicate");
  }
  Weights w;
  const bool old = std::any_of(raw.begin(), raw.end(), [](auto& kv) { return kv.first.find("vision_encoder.") != std::string::npos; });
  w.scheme = old ? "old" : "new";
  std::vector<std::string> unexpected;
  for (auto& [k0, t] : raw) {
    std::string k = k0;
    if (!old)
      for (auto p = k.find("model."); p != std::string::npos; p = k.find("model.")) k.erase(p, 6);
    if (k.find("region") != std::string::npos || k.find("kv_cache") != std::string::npos) {
      w.skipped.push_back(k0);
      continue;
    }
    const std::string n = old ? from_old_name(k) : k;
    if (n.empty()) {
      unexpected.push_back(k0);
      continue;
    }
    w.tensors[n] = t;
  }
  const Shapes want = expected_shapes(c);
  std::vector<std::string> missing, misshaped;
  for (auto& [n, shape] : want) {
    auto it = w.tensors.find(n);
    if (it == w.tensors.end()) missing.push_back(n);
    else if (it->second.sizes().vec() != shape)
      misshaped.push_back(n + " " + c10::str(it->second.sizes()) + " (the config wants " + c10::str(at::IntArrayRef(shape)) + ")");
  }
  for (auto& [n, t] : w.tensors)
    if (!want.count(n)) unexpected.push_back(n);
  if (!missing.empty() || !unexpected.empty() || !misshaped.empty()) {
    std::string msg = "moondream: the weights in " + path + " (" + w.scheme + " naming) do not match config '" + c.name + "':";
    auto list = [&](const char* what, const std::vector<std::string>& v) {
      if (v.empty()) return;
      msg += std::string("\n  ") + what + " (" + std::to_string(v.size()) + "):";
      for (std::size_t i = 0; i < v.size() && i < 20; ++i) msg += "\n    " + v[i];
      if (v.size() > 20) msg += "\n    ...";
    };
    list("missing", missing), list("unexpected", unexpected), list("mis-shaped", misshaped);
    msg += "\n  pick the config that matches the file (--config), or the file that matches the config";
    throw mpx::config_error(msg);
  }
  return w;
}

/// Copies the tensors of `w` into `params` (global names, any subset of the model), casting the dtype.
inline void assign(const Weights& w, const std::map<std::string, at::Tensor>& params)
{
  torch::NoGradGuard ng;
  for (auto& [n, p] : params) {
    auto it = w.tensors.find(n);
    TORCH_CHECK(it != w.tensors.end(), "moondream: no tensor ", n, " in the weights");
    p.copy_(it->second.to(p.scalar_type()));
  }
}

/// Writes `params` (global names) to one safetensors file in the new scheme, or the old one.
inline void write_weights(const std::string& path, const std::map<std::string, at::Tensor>& params, at::ScalarType dtype = at::kFloat,
                          bool old_scheme = false, const std::map<std::string, std::string>& metadata = {{"format", "pt"}})
{
  std::map<std::string, at::Tensor> out;
  for (auto& [n, p] : params) out[old_scheme ? to_old_name(n) : n] = p.detach().to(torch::kCPU).to(dtype).contiguous();
  mpx::save_safetensors(path, out, metadata);
}

}  // namespace moondream
