// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/wire/format.hpp
/// The boundary message's format, both ends' shared knowledge: a fixed-size int64 header — magic, stage,
/// micro-batch, field count, kind (activation or gradient), packed payload bytes (-1: the payloads follow
/// as messages of their own) and per field its dtype (-1: absent), wire dtype, requires_grad, rank and
/// extents — then, when packed, each tensor at a 64-byte-aligned offset after the header. Tags: two per
/// channel (header, payload). `encode_header` writes a header; `read_header` checks one field by field
/// (magic, stage, micro-batch, kind, field count, dtype codes, ranks, extents, sizes with overflow-checked
/// arithmetic, the packed size against the receive's capacity, each field's shape against its declared dims) and every violation is a `peer_error` naming
/// the message, the field and the values — never a cast of an unchecked code or a wrapped size.

#include <mpx/errors.hpp>  // mpx::peer_error, mpx::config_error
#include <mpx/torch/tensor.hpp>    // at::Tensor
#include <mpx/linkage.hpp>  // MPX_DECL, MPX_DEFINITIONS

#include <c10/core/ScalarType.h>  // at::ScalarType, c10::elementSize

#include <cstdint>  // std::int64_t
#include <limits>   // std::numeric_limits
#include <optional> // std::optional
#include <sstream>  // std::ostringstream
#include <string>   // std::string
#include <vector>   // std::vector

namespace mpx
{

namespace detail
{
inline constexpr int max_fields = 16;
inline constexpr int max_dims = 8;
inline constexpr int header_fixed = 6;  // magic, stage, mb, fields, kind (0 activation, 1 gradient), packed bytes (-1: payloads follow)
inline constexpr int header_per_field = 4 + max_dims;  // dtype (-1: absent), wire dtype, requires_grad, ndim, dims
inline constexpr int header_size = header_fixed + max_fields * header_per_field;
inline constexpr std::int64_t header_magic = 0x6d70780002;  // "mpx" v2
inline constexpr std::int64_t align = 64;  // packed tensors start at multiples of this many bytes
inline constexpr std::int64_t aligned(std::int64_t n) { return (n + align - 1) / align * align; }
inline constexpr std::int64_t header_bytes = aligned(header_size * std::int64_t(sizeof(std::int64_t)));  // where a packed payload starts
/// The largest payload one field may declare (1 TiB): far above any activation, far below int64 overflow.
inline constexpr std::int64_t max_field_bytes = std::int64_t(1) << 40;

/// Tags: two per channel (header, payload); channels.hpp numbers the channels.
inline int header_tag(int channel) { return 2 * channel; }
inline int payload_tag(int channel) { return 2 * channel + 1; }

MPX_DECL std::string shape_text(at::IntArrayRef s);

/// A declared shape as text: "[any, 729, 64]".
MPX_DECL std::string dims_text(const std::vector<std::int64_t>& d);

/// Whether `shape` has the declared rank and every fixed extent of `declared`.
MPX_DECL bool fits(const std::vector<std::int64_t>& shape, const std::vector<std::int64_t>& declared);

/// The dtypes a boundary tensor may have: what `read_header` accepts as a dtype code.
MPX_DECL bool wire_dtype_allowed(std::int64_t code);
}  // namespace detail

/// What a receive must carry, checked against its header.
struct Expect
{
  int stage = 0;
  int mb = 0;
  bool gradient = false;
  std::vector<std::string> names;  ///< field names of the boundary type
  std::string boundary;            ///< the boundary type's name
  /// Per field, its declared shape (shape.hpp: the extents, -1 where free), or none; empty: none declared.
  std::vector<std::optional<std::vector<std::int64_t>>> dims = {};
};

/// One end's record of a directed channel's message sizes, for packing (Gloo only: NCCL needs a receive of
/// exactly the message's size). A receive has room for `capacity` payload bytes after the header, the largest
/// payload of the channel's earlier steps. Both ends know it without talking: a step's receives are all
/// posted, and its messages all sent, within the step, so `next_step()` at each step's start keeps them equal.
/// One thread uses it: receive packed messages without a `Receiver` (`finish_recv` parses them).
struct ChannelSize
{
  std::int64_t capacity = 0;  ///< payload bytes the receives of this step have room for
  std::int64_t largest = 0;   ///< the largest payload so far: the next step's capacity
  void next_step() { capacity = largest; }
};

namespace detail
{
/// One field as a header describes it.
struct FieldLayout
{
  bool present = false;
  at::ScalarType dtype = at::kFloat, wire = at::kFloat;
  bool requires_grad = false;
  std::vector<std::int64_t> shape;
  std::int64_t bytes = 0;  ///< on the wire
};

/// A checked header.
struct HeaderLayout
{
  std::int64_t packed = -1;  ///< payload bytes packed after the header; -1: the payloads follow separately
  std::int64_t payload = 0;  ///< the payload's packed size (each field aligned), as the sender counted it
  std::vector<FieldLayout> fields;
};

/// Writes the header of tensors `ts` (undefined: a field without a value), each sent as `sent[i]` (its
/// wire dtype), into `hp` (header_size int64s), and returns the payload's packed size.
MPX_DECL std::int64_t encode_header(std::int64_t* hp, int stage, int mb, bool gradient, const std::vector<at::Tensor>& ts,
                                  const std::vector<at::Tensor>& sent);

/// Checks header `hp` against what the receive expects (`capacity`: payload bytes the receive had room for,
/// negative for an exact header receive) and returns its layout. `what` names the message in errors.
MPX_DECL HeaderLayout read_header(const std::int64_t* hp, std::int64_t capacity, const Expect& e, const std::string& what);
}  // namespace detail

}  // namespace mpx

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----

