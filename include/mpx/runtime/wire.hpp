// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/wire.hpp
/// What crosses a stage boundary, and how. A boundary value (a tensor, or a Hana struct of tensors) is sent
/// as one fixed-size header — stage, micro-batch, and per field its dtype, whether it carries a gradient,
/// and its shape — then its tensors. Over Gloo the tensors usually travel in the header's message (packed,
/// one message per boundary value): the receiver posts a buffer with room for the channel's largest
/// payload of earlier steps, and a value that fits is sent whole into it. A larger one (the first step, a
/// grown shape) sends its header alone, then one message per tensor on the channel's payload tag, whose
/// receives are posted once the header has been read. Receives posted ahead never meet the wrong message (Gloo
/// matches by source and tag, first in first out; a larger buffer than the message is filled in part, a
/// smaller one kills the process, which is why both ends derive the room from the same earlier messages).
/// A header that breaks the declared boundary (field count, stage, micro-batch, or a gradient whose shape
/// is not its activation's) is an error naming stage, field and both shapes — never truncation or a hang.

#include <mpx/boundary.hpp>        // mpx::detail::is_hana_struct
#include <mpx/runtime/errors.hpp>  // mpx::peer_error
#include <mpx/runtime/world.hpp>   // mpx::ProcessGroupPtr
#include <mpx/torch/tensor.hpp>    // at::Tensor as TensorLike

#include <boost/hana/accessors.hpp>  // boost::hana::accessors
#include <boost/hana/for_each.hpp>   // boost::hana::for_each
#include <torch/torch.h>             // torch::empty

#include <atomic>              // std::atomic
#include <algorithm>           // std::max
#include <chrono>              // std::chrono::milliseconds
#include <condition_variable>  // std::condition_variable
#include <cstring>             // std::memcpy
#include <deque>               // std::deque
#include <exception>           // std::exception_ptr
#include <mutex>               // std::mutex
#include <thread>              // std::thread
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

/// Tags: two per channel (header, payload); channel 2*b+d carries direction d across boundary b.
inline int header_tag(int channel) { return 2 * channel; }
inline int payload_tag(int channel) { return 2 * channel + 1; }

/// A boundary value as a list of tensors, in member order.
template <class T>
std::vector<at::Tensor> flatten(const T& v)
{
  if constexpr (std::is_same_v<std::remove_cvref_t<T>, at::Tensor>) {
    return {v};
  } else {
    std::vector<at::Tensor> out;
    boost::hana::for_each(boost::hana::accessors<T>(), [&](auto p) { out.push_back(boost::hana::second(p)(v)); });
    return out;
  }
}

/// The inverse of `flatten`.
template <class T>
T unflatten(const std::vector<at::Tensor>& ts)
{
  if constexpr (std::is_same_v<std::remove_cvref_t<T>, at::Tensor>) {
    return ts.at(0);
  } else {
    T v{};
    std::size_t i = 0;
    boost::hana::for_each(boost::hana::accessors<T>(), [&](auto p) { boost::hana::second(p)(v) = ts.at(i++); });
    return v;
  }
}

/// Member names of a boundary type, for error messages.
template <class T>
std::vector<std::string> field_names()
{
  if constexpr (std::is_same_v<std::remove_cvref_t<T>, at::Tensor>) {
    return {"tensor"};
  } else {
    std::vector<std::string> out;
    boost::hana::for_each(boost::hana::accessors<T>(), [&](auto p) {
      out.emplace_back(std::remove_cvref_t<decltype(boost::hana::first(p))>::c_str());
    });
    return out;
  }
}

inline std::string shape_text(at::IntArrayRef s)
{
  std::ostringstream o;
  o << "[";
  for (std::size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
  return o.str() + "]";
}
}  // namespace detail

/// One end's record of a directed channel's message sizes, for packing (Gloo only: NCCL needs a receive of
/// exactly the message's size). A receive has room for `room` payload bytes after the header, the largest
/// payload of the channel's earlier steps. Both ends know it without talking: a step's receives are all
/// posted, and its messages all sent, within the step, so `next_step()` at each step's start keeps them equal.
/// One thread uses it: receive packed messages without a `Receiver` (`finish_recv` parses them).
struct ChannelSize
{
  std::int64_t room = 0;     ///< payload bytes the receives of this step have room for
  std::int64_t largest = 0;  ///< the largest payload so far: the next step's room
  void next_step() { room = largest; }
};

/// The sending side of one message: keeps its buffers alive until every send has completed.
struct PendingSend
{
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  std::vector<at::Tensor> keep;
  std::string what;  ///< "SF3 of stage 1 to rank 2", for errors
};

