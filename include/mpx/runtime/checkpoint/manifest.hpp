// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/checkpoint/manifest.hpp
/// A checkpoint's manifest, `manifest.json`, written last: the checkpoint's format, step, pipeline
/// fingerprint, world size, and for every file its bytes, its XXH3-64 checksum (xxHash; none when
/// `CheckpointOptions::checksums` is off) and the tensors it holds — for a stage file also whether they
/// carry global names and how the cut ones are cut. A directory with a manifest is a complete checkpoint.
/// Before a load uses a file, `verified` checks it against the manifest: present, of the recorded size and
/// checksum; every failure is a `config_error` naming the file and the other complete checkpoints to resume
/// from. `locate_checkpoint` finds the checkpoint a path names (itself, or what its `latest` names).

#include <mpx/linkage.hpp>                      // MPX_DECL, MPX_DEFINITIONS
#include <mpx/runtime/checkpoint/format.hpp>    // mpx::CheckpointOptions
#include <mpx/tp/cut.hpp>                       // mpx::tp::Cut

#include <nlohmann/json_fwd.hpp>  // nlohmann::json (declared; defined below, for the definitions)

#include <cstdint>  // std::uintmax_t
#include <map>      // std::map
#include <string>   // std::string
#include <vector>   // std::vector

namespace mpx::detail
{

/// A file's size, XXH3-64 (as 16 hex digits; empty when checksums are off), the tensors it holds, and for
/// a stage file how its tensors are named and how the cut ones are cut (tensor parallelism).
struct FileSum
{
  std::uintmax_t bytes = 0;
  std::string xxh3;
  std::vector<std::string> tensors;
  bool global_names = false;           ///< named by the model's global names (else within the stage)
  std::map<std::string, tp::Cut> cuts;  ///< the cut parameters: how this file's shard was cut
};
/// As the manifest holds it (the cuts under the key "splits", the format's name since version 3).
MPX_DECL nlohmann::json to_json(const FileSum& f);
MPX_DECL FileSum from_json(const nlohmann::json& e);
/// `path`'s size and (when `checksum`) XXH3-64.
MPX_DECL FileSum sum_file(const std::string& path, bool checksum);

/// The complete checkpoints under `root` (directories with a manifest), oldest first.
MPX_DECL std::vector<std::string> complete_checkpoints(const std::string& root);

/// What to do instead, for an error about checkpoint `dir` under `root`: the other complete ones.
MPX_DECL std::string other_checkpoints(const std::string& root, const std::string& dir);

/// The checkpoint directory `path` names: itself when it holds a manifest, else the one `path/latest` names.
MPX_DECL std::string locate_checkpoint(const std::string& path);

struct Manifest
{
  std::string dir, root, fingerprint;
  long step = 0;
  int world_size = 0;
  bool checksums = true;
  bool trainable_only = false;  ///< it holds only the trainable tensors (CheckpointOptions::trainable_only)
  std::map<std::string, FileSum> files;
};

/// Reads and checks `dir`'s manifest (the pipeline's fingerprint is compared by the caller).
MPX_DECL Manifest read_manifest(const std::string& dir);

/// Checks that `name` is in the manifest and on disk as the save left it; returns its path.
MPX_DECL std::string verified(const Manifest& m, const std::string& name, const CheckpointOptions& co);

}  // namespace mpx::detail

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----
#include <mpx/errors.hpp>           // mpx::config_error
#include <mpx/io/safetensors.hpp>   // mpx::load_safetensors

#include <nlohmann/json.hpp>  // nlohmann::json
#define XXH_INLINE_ALL        // xxHash used header-only: its functions static inline, under XXH_INLINE_ names
#include <xxhash.h>           // XXH3_64bits (libxxhash-dev)
#undef XXH_INLINE_ALL

#include <fcntl.h>   // open
#include <unistd.h>  // read, close

#include <algorithm>   // std::sort, std::all_of
#include <cerrno>      // errno
#include <cstdio>      // std::snprintf
#include <cstring>     // std::strerror
#include <filesystem>  // std::filesystem
#include <fstream>     // std::ifstream
#include <stdexcept>   // std::invalid_argument

namespace mpx::detail
{
namespace fs = std::filesystem;

MPX_DECL nlohmann::json to_json(const FileSum& f)
{
  nlohmann::json j = {{"bytes", f.bytes}, {"xxh3", f.xxh3}, {"tensors", f.tensors}};
  if (f.global_names) j["global_names"] = true;
  for (auto& [name, sp] : f.cuts) {
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
      tp::Cut s{name, sp.at("dim").get<int64_t>(), sp.at("parts").get<std::vector<int64_t>>(),
                  sp.value("shares", std::vector<int64_t>{})};
      auto positive = [](const std::vector<int64_t>& v) { return std::all_of(v.begin(), v.end(), [](int64_t p) { return p > 0; }); };
      if (s.dim < 0 || s.dim > 16 || !positive(s.parts) || !positive(s.shares) ||
          (!s.shares.empty() && s.shares.size() != std::max<std::size_t>(s.parts.size(), 1)))
        throw std::invalid_argument("the cut of " + name + " is not a dimension, positive part sizes and positive shares, one per part");
      f.cuts[name] = std::move(s);
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
    m.trainable_only = j.value("trainable_only", false);
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

}  // namespace mpx::detail
#endif  // MPX_DEFINITIONS
