// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/wire.hpp
/// What crosses a stage boundary, and how. A boundary value (a tensor, or a Hana struct of tensors) is sent
/// as one fixed-size header — stage, micro-batch, and per field its dtype, whether it carries a gradient,
/// and its shape — then one message per tensor. Headers and payloads travel on separate tags of the
/// channel, so receives posted ahead never meet the wrong message (Gloo matches by source and tag, first
/// in first out, and a receive buffer smaller than the message kills the process). A header that breaks
/// the declared boundary (field count, stage, micro-batch, or a gradient whose shape is not its
/// activation's) is an error naming stage, field and both shapes — never truncation or a hang.

#include <mpx/boundary.hpp>        // mpx::detail::is_hana_struct
#include <mpx/runtime/errors.hpp>  // mpx::peer_error
#include <mpx/runtime/world.hpp>   // mpx::ProcessGroupPtr
#include <mpx/torch/tensor.hpp>    // at::Tensor as TensorLike

#include <boost/hana/accessors.hpp>  // boost::hana::accessors
#include <boost/hana/for_each.hpp>   // boost::hana::for_each
#include <torch/torch.h>             // torch::empty

#include <atomic>              // std::atomic
#include <chrono>              // std::chrono::milliseconds
#include <condition_variable>  // std::condition_variable
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
inline constexpr int header_fixed = 5;   // magic, stage, mb, fields, kind (0 activation, 1 gradient)
inline constexpr int header_per_field = 4 + max_dims;  // dtype (-1: absent), wire dtype, requires_grad, ndim, dims
inline constexpr int header_size = header_fixed + max_fields * header_per_field;
inline constexpr std::int64_t header_magic = 0x6d70780001;  // "mpx" v1

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

/// The sending side of one message: keeps its buffers alive until every send has completed.
struct PendingSend
{
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  std::vector<at::Tensor> keep;
  std::string what;  ///< "SF3 of stage 1 to rank 2", for errors
};

/// Sends a list of tensors (a boundary value or its gradients) as header + payloads. `stage` is the stage
/// whose input the message is (the consumer for activations, the producer for gradients). `present[i] == false`
/// marks a field without a gradient: header only. `wire` (kFloat when none) is the dtype floating tensors
/// travel in (WireCompression).
inline PendingSend send_tensors(ProcessGroupPtr& pg, int dst, int channel, int stage, int mb, bool gradient,
                                const std::vector<at::Tensor>& ts, at::ScalarType wire, std::string what,
                                torch::Device comm = torch::kCPU)
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

/// The receiving side of one message. The header receive is posted at once; a `Receiver` thread posts the
/// payload receives as soon as the header is there, so payloads flow while the rank computes;
/// `finish_recv` waits for whatever is missing.
struct PendingRecv
{
  c10::intrusive_ptr<c10d::Work> header_work;
  at::Tensor header;
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
};

/// Posts the header receive of a message into `r`.
inline void post_recv(PendingRecv& r, ProcessGroupPtr& pg, int src, int channel, Expect e, std::string what,
                      torch::Device comm = torch::kCPU)
{
  r.comm = comm;
  r.header = torch::zeros({detail::header_size}, torch::TensorOptions().dtype(torch::kLong).device(comm));
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
  const auto* hp = host.data_ptr<std::int64_t>();
  if (hp[0] != header_magic) fail("the message is not an mpx boundary header (peer runs another protocol version?)");
  if (hp[1] != e.stage || hp[2] != e.mb || hp[4] != (e.gradient ? 1 : 0))
    fail("received " + std::string(hp[4] ? "gradients" : "activations") + " of stage " + std::to_string(hp[1]) +
         ", micro-batch " + std::to_string(hp[2]) + " where the schedule expects " + (e.gradient ? "gradients" : "activations") +
         " of stage " + std::to_string(e.stage) + ", micro-batch " + std::to_string(e.mb) + " (ranks run different tables?)");
  const auto n = static_cast<std::size_t>(hp[3]);
  if (n != e.names.size())
    fail("the boundary " + e.boundary + " of stage " + std::to_string(e.stage) + " has " + std::to_string(e.names.size()) +
         " fields but the message has " + std::to_string(n));
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
    r.out[i] = torch::empty(shape, torch::TensorOptions().dtype(static_cast<at::ScalarType>(f[0])).device(r.comm));
    r.buf[i] = f[1] == f[0] ? r.out[i]
                            : torch::empty(shape, torch::TensorOptions().dtype(static_cast<at::ScalarType>(f[1])).device(r.comm));
    r.grad[i] = f[2] != 0;
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