namespace mpx::detail
{
MPX_DECL std::string shape_text(at::IntArrayRef s)
{
  std::ostringstream o;
  o << "[";
  for (std::size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
  return o.str() + "]";
}

MPX_DECL std::string dims_text(const std::vector<std::int64_t>& d)
{
  std::string o = "[";
  for (std::size_t i = 0; i < d.size(); ++i) o += (i ? ", " : "") + (d[i] < 0 ? std::string("any") : std::to_string(d[i]));
  return o + "]";
}

MPX_DECL bool fits(const std::vector<std::int64_t>& shape, const std::vector<std::int64_t>& declared)
{
  if (shape.size() != declared.size()) return false;
  for (std::size_t i = 0; i < shape.size(); ++i)
    if (declared[i] >= 0 && shape[i] != declared[i]) return false;
  return true;
}

MPX_DECL bool wire_dtype_allowed(std::int64_t code)
{
  using S = at::ScalarType;
  switch (code) {
    case std::int64_t(S::Byte): case std::int64_t(S::Char): case std::int64_t(S::Short): case std::int64_t(S::Int):
    case std::int64_t(S::Long): case std::int64_t(S::Half): case std::int64_t(S::Float): case std::int64_t(S::Double):
    case std::int64_t(S::Bool): case std::int64_t(S::BFloat16):
      return true;
    default:
      return false;
  }
}

MPX_DECL std::int64_t encode_header(std::int64_t* hp, int stage, int mb, bool gradient, const std::vector<at::Tensor>& ts,
                                  const std::vector<at::Tensor>& sent)
{
  hp[0] = header_magic;
  hp[1] = stage;
  hp[2] = mb;
  hp[3] = static_cast<std::int64_t>(ts.size());
  hp[4] = gradient ? 1 : 0;
  std::int64_t bytes = 0;
  for (std::size_t i = 0; i < ts.size(); ++i) {
    std::int64_t* f = hp + header_fixed + i * header_per_field;
    const at::Tensor& t = ts[i];
    if (!t.defined()) {
      f[0] = -1;
      continue;
    }
    f[0] = static_cast<std::int64_t>(t.scalar_type());
    f[1] = static_cast<std::int64_t>(sent[i].scalar_type());
    f[2] = t.requires_grad() ? 1 : 0;
    f[3] = t.dim();
    for (int d = 0; d < t.dim(); ++d) f[4 + d] = t.size(d);
    bytes += aligned(std::int64_t(sent[i].nbytes()));
  }
  return bytes;
}

MPX_DECL HeaderLayout read_header(const std::int64_t* hp, std::int64_t capacity, const Expect& e, const std::string& what)
{
  auto fail = [&](const std::string& msg) -> void { throw peer_error(error_start(what) + ": " + msg); };
  if (hp[0] != header_magic) fail("the message is not an mpx boundary header (peer runs another protocol version?)");
  if (hp[4] != 0 && hp[4] != 1) fail("the message's kind " + std::to_string(hp[4]) + " is neither activations (0) nor gradients (1)");
  if (hp[1] != e.stage || hp[2] != e.mb || hp[4] != (e.gradient ? 1 : 0))
    fail("received " + std::string(hp[4] ? "gradients" : "activations") + " of stage " + std::to_string(hp[1]) + ", micro-batch " +
         std::to_string(hp[2]) + " where the schedule expects " + (e.gradient ? "gradients" : "activations") + " of stage " +
         std::to_string(e.stage) + ", micro-batch " + std::to_string(e.mb) + " (ranks run different tables?)");
  if (hp[3] < 0 || hp[3] > max_fields || std::size_t(hp[3]) != e.names.size())
    fail("the boundary " + e.boundary + " of stage " + std::to_string(e.stage) + " has " + std::to_string(e.names.size()) +
         " fields but the message has " + std::to_string(hp[3]));
  HeaderLayout h;
  h.packed = hp[5];
  if (h.packed < -1) fail("the message's packed size " + std::to_string(h.packed) + " is negative");
  if (h.packed > 0 && h.packed > capacity)
    fail("the message packs " + std::to_string(h.packed) + " payload bytes, the receive had room for " +
         std::to_string(capacity > 0 ? capacity : 0) + " (the two ends disagree on the channel's size)");
  h.fields.resize(std::size_t(hp[3]));
  for (std::size_t i = 0; i < h.fields.size(); ++i) {
    const std::int64_t* f = hp + header_fixed + i * header_per_field;
    FieldLayout& fl = h.fields[i];
    const std::string field = "field '" + e.names[i] + "'";
    if (f[0] == -1) continue;  // no value for this field
    if (!wire_dtype_allowed(f[0]) || !wire_dtype_allowed(f[1]))
      fail(field + " has dtype codes " + std::to_string(f[0]) + " / " + std::to_string(f[1]) + ", not a boundary dtype");
    if (f[2] != 0 && f[2] != 1) fail(field + " has a requires_grad flag of " + std::to_string(f[2]));
    if (f[3] < 0 || f[3] > max_dims) fail(field + " has an invalid rank " + std::to_string(f[3]));
    fl.present = true;
    fl.dtype = static_cast<at::ScalarType>(f[0]);
    fl.wire = static_cast<at::ScalarType>(f[1]);
    fl.requires_grad = f[2] != 0;
    fl.shape.assign(f + 4, f + 4 + f[3]);
    fl.bytes = std::int64_t(c10::elementSize(fl.wire));
    for (auto d : fl.shape) {
      if (d < 0) fail(field + " has a negative extent in " + shape_text(fl.shape));
      if (d > 0 && fl.bytes > max_field_bytes / d)
        fail(field + " of " + shape_text(fl.shape) + " declares more than " + std::to_string(max_field_bytes) + " bytes");
      fl.bytes *= d;
    }
    if (fl.bytes > max_field_bytes) fail(field + " of " + shape_text(fl.shape) + " declares more than " + std::to_string(max_field_bytes) + " bytes");
    if (i < e.dims.size() && e.dims[i] && !fits(fl.shape, *e.dims[i]))
      fail(std::string(e.gradient ? "the gradient of " : "") + field + " of stage " + std::to_string(e.stage) + " has shape " +
           shape_text(fl.shape) + " but the boundary " + e.boundary + " declares " + dims_text(*e.dims[i]) +
           (fl.shape.size() != e.dims[i]->size() ? " (rank " + std::to_string(fl.shape.size()) + ", declared " +
                                                       std::to_string(e.dims[i]->size()) + ")"
                                                 : std::string()));
    h.payload += aligned(fl.bytes);
  }
  if (h.packed >= 0 && h.payload > h.packed)
    fail("its fields need " + std::to_string(h.payload) + " payload bytes, the message packs " + std::to_string(h.packed));
  return h;
}

}  // namespace mpx::detail
#endif  // MPX_DEFINITIONS
