// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/wire/receive.hpp
/// The receiving end of a boundary message (format.hpp). `post_recv` posts the header receive at once —
/// with room for a packed payload when the channel's size is known (ChannelSize) — so that a schedule can
/// post its receives ahead of the compute that needs them. `finish_recv` waits for the header, checks it
/// (`read_header`: a message that breaks the declared boundary is a `peer_error` naming stage, field and
/// both shapes), posts the receives of payloads that follow separately, waits for them and returns the
/// value. Gloo matches messages by source and tag, first in first out: receives posted ahead never meet
/// the wrong message, and a receive larger than its message is filled in part (a smaller one would kill
/// the process, which is why both ends derive the capacity from the same earlier messages).

#include <mpx/runtime/wire/format.hpp>  // mpx::Expect, mpx::ChannelSize, mpx::detail::read_header
#include <mpx/torch/process_group.hpp>  // mpx::ProcessGroupPtr, mpx::detail::wait_bounded
#include <mpx/linkage.hpp>  // MPX_DECL, MPX_DEFINITIONS

#include <torch/torch.h>  // torch::empty, torch::from_blob

#include <algorithm>  // std::max
#include <atomic>     // std::atomic
#include <chrono>     // std::chrono::milliseconds
#include <exception>  // std::exception_ptr
#include <string>     // std::string
#include <vector>     // std::vector

namespace mpx
{

class ShmRing;

/// The receiving side of one message. The header receive (with room for a packed payload) is posted at
/// once; payloads that follow separately are posted as soon as the header is there — by a `Receiver`
/// thread (receiver.hpp), so that they flow while the rank computes, or by `finish_recv`.
struct PendingRecv
{
  c10::intrusive_ptr<c10d::Work> header_work;
  at::Tensor header;  ///< int64 header, or bytes: header, then room for a packed payload
  int src = -1;
  int channel = 0;
  Expect expect;
  std::string what;  ///< "RF3 of stage 1 from slot 0", for errors
  std::atomic<bool> payload_posted{false};
  std::exception_ptr error;  ///< set by a receiver thread that failed to advance it
  std::vector<at::Tensor> out, buf;
  std::vector<bool> grad;
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  torch::Device comm{torch::kCPU};  ///< where the buffers live (the NCCL device, or CPU for Gloo)
  ChannelSize* size = nullptr;      ///< the channel's record at this end, when packing
  ShmRing* ring = nullptr;          ///< a same-host channel's ring (shm_links.hpp): nothing posted; the message read from it
};

/// Posts the header receive of a message into `r` (`prepare_recv`, then `post_header`).
MPX_DECL void post_recv(PendingRecv& r, ProcessGroupPtr& pg, int src, int channel, Expect e, std::string what,
                      torch::Device comm = torch::kCPU, ChannelSize* size = nullptr);

/// Readies `r` to receive a message — its header buffer, what it expects — without posting anything. With
/// `size` (the channel's record at this end; CPU only), the header receive has room for the channel's
/// largest payload of earlier steps, packed after the header.
MPX_DECL void prepare_recv(PendingRecv& r, int src, int channel, Expect e, std::string what, torch::Device comm = torch::kCPU,
                           ChannelSize* size = nullptr);
/// Posts the header receive of a prepared `r`.
MPX_DECL void post_header(PendingRecv& r, ProcessGroupPtr& pg);

namespace detail
{
/// The arrived header's fields as tensors: views of the message when packed, else fresh buffers.
MPX_DECL void make_buffers(PendingRecv& r, const HeaderLayout& h);

/// Checks the (arrived) header and posts the payload receives.
MPX_DECL void post_payloads(ProcessGroupPtr& pg, PendingRecv& r);
}  // namespace detail

/// Waits for the header (if needed: without a Receiver) and the payloads. Returns one tensor per field
/// (undefined for fields without gradient), in the sender's dtype, with requires_grad as the sender had it.
/// For gradients, `like` are the activations sent: each gradient's shape must be its activation's.
MPX_DECL std::vector<at::Tensor> finish_recv(ProcessGroupPtr& pg, PendingRecv& r, std::chrono::milliseconds timeout,
                                           const std::vector<at::Tensor>& like = {});

}  // namespace mpx

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----

