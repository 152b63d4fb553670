// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/world/run_settings.hpp
/// The run's own settings in the start-up comparison. The pipeline fingerprint catches another binary or
/// pipeline type; what a program decides at run time — its config file, micro-batch size, seed, data set —
/// it names in `WorldOptions::settings`, and `check_run_settings` compares every rank's list with every
/// other's through the store before the first step. A difference stops every rank, naming the setting and
/// both values (ranks started with another `--seed` would otherwise train silently on mismatched data).

#include <mpx/errors.hpp>  // mpx::config_error, mpx::peer_error
#include <mpx/linkage.hpp>  // MPX_DECL, MPX_DEFINITIONS

#include <torch/csrc/distributed/c10d/Store.hpp>  // c10d::Store

#include <chrono>   // std::chrono::milliseconds
#include <string>   // std::string
#include <utility>  // std::pair
#include <vector>   // std::vector

namespace mpx
{

/// Settings as (name, value) pairs, in the order the program lists them.
using RunSettings = std::vector<std::pair<std::string, std::string>>;

namespace detail
{
/// "name=value" lines; names and values may not hold a newline or '=' in the name.
MPX_DECL std::string encode_settings(const RunSettings& s);

MPX_DECL RunSettings decode_settings(const std::string& text);

/// The first difference between rank `a`'s and rank `b`'s settings, or empty.
MPX_DECL std::string settings_difference(const RunSettings& mine, int me, const RunSettings& theirs, int them);
/// A rank that found a difference marks that it has read what it needs; rank 0 (the store's host, or beside
/// the agent that hosts it) waits for every other rank's mark before it stops, so that no rank sees the
/// store vanish instead of the difference. Every rank finds one (each compares with every other).
MPX_DECL void settings_read(c10d::Store& store, int rank, int world, std::chrono::milliseconds timeout);
}  // namespace detail

/// Compares this rank's settings with every rank's (a collective over the store: every rank calls it).
MPX_DECL void check_run_settings(c10d::Store& store, const RunSettings& mine, int rank, int world, std::chrono::milliseconds timeout);

}  // namespace mpx

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----

namespace mpx::detail
{
MPX_DECL std::string encode_settings(const RunSettings& s)
{
  std::string out;
  for (auto& [k, v] : s) {
    if (k.empty() || k.find_first_of("=\n") != std::string::npos || v.find('\n') != std::string::npos)
      throw config_error("mpx: run setting '" + k + "' cannot be compared: a name is non-empty without '=' or a newline, a value has no newline");
    out += k + "=" + v + "\n";
  }
  return out;
}

MPX_DECL RunSettings decode_settings(const std::string& text)
{
  RunSettings out;
  std::size_t i = 0;
  while (i < text.size()) {
    const auto nl = text.find('\n', i), eq = text.find('=', i);
    if (nl == std::string::npos || eq == std::string::npos || eq > nl) break;
    out.emplace_back(text.substr(i, eq - i), text.substr(eq + 1, nl - eq - 1));
    i = nl + 1;
  }
  return out;
}

MPX_DECL std::string settings_difference(const RunSettings& mine, int me, const RunSettings& theirs, int them)
{
  auto find = [](const RunSettings& s, const std::string& k) -> const std::string* {
    for (auto& [n, v] : s)
      if (n == k) return &v;
    return nullptr;
  };
  for (auto& [k, v] : mine) {
    const std::string* o = find(theirs, k);
    if (!o) return "rank " + std::to_string(me) + " has run setting '" + k + "' = '" + v + "', rank " + std::to_string(them) + " does not set it";
    if (*o != v) return "run setting '" + k + "' is '" + v + "' on rank " + std::to_string(me) + " but '" + *o + "' on rank " + std::to_string(them);
  }
  for (auto& [k, v] : theirs)
    if (!find(mine, k)) return "rank " + std::to_string(them) + " has run setting '" + k + "' = '" + v + "', rank " + std::to_string(me) + " does not set it";
  return {};
}

MPX_DECL void settings_read(c10d::Store& store, int rank, int world, std::chrono::milliseconds timeout)
{
  try {
    store.set("mpx/settings/read/" + std::to_string(rank), std::vector<uint8_t>{1});
    if (rank == 0)
      for (int r = 1; r < world; ++r) store.wait({"mpx/settings/read/" + std::to_string(r)}, timeout);
  } catch (const std::exception&) {  // a rank that died first: the difference is still what to report
  }
}

}  // namespace mpx::detail

namespace mpx
{
MPX_DECL void check_run_settings(c10d::Store& store, const RunSettings& mine, int rank, int world, std::chrono::milliseconds timeout)
{
  const std::string text = detail::encode_settings(mine);
  store.set("mpx/settings/" + std::to_string(rank), std::vector<uint8_t>(text.begin(), text.end()));
  for (int r = 0; r < world; ++r) {
    if (r == rank) continue;
    const std::string key = "mpx/settings/" + std::to_string(r);
    try {
      store.wait({key}, timeout);
    } catch (const std::exception& e) {
      throw peer_error("mpx: rank " + std::to_string(rank) + ": rank " + std::to_string(r) + " did not publish its run settings within " +
                       std::to_string(timeout.count()) + " ms (did it die?)");
    }
    const auto bytes = store.get(key);
    const std::string diff = detail::settings_difference(mine, rank, detail::decode_settings(std::string(bytes.begin(), bytes.end())), r);
    if (!diff.empty()) {
      detail::settings_read(store, rank, world, timeout);
      throw config_error("mpx: rank " + std::to_string(rank) + ": the ranks were started with different settings: " + diff +
                         "; start every rank with the same command line and files");
    }
  }
}

}  // namespace mpx
#endif  // MPX_DEFINITIONS
