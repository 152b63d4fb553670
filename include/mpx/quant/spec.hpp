// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file quant/spec.hpp
/// A weight format's name: `Format` and its group (`Spec`), read from and written as the text the flags,
/// the errors and a quantized export's metadata use ("int4", "int4/g32", "int4/channel", "int8", "nf4").
/// What each format stores: formats.hpp.

#include <mpx/errors.hpp>   // mpx::config_error
#include <mpx/linkage.hpp>  // MPX_DECL, MPX_DEFINITIONS

#include <cstdint>  // std::int64_t
#include <string>   // std::string

namespace mpx::quant
{

enum class Format
{
  none,  ///< the weight as it is (fp32)
  bf16,
  int8,
  int4,
  nf4,
};

/// A format and its group (see formats.hpp).
struct Spec
{
  Format format = Format::none;
  std::int64_t group = 0;   ///< values per scale along a row: int8/int4 0 (per row) or ≥ 2 and even; nf4 the block (64)
  bool double_quant = true; ///< nf4: the block maxima in 8 bits
  bool defined() const { return format != Format::none; }
};

/// "fp32" (none), "bf16", "int8" (per channel), "int8/gN", "int4" (groups of 64), "int4/gN", "int4/channel",
/// "nf4" (blocks of 64, double quantization), "nf4/gN"; anything else is an error listing these.
MPX_DECL Spec parse(const std::string& text);

/// The text that `parse` reads back ("int4/g64").
MPX_DECL std::string name_of(const Spec& s);

}  // namespace mpx::quant

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----
namespace mpx::quant
{

MPX_DECL Spec parse(const std::string& text)
{
  const auto slash = text.find('/');
  const std::string base = text.substr(0, slash);
  Spec s;
  if (base == "fp32" || base == "none") s.format = Format::none;
  else if (base == "bf16") s.format = Format::bf16;
  else if (base == "int8") s.format = Format::int8;
  else if (base == "int4") s.format = Format::int4, s.group = 64;
  else if (base == "nf4") s.format = Format::nf4, s.group = 64;
  else throw config_error("mpx::quant: unknown format '" + text + "'; use fp32, bf16, int8 (per channel), int8/gN, int4 (groups of 64), int4/gN, int4/channel or nf4");
  if (slash != std::string::npos) {
    const std::string g = text.substr(slash + 1);
    if (g == "channel" && (s.format == Format::int8 || s.format == Format::int4)) {
      s.group = 0;
      return s;
    }
    std::int64_t n = 0;
    try {
      std::size_t used = 0;
      n = g.size() > 1 && g[0] == 'g' ? std::stoll(g.substr(1), &used) : -1;
      if (used + 1 != g.size()) n = -1;
    } catch (const std::exception&) {
      n = -1;
    }
    if (s.format == Format::none || s.format == Format::bf16 || n < 2 || n % 2 != 0)
      throw config_error("mpx::quant: '" + text + "': a group is written /gN with N even and at least 2 (int4/g32, int8/g128, nf4/g64), for int8, int4 and nf4 only");
    s.group = n;
  }
  return s;
}

MPX_DECL std::string name_of(const Spec& s)
{
  switch (s.format) {
    case Format::none: return "fp32";
    case Format::bf16: return "bf16";
    case Format::int8: return s.group == 0 ? "int8" : "int8/g" + std::to_string(s.group);
    case Format::int4: return s.group == 0 ? "int4/channel" : s.group == 64 ? "int4" : "int4/g" + std::to_string(s.group);
    case Format::nf4: return s.group == 64 ? "nf4" : "nf4/g" + std::to_string(s.group);
  }
  return "?";
}

}  // namespace mpx::quant
#endif  // MPX_DEFINITIONS