namespace mpx
{
MPX_DECL void prepare_recv(PendingRecv& r, int src, int channel, Expect e, std::string what, torch::Device comm, ChannelSize* size)
{
  r.comm = comm;
  r.size = comm.type() == torch::kCPU ? size : nullptr;
  r.header = r.size != nullptr ? torch::empty({detail::header_bytes + size->capacity}, torch::kByte)
                               : torch::zeros({detail::header_size}, torch::TensorOptions().dtype(torch::kLong).device(comm));
  r.src = src;
  r.channel = channel;
  r.expect = std::move(e);
  r.what = std::move(what);
}

MPX_DECL void post_header(PendingRecv& r, ProcessGroupPtr& pg)
{
  std::vector<at::Tensor> v{r.header};
  r.header_work = pg->recv(v, r.src, detail::header_tag(r.channel));
}

MPX_DECL void post_recv(PendingRecv& r, ProcessGroupPtr& pg, int src, int channel, Expect e, std::string what,
                      torch::Device comm, ChannelSize* size)
{
  prepare_recv(r, src, channel, std::move(e), std::move(what), comm, size);
  post_header(r, pg);
}

}  // namespace mpx

namespace mpx::detail
{
MPX_DECL void make_buffers(PendingRecv& r, const HeaderLayout& h)
{
  const std::size_t n = h.fields.size();
  r.out.assign(n, at::Tensor());
  r.buf.assign(n, at::Tensor());
  r.grad.assign(n, false);
  std::int64_t off = header_bytes;
  for (std::size_t i = 0; i < n; ++i) {
    const FieldLayout& f = h.fields[i];
    if (!f.present) continue;
    if (h.packed >= 0) {  // a view of the message: it lives as long as the tensor does
      auto* data = static_cast<std::uint8_t*>(r.header.data_ptr()) + off;
      r.buf[i] = torch::from_blob(data, f.shape, [keep = r.header](void*) {}, torch::TensorOptions().dtype(f.wire));
      r.out[i] = f.dtype == f.wire ? r.buf[i] : torch::empty(f.shape, torch::TensorOptions().dtype(f.dtype));
      off += aligned(f.bytes);
    } else {
      r.out[i] = torch::empty(f.shape, torch::TensorOptions().dtype(f.dtype).device(r.comm));
      r.buf[i] = f.wire == f.dtype ? r.out[i] : torch::empty(f.shape, torch::TensorOptions().dtype(f.wire).device(r.comm));
    }
    r.grad[i] = f.requires_grad;
  }
}

MPX_DECL void post_payloads(ProcessGroupPtr& pg, PendingRecv& r)
{
  const at::Tensor host = r.header.cpu();
  const auto* hp = reinterpret_cast<const std::int64_t*>(host.data_ptr());  // int64, or bytes starting with the int64 header
  const auto capacity = std::int64_t(r.header.nbytes()) - header_bytes;  // negative for an exact (unpacked) header receive
  const HeaderLayout h = read_header(hp, capacity, r.expect, r.what);
  make_buffers(r, h);
  if (r.size) r.size->largest = std::max(r.size->largest, h.payload);
  if (h.packed < 0)
    for (std::size_t i = 0; i < r.buf.size(); ++i) {  // payloads in field order, all posted before any is waited on
      if (!r.buf[i].defined() || r.buf[i].numel() == 0) continue;
      std::vector<at::Tensor> v{r.buf[i]};
      r.works.push_back(pg->recv(v, r.src, payload_tag(r.channel)));
    }
  r.payload_posted.store(true, std::memory_order_release);
}

}  // namespace mpx::detail

namespace mpx
{
MPX_DECL std::vector<at::Tensor> finish_recv(ProcessGroupPtr& pg, PendingRecv& r, std::chrono::milliseconds timeout,
                                           const std::vector<at::Tensor>& like)
{
  using namespace detail;
  if (r.error) std::rethrow_exception(r.error);
  if (!r.payload_posted.load(std::memory_order_acquire)) {
    wait_bounded(r.header_work, r.comm, timeout);
    post_payloads(pg, r);
  }
  for (auto& w : r.works) wait_bounded(w, r.comm, timeout);
  for (std::size_t i = 0; i < r.out.size(); ++i) {
    if (!r.out[i].defined()) continue;
    if (r.expect.gradient && i < like.size() && like[i].defined() && like[i].sizes() != r.out[i].sizes())
      throw peer_error(error_start(r.what) + ": the gradient of field '" + r.expect.names[i] + "' of stage " +
                       std::to_string(r.expect.stage) + " has shape " + shape_text(r.out[i].sizes()) +
                       " but the activation sent had shape " + shape_text(like[i].sizes()));
    if (r.buf[i].data_ptr() != r.out[i].data_ptr()) r.out[i].copy_(r.buf[i]);
    if (r.grad[i] && r.out[i].is_floating_point()) r.out[i].requires_grad_(true);
  }
  return std::move(r.out);
}

}  // namespace mpx
#endif  // MPX_DEFINITIONS
