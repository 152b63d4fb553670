// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file examples/moondream/config.hpp
/// Moondream's configuration (moondream-spec.md §2), read from the JSON files in `configs/`: `tiny`
/// (the generalised CPU demo), `tiny-reference`, `medium`, `md05`, `md2`. The port derives what the Python
/// reference hard-codes: grid = crop / patch, image tokens = grid², prefix = 1 + grid².

#include <mpx/errors.hpp>  // mpx::config_error

#include <nlohmann/json.hpp>  // nlohmann::json

#include <fstream>  // std::ifstream
#include <string>   // std::string

#ifndef MOONDREAM_CONFIG_DIR
#define MOONDREAM_CONFIG_DIR "configs"
#endif

namespace moondream
{

struct VisionConfig
{
  int enc_dim = 1152, enc_patch_size = 14, enc_n_layers = 27, enc_ff_dim = 4304, enc_n_heads = 16;
  int proj_out_dim = 2048, crop_size = 378, in_channels = 3, max_crops = 12, overlap_margin = 4, proj_inner_dim = 8192;
  int grid() const { return crop_size / enc_patch_size; }          ///< patches per crop side (27)
  int tokens() const { return grid() * grid(); }                   ///< image tokens (729)
  int patch_features() const { return in_channels * enc_patch_size * enc_patch_size; }  ///< 588
};

struct TextConfig
{
  int dim = 2048, ff_dim = 8192, n_layers = 24, vocab_size = 51200, max_context = 2048, n_heads = 32, n_kv_heads = 32;
  int rot_dim = 32;           ///< rotated dims per head (of head_dim); a config without it: 2 * (head_dim / 4)
  double rope_theta = 10000;  ///< RoPE base
  int head_dim() const { return dim / n_heads; }
  int qkv_dim() const { return (n_heads + 2 * n_kv_heads) * head_dim(); }
};

struct TokenizerConfig
{
  int bos_id = 50256, eos_id = 50256;
};

struct Config
{
  std::string name = "md2";
  VisionConfig vision;
  TextConfig text;
  TokenizerConfig tokenizer;
  int prefix() const { return 1 + vision.tokens(); }  ///< BOS + image tokens: bidirectional attention
};

namespace detail
{
template <class T>
void read(const nlohmann::json& j, const char* key, T& v, const std::string& where)
{
  if (!j.contains(key)) return;  // keep the default
  try {
    v = j.at(key).get<T>();
  } catch (const std::exception& e) {
    throw mpx::config_error("moondream: " + where + ": field \"" + key + "\" has the wrong type (" + e.what() + "); give a number");
  }
}
}  // namespace detail

/// Checks the constraints the model relies on; the error names the field and the fix.
inline void validate(const Config& c, const std::string& where)
{
  auto need = [&](bool ok, const std::string& what) {
    if (!ok) throw mpx::config_error("moondream: " + where + ": " + what);
  };
  const auto& v = c.vision;
  const auto& t = c.text;
  need(v.crop_size % v.enc_patch_size == 0, "vision.crop_size must be a multiple of vision.enc_patch_size");
  need(v.grid() > 2 * v.overlap_margin, "vision.overlap_margin (in patches) must leave a window: 2 * margin < crop_size / patch");
  need(v.enc_dim % v.enc_n_heads == 0, "vision.enc_dim must be divisible by vision.enc_n_heads");
  need(v.proj_out_dim == t.dim, "vision.proj_out_dim must equal text.dim (the image tokens are text embeddings)");
  need(v.max_crops >= 1, "vision.max_crops must be at least 1");
  need(t.dim % t.n_heads == 0, "text.dim must be divisible by text.n_heads");
  need(t.n_kv_heads >= 1 && t.n_heads % t.n_kv_heads == 0, "text.n_heads must be a multiple of text.n_kv_heads");
  need(t.rot_dim % 2 == 0 && t.rot_dim <= t.head_dim(), "text.rot_dim must be even and at most the head dim");
  need(t.max_context > c.prefix(), "text.max_context must exceed the image prefix (1 + (crop/patch)^2)");
  need(c.tokenizer.bos_id < t.vocab_size && c.tokenizer.eos_id < t.vocab_size, "tokenizer.bos_id/eos_id must be below text.vocab_size");
}

/// Parses a config from JSON text.
inline Config parse_config(const std::string& text, const std::string& where)
{
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw mpx::config_error("moondream: " + where + " is not valid JSON (" + e.what() + "); fix the file");
  }
  Config c;
  const auto& v = j.value("vision", nlohmann::json::object());
  const auto& t = j.value("text", nlohmann::json::object());
  const auto& k = j.value("tokenizer", nlohmann::json::object());
  using detail::read;
  read(v, "enc_dim", c.vision.enc_dim, where), read(v, "enc_patch_size", c.vision.enc_patch_size, where);
  read(v, "enc_n_layers", c.vision.enc_n_layers, where), read(v, "enc_ff_dim", c.vision.enc_ff_dim, where);
  read(v, "enc_n_heads", c.vision.enc_n_heads, where), read(v, "proj_out_dim", c.vision.proj_out_dim, where);
  read(v, "crop_size", c.vision.crop_size, where), read(v, "in_channels", c.vision.in_channels, where);
  read(v, "max_crops", c.vision.max_crops, where), read(v, "overlap_margin", c.vision.overlap_margin, where);
  read(v, "proj_inner_dim", c.vision.proj_inner_dim, where);
  read(t, "dim", c.text.dim, where), read(t, "ff_dim", c.text.ff_dim, where), read(t, "n_layers", c.text.n_layers, where);
  read(t, "vocab_size", c.text.vocab_size, where), read(t, "max_context", c.text.max_context, where);
  read(t, "n_heads", c.text.n_heads, where), read(t, "n_kv_heads", c.text.n_kv_heads, where);
  read(t, "rot_dim", c.text.rot_dim, where), read(t, "rope_theta", c.text.rope_theta, where);
  if (!t.contains("rot_dim")) c.text.rot_dim = 2 * (c.text.head_dim() / 4);  // the reference's rule: half of each head rotates
  read(k, "bos_id", c.tokenizer.bos_id, where), read(k, "eos_id", c.tokenizer.eos_id, where);
  validate(c, where);
  return c;
}

/// Loads `name_or_path`: a path to a JSON file, or the name of one of the shipped configs.
inline Config load_config(const std::string& name_or_path)
{
  const bool is_path = name_or_path.find('/') != std::string::npos || name_or_path.ends_with(".json");
  const std::string path = is_path ? name_or_path : std::string(MOONDREAM_CONFIG_DIR) + "/" + name_or_path + ".json";
  std::ifstream in(path);
  if (!in)
    throw mpx::config_error("moondream: cannot read config " + path +
                            "; pass a JSON file or one of the shipped names: tiny, tiny-reference, medium, md05, md2");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Config c = parse_config(text, path);
  c.name = is_path ? path : name_or_path;
  return c;
}

}  // namespace moondream