/// Sends a list of tensors (a boundary value or its gradients) as header + payloads. `stage` is the stage
/// whose input the message is (the consumer for activations, the producer for gradients). An undefined
/// tensor marks a field without a gradient: header only. `wire` (kFloat when none) is the dtype floating
/// tensors travel in (WireCompression). With `size` (the channel's record at this end; CPU tensors only),
/// a payload that fits the receiver's room travels packed in the header's message.
inline PendingSend send_tensors(ProcessGroupPtr& pg, int dst, int channel, int stage, int mb, bool gradient,
                                const std::vector<at::Tensor>& ts, at::ScalarType wire, std::string what,
                                torch::Device comm = torch::kCPU, ChannelSize* size = nullptr)
{
  using namespace detail;
  if (ts.size() > std::size_t(max_fields))
    throw config_error("mpx: a boundary has " + std::to_string(ts.size()) + " fields, more than the " +
                       std::to_string(max_fields) + " the wire header holds; group them into fewer tensors");
  PendingSend p;
  p.what = std::move(what);
  auto h = torch::zeros({header_size}, torch::kLong);
  auto* hp = h.data_ptr<std::int64_t>();
  hp[0] = header_magic;
  hp[1] = stage;
  hp[2] = mb;
  hp[3] = static_cast<std::int64_t>(ts.size());
  hp[4] = gradient ? 1 : 0;
  std::vector<at::Tensor> payload;
  for (std::size_t i = 0; i < ts.size(); ++i) {
    std::int64_t* f = hp + header_fixed + i * header_per_field;
    const at::Tensor& t = ts[i];
    if (!t.defined()) {
      f[0] = -1;
      continue;
    }
    if (t.dim() > max_dims)
      throw config_error("mpx: field " + std::to_string(i) + " of stage " + std::to_string(stage) + "'s boundary has " +
                         std::to_string(t.dim()) + " dims, more than " + std::to_string(max_dims) + "; reshape it");
    at::Tensor x = t.detach();
    if (wire != at::kFloat && x.is_floating_point() && x.scalar_type() != wire) x = x.to(wire);
    x = x.to(comm).contiguous();
    f[0] = static_cast<std::int64_t>(t.scalar_type());
    f[1] = static_cast<std::int64_t>(x.scalar_type());
    f[2] = t.requires_grad() ? 1 : 0;
    f[3] = t.dim();
    for (int d = 0; d < t.dim(); ++d) f[4 + d] = t.size(d);
    payload.push_back(x);
  }
  std::int64_t bytes = 0;  // the payload packed: each tensor at an aligned offset
  for (auto& x : payload) bytes += aligned(std::int64_t(x.nbytes()));
  const bool packed = size != nullptr && comm.type() == torch::kCPU && bytes <= size->room;
  if (size) size->largest = std::max(size->largest, bytes);
  hp[5] = packed ? bytes : -1;
  if (packed) {
    auto msg = torch::empty({header_bytes + bytes}, torch::kByte);
    auto* out = msg.data_ptr<std::uint8_t>();
    std::memcpy(out, hp, header_size * sizeof(std::int64_t));
    std::int64_t off = header_bytes;
    for (auto& x : payload) {
      if (x.nbytes() > 0) std::memcpy(out + off, x.data_ptr(), x.nbytes());
      off += aligned(std::int64_t(x.nbytes()));
    }
    std::vector<at::Tensor> mv{msg};
    p.works.push_back(pg->send(mv, dst, header_tag(channel)));
    p.keep.push_back(msg);
    return p;
  }
  if (comm.type() != torch::kCPU) h = h.to(comm);  // NCCL sends device tensors only
  std::vector<at::Tensor> hv{h};
  p.works.push_back(pg->send(hv, dst, header_tag(channel)));
  p.keep.push_back(h);
  for (auto& x : payload) {
    if (x.numel() == 0) continue;
    std::vector<at::Tensor> v{x};
    p.works.push_back(pg->send(v, dst, payload_tag(channel)));
    p.keep.push_back(x);
  }
  return p;
}

/// What a receive must carry, checked against its header.
struct Expect
{
  int stage = 0;
  int mb = 0;
  bool gradient = false;
  std::vector<std::string> names;  ///< field names of the boundary type
  std::string boundary;            ///< the boundary type's name
};

/// The receiving side of one message. The header receive (with room for a packed payload) is posted at
/// once; payloads that follow separately are posted as soon as the header is there — by a `Receiver`
/// thread, so that they flow while the rank computes, or by `finish_recv`, which waits for whatever is
/// missing.
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
};

