// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/wire/send.hpp
/// The sending end of a boundary message (format.hpp): `send_tensors` posts one value's header and tensors
/// — packed into the header's message when the receiver's capacity (ChannelSize) holds them, else as header +
/// one message per tensor — and returns a `PendingSend` that keeps the buffers alive until every send
/// has completed.

#include <mpx/errors.hpp>       // mpx::config_error
#include <mpx/runtime/wire/format.hpp>  // mpx::detail::encode_header, mpx::ChannelSize
#include <mpx/torch/process_group.hpp>  // mpx::ProcessGroupPtr
#include <mpx/linkage.hpp>  // MPX_DECL, MPX_DEFINITIONS

#include <torch/torch.h>  // torch::empty, torch::zeros

#include <algorithm>  // std::max
#include <cstring>    // std::memcpy
#include <string>     // std::string
#include <vector>     // std::vector

namespace mpx
{

/// The sending side of one message: keeps its buffers alive until every send has completed.
struct PendingSend
{
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  std::vector<at::Tensor> keep;
  std::string what;  ///< "SF3 of stage 1 to rank 2", for errors
};

namespace detail
{
/// The tensors as they travel: detached, floating ones in `wire` (unless kFloat), on `comm`, contiguous.
MPX_DECL std::vector<at::Tensor> wire_tensors(const std::vector<at::Tensor>& ts, int stage, at::ScalarType wire, torch::Device comm);

/// A boundary message before it travels: its header, the tensors as they travel, their packed size.
struct OutgoingMessage
{
  at::Tensor header;  ///< int64 [header_size]
  std::vector<at::Tensor> payload;
  std::int64_t bytes = 0;  ///< the payload packed (each tensor aligned)
};

MPX_DECL OutgoingMessage make_message(int stage, int mb, bool gradient, const std::vector<at::Tensor>& ts, at::ScalarType wire, torch::Device comm);

/// The packed message's bytes in order — header, then each tensor at an aligned offset — as calls
/// put(source, n) (a null source: n bytes of padding, any value).
template <class Put>
void for_each_packed_piece(const OutgoingMessage& m, Put&& put)
{
  const auto header_used = std::int64_t(header_size * sizeof(std::int64_t));
  put(m.header.data_ptr(), header_used);
  put(nullptr, header_bytes - header_used);
  for (auto& x : m.payload) {
    if (!x.defined()) continue;
    const auto n = std::int64_t(x.nbytes());
    if (n > 0) put(x.data_ptr(), n);
    put(nullptr, aligned(n) - n);
  }
}

/// One message of header and payload, packed (`m.header`'s packed-bytes field set).
MPX_DECL at::Tensor pack_message(const OutgoingMessage& m);
}  // namespace detail

/// Sends a list of tensors (a boundary value or its gradients) to `dst` on `channel`. `stage` is the stage
/// whose input the message is (the consumer for activations, the producer for gradients). An undefined
/// tensor marks a field without a gradient: header only. `wire` (kFloat when none) is the dtype floating
/// tensors travel in (WireCompression). With `size` (the channel's record at this end; CPU tensors only),
/// a payload that fits the receiver's capacity travels packed in the header's message.
MPX_DECL PendingSend send_tensors(ProcessGroupPtr& pg, int dst, int channel, int stage, int mb, bool gradient,
                                const std::vector<at::Tensor>& ts, at::ScalarType wire, std::string what,
                                torch::Device comm = torch::kCPU, ChannelSize* size = nullptr);

}  // namespace mpx

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----

namespace mpx::detail
{
MPX_DECL std::vector<at::Tensor> wire_tensors(const std::vector<at::Tensor>& ts, int stage, at::ScalarType wire, torch::Device comm)
{
  if (ts.size() > std::size_t(max_fields))
    throw config_error("mpx: a boundary has " + std::to_string(ts.size()) + " fields, more than the " + std::to_string(max_fields) +
                       " the wire header holds; group them into fewer tensors");
  std::vector<at::Tensor> out(ts.size());
  for (std::size_t i = 0; i < ts.size(); ++i) {
    if (!ts[i].defined()) continue;
    if (ts[i].dim() > max_dims)
      throw config_error("mpx: field " + std::to_string(i) + " of stage " + std::to_string(stage) + "'s boundary has " +
                         std::to_string(ts[i].dim()) + " dims, more than " + std::to_string(max_dims) + "; reshape it");
    at::Tensor x = ts[i].detach();
    if (wire != at::kFloat && x.is_floating_point() && x.scalar_type() != wire) x = x.to(wire);
    out[i] = x.to(comm).contiguous();
  }
  return out;
}

MPX_DECL OutgoingMessage make_message(int stage, int mb, bool gradient, const std::vector<at::Tensor>& ts, at::ScalarType wire, torch::Device comm)
{
  OutgoingMessage m;
  m.payload = wire_tensors(ts, stage, wire, comm);
  m.header = torch::zeros({header_size}, torch::kLong);
  m.bytes = encode_header(m.header.data_ptr<std::int64_t>(), stage, mb, gradient, ts, m.payload);
  return m;
}

MPX_DECL at::Tensor pack_message(const OutgoingMessage& m)
{
  auto msg = torch::empty({header_bytes + m.bytes}, torch::kByte);
  auto* out = msg.data_ptr<std::uint8_t>();
  for_each_packed_piece(m, [&](const void* src, std::int64_t n) {
    if (src != nullptr && n > 0) std::memcpy(out, src, std::size_t(n));
    out += n;
  });
  return msg;
}

}  // namespace mpx::detail

namespace mpx
{
MPX_DECL PendingSend send_tensors(ProcessGroupPtr& pg, int dst, int channel, int stage, int mb, bool gradient,
                                const std::vector<at::Tensor>& ts, at::ScalarType wire, std::string what,
                                torch::Device comm, ChannelSize* size)
{
  using namespace detail;
  PendingSend p;
  p.what = std::move(what);
  OutgoingMessage m = make_message(stage, mb, gradient, ts, wire, comm);
  const std::int64_t bytes = m.bytes;
  const bool packed = size != nullptr && comm.type() == torch::kCPU && bytes <= size->capacity;
  if (size) size->largest = std::max(size->largest, bytes);
  const at::Tensor& h = m.header;
  h.data_ptr<std::int64_t>()[5] = packed ? bytes : -1;
  auto post = [&](at::Tensor t, int tag) {
    std::vector<at::Tensor> v{t};
    p.works.push_back(pg->send(v, dst, tag));
    p.keep.push_back(std::move(t));
  };
  if (packed) {
    post(pack_message(m), header_tag(channel));
    return p;
  }
  post(comm.type() == torch::kCPU ? h : h.to(comm), header_tag(channel));  // NCCL sends device tensors only
  for (auto& x : m.payload)
    if (x.defined() && x.numel() > 0) post(x, payload_tag(channel));
  return p;
}

}  // namespace mpx
#endif  // MPX_DEFINITIONS