/// Posts the header receive of a message into `r`. With `size` (the channel's record at this end; CPU
/// only), the receive has room for the channel's largest payload of earlier steps, packed after the header.
inline void post_recv(PendingRecv& r, ProcessGroupPtr& pg, int src, int channel, Expect e, std::string what,
                      torch::Device comm = torch::kCPU, ChannelSize* size = nullptr)
{
  r.comm = comm;
  r.size = comm.type() == torch::kCPU ? size : nullptr;
  r.header = size != nullptr && comm.type() == torch::kCPU
                 ? torch::empty({detail::header_bytes + size->room}, torch::kByte)
                 : torch::zeros({detail::header_size}, torch::TensorOptions().dtype(torch::kLong).device(comm));
  std::vector<at::Tensor> v{r.header};
  r.src = src;
  r.channel = channel;
  r.expect = std::move(e);
  r.what = std::move(what);
  r.header_work = pg->recv(v, src, detail::header_tag(channel));
}

namespace detail
{
/// Checks the (arrived) header and posts the payload receives.
inline void post_payloads(ProcessGroupPtr& pg, PendingRecv& r)
{
  const Expect& e = r.expect;
  auto fail = [&](const std::string& msg) { throw peer_error("mpx: " + r.what + ": " + msg); };
  const at::Tensor host = r.header.cpu();
  const auto* hp = reinterpret_cast<const std::int64_t*>(host.data_ptr());  // int64, or bytes starting with the int64 header
  if (hp[0] != header_magic) fail("the message is not an mpx boundary header (peer runs another protocol version?)");
  if (hp[1] != e.stage || hp[2] != e.mb || hp[4] != (e.gradient ? 1 : 0))
    fail("received " + std::string(hp[4] ? "gradients" : "activations") + " of stage " + std::to_string(hp[1]) +
         ", micro-batch " + std::to_string(hp[2]) + " where the schedule expects " + (e.gradient ? "gradients" : "activations") +
         " of stage " + std::to_string(e.stage) + ", micro-batch " + std::to_string(e.mb) + " (ranks run different tables?)");
  const auto n = static_cast<std::size_t>(hp[3]);
  if (n != e.names.size())
    fail("the boundary " + e.boundary + " of stage " + std::to_string(e.stage) + " has " + std::to_string(e.names.size()) +
         " fields but the message has " + std::to_string(n));
  const std::int64_t packed = hp[5];
  std::int64_t payload = 0;  // the payload's packed size, as the sender counted it
  const auto room = std::int64_t(r.header.nbytes()) - header_bytes;  // negative for an exact (unpacked) header receive
  if (packed > 0 && packed > room)
    fail("the message packs " + std::to_string(packed) + " payload bytes, the receive had room for " +
         std::to_string(std::max<std::int64_t>(room, 0)) + " (the two ends disagree on the channel's size)");
  std::int64_t off = header_bytes;
  r.out.assign(n, at::Tensor());
  r.buf.assign(n, at::Tensor());
  r.grad.assign(n, false);
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t* f = hp + header_fixed + i * header_per_field;
    if (f[0] < 0) continue;  // no gradient for this field
    if (f[3] < 0 || f[3] > max_dims) fail("field '" + e.names[i] + "' has an invalid rank " + std::to_string(f[3]));
    std::vector<std::int64_t> shape(f + 4, f + 4 + f[3]);
    for (auto d : shape)
      if (d < 0) fail("field '" + e.names[i] + "' has a negative extent in " + shape_text(shape));
    const auto dtype = static_cast<at::ScalarType>(f[0]), wire = static_cast<at::ScalarType>(f[1]);
    std::int64_t bytes = c10::elementSize(wire);
    for (auto d : shape) bytes *= d;
    payload += aligned(bytes);
    if (packed >= 0) {  // a view of the message: it lives as long as the tensor does
      if (off + bytes > header_bytes + packed) fail("field '" + e.names[i] + "' of " + shape_text(shape) + " overruns the packed payload");
      auto* data = static_cast<std::uint8_t*>(r.header.data_ptr()) + off;
      r.buf[i] = torch::from_blob(data, shape, [keep = r.header](void*) {}, torch::TensorOptions().dtype(wire));
      r.out[i] = dtype == wire ? r.buf[i] : torch::empty(shape, torch::TensorOptions().dtype(dtype));
      off += aligned(bytes);
    } else {
      r.out[i] = torch::empty(shape, torch::TensorOptions().dtype(dtype).device(r.comm));
      r.buf[i] = wire == dtype ? r.out[i] : torch::empty(shape, torch::TensorOptions().dtype(wire).device(r.comm));
    }
    r.grad[i] = f[2] != 0;
  }
  if (r.size) r.size->largest = std::max(r.size->largest, payload);
  if (packed >= 0) {  // everything arrived in the header's message
    r.payload_posted.store(true, std::memory_order_release);
    return;
  }
  for (std::size_t i = 0; i < n; ++i) {  // payloads in field order, all posted before any is waited on
    if (!r.buf[i].defined() || r.buf[i].numel() == 0) continue;
    std::vector<at::Tensor> v{r.buf[i]};
    r.works.push_back(pg->recv(v, r.src, payload_tag(r.channel)));
  }
  r.payload_posted.store(true, std::memory_order_release);
}
}  // namespace detail

/// A thread that posts payload receives the moment their header arrives, so that payloads flow while the
/// rank computes (a Gloo send completes only once its receive is posted). Receives are advanced in the
/// order they were posted, which is the order the schedule consumes them. Every wait has the timeout, so a
/// dead or silent peer fails the receive (and whoever awaits it) instead of hanging.
class Receiver
{
 public:
  Receiver(ProcessGroupPtr pg, std::chrono::milliseconds timeout) : pg_(std::move(pg)), timeout_(timeout), thread_([this] { loop(); }) {}
  ~Receiver()
  {
    {
      std::lock_guard<std::mutex> l(m_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  Receiver(const Receiver&) = delete;
  Receiver& operator=(const Receiver&) = delete;

  void add(PendingRecv* r)
  {
    {
      std::lock_guard<std::mutex> l(m_);
      queue_.push_back(r);
    }
    cv_.notify_all();
  }
  /// Blocks until `r`'s payloads are posted; rethrows its failure (the thread's wait has the timeout).
  void await(PendingRecv& r)
  {
    std::unique_lock<std::mutex> l(m_);
    done_.wait(l, [&] { return r.payload_posted.load() || r.error; });
    if (r.error) std::rethrow_exception(r.error);
  }
 private:
  void loop()
  {
    std::unique_lock<std::mutex> l(m_);
    while (true) {
      cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      PendingRecv* r = queue_.front();
      l.unlock();
      try {
        // Gloo's receive work completes only inside wait(), so this thread blocks here, not the compute
        r->header_work->wait(timeout_);
        detail::post_payloads(pg_, *r);  // its last act publishes the payloads; r is not touched after
      } catch (...) {
        l.lock();
        r->error = std::current_exception();
        queue_.pop_front();
        done_.notify_all();
        continue;
      }
      l.lock();
      queue_.pop_front();
      done_.notify_all();
    }
  }

  ProcessGroupPtr pg_;
  std::chrono::milliseconds timeout_;
  std::mutex m_;
  std::condition_variable cv_, done_;
  std::deque<PendingRecv*> queue_;
  bool stop_ = false;
  std::thread thread_;
};

/// Waits for the header (if needed: without a Receiver) and the payloads. Returns one tensor per field (undefined for fields
/// without gradient), in the sender's dtype, with requires_grad as the sender had it. For gradients,
/// `like` are the activations sent: each gradient's shape must be its activation's.
inline std::vector<at::Tensor> finish_recv(ProcessGroupPtr& pg, PendingRecv& r, std::chrono::milliseconds timeout,
                                           const std::vector<at::Tensor>& like = {})
{
  using namespace detail;
  if (r.error) std::rethrow_exception(r.error);
  if (!r.payload_posted.load(std::memory_order_acquire)) {
    r.header_work->wait(timeout);
    post_payloads(pg, r);
  }
  for (auto& w : r.works) w->wait(timeout);
  for (std::size_t i = 0; i < r.out.size(); ++i) {
    if (!r.out[i].defined()) continue;
    if (r.expect.gradient && i < like.size() && like[i].defined() && like[i].sizes() != r.out[i].sizes())
      throw peer_error("mpx: " + r.what + ": the gradient of field '" + r.expect.names[i] + "' of stage " +
                       std::to_string(r.expect.stage) + " has shape " + shape_text(r.out[i].sizes()) +
                       " but the activation sent had shape " + shape_text(like[i].sizes()));
    if (r.buf[i].data_ptr() != r.out[i].data_ptr()) r.out[i].copy_(r.buf[i]);
    if (r.grad[i] && r.out[i].is_floating_point()) r.out[i].requires_grad_(true);
  }
  return std::move(r.out);
}

}  // namespace mpx
