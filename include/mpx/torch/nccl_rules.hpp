// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file torch/nccl_rules.hpp
/// `NcclRulesGroup`: a process group that carries point-to-point messages under NCCL's rules, over another
/// group (Gloo on CPU) — the CPU stand-in that lets tests and users check a pipeline's messages against
/// what NCCL would do, without a GPU (`MPX_NCCL_RULES=1`, docs/05 "On GPUs"). The rules, as NCCL states them
/// for one communicator (ProcessGroupNCCL runs each pair's messages on one stream):
/// - per peer, operations run in posting order, one at a time: a receive at the head holds every later
///   operation towards that peer, sends included, until its send arrives (and a send until its receive);
/// - there are no tags: the k-th send towards a peer meets that peer's k-th receive from this rank;
/// - count and dtype must be the same on both sides: a mismatch fails the receive with a named error
///   (NCCL would corrupt memory or hang);
/// - the group is used from one thread: a send or receive posted from a second thread is an error naming
///   both threads' first operations.
/// An operation that does not meet its peer's within the timeout (or whose peer's connection is gone) fails
/// with an error that names it and its peer (where NCCL's watchdog would end the process naming neither);
/// every later operation towards that peer fails with it. Coalesced groups (ncclGroupStart/End) are not modelled:
/// `startCoalescing` is an error. Collectives pass through to the group underneath (their order is the same
/// under Gloo and NCCL: every member calls them in one order).

#include <mpx/errors.hpp>               // mpx::config_error, mpx::peer_error
#include <mpx/linkage.hpp>              // MPX_DECL, MPX_DEFINITIONS
#include <mpx/torch/process_group.hpp>  // mpx::ProcessGroupBase, mpx::ProcessGroupPtr

#include <torch/torch.h>  // at::Tensor

#include <atomic>              // std::atomic
#include <chrono>              // std::chrono::milliseconds
#include <condition_variable>  // std::condition_variable
#include <deque>               // std::deque
#include <map>                 // std::map
#include <memory>              // std::unique_ptr
#include <mutex>               // std::mutex
#include <string>              // std::string
#include <thread>              // std::thread

namespace mpx
{

class NcclRulesGroup : public ProcessGroupBase
{
 public:
  /// Over `inner` (its rank and size), which this group then uses alone; `name` names it in errors.
  MPX_DECL NcclRulesGroup(ProcessGroupPtr inner, std::chrono::milliseconds timeout, std::string name);
  MPX_DECL ~NcclRulesGroup() override;

  const std::string getBackendName() const override { return "mpx-nccl-rules"; }

  MPX_DECL c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  MPX_DECL c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  MPX_DECL void startCoalescing() override;

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& t, const c10d::AllreduceOptions& o) override { return inner_->allreduce(t, o); }
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& t, const c10d::BroadcastOptions& o) override { return inner_->broadcast(t, o); }
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& out, std::vector<at::Tensor>& in,
                                           const c10d::AllgatherOptions& o) override
  {
    return inner_->allgather(out, in, o);
  }
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& out, at::Tensor& in, std::vector<int64_t>& out_counts, std::vector<int64_t>& in_counts,
                                               const c10d::AllToAllOptions& o) override
  {
    return inner_->alltoall_base(out, in, out_counts, in_counts, o);
  }
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& o) override { return inner_->barrier(o); }

 private:
  /// A send or receive as it waits in its peer's queue.
  struct Op;
  struct Peer;
  MPX_DECL c10::intrusive_ptr<c10d::Work> post(std::vector<at::Tensor>& tensors, int peer, bool is_send);
  MPX_DECL void check_thread(const std::string& op);
  MPX_DECL void run(Peer& p, int peer);
  MPX_DECL void transfer(Op& op, int peer);

  ProcessGroupPtr inner_;
  std::chrono::milliseconds timeout_;
  std::string name_;
  std::mutex m_;
  std::map<int, std::unique_ptr<Peer>> peers_;
  std::atomic<bool> owned_{false};
  std::thread::id owner_;
  std::string owner_first_;  ///< the owning thread's first operation, for the error
};

}  // namespace mpx

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----

namespace mpx
{

/// The Work of one operation: finished by its peer's worker.
class NcclRulesWork : public c10d::Work
{
 public:
  NcclRulesWork() = default;
  void done(std::exception_ptr e) { finish(e); }
};

struct NcclRulesGroup::Op
{
  bool is_send = false;
  at::Tensor tensor;
  c10::intrusive_ptr<NcclRulesWork> work;
  std::string what;  ///< "receive #3 from member 1 (4 x float)"
};

struct NcclRulesGroup::Peer
{
  std::deque<Op> queue;
  std::condition_variable cv;
  bool stop = false;
  std::exception_ptr broken;  ///< set once an operation failed: every later one fails with it
  long sends = 0, recvs = 0;
  std::thread worker;
};

MPX_DECL NcclRulesGroup::NcclRulesGroup(ProcessGroupPtr inner, std::chrono::milliseconds timeout, std::string name)
    : ProcessGroupBase(inner->getRank(), inner->getSize()), inner_(std::move(inner)), timeout_(timeout), name_(std::move(name))
{}

MPX_DECL NcclRulesGroup::~NcclRulesGroup()
{
  {
    std::lock_guard<std::mutex> l(m_);
    for (auto& [peer, p] : peers_) p->stop = true;
  }
  for (auto& [peer, p] : peers_) {
    p->cv.notify_all();
    if (p->worker.joinable()) p->worker.join();
  }
}

MPX_DECL void NcclRulesGroup::startCoalescing()
{
  throw config_error("mpx: " + name_ + ": NCCL's groups (coalesced operations) are not modelled by the NCCL-rules stand-in");
}

MPX_DECL c10::intrusive_ptr<c10d::Work> NcclRulesGroup::send(std::vector<at::Tensor>& tensors, int dst, int)
{
  return post(tensors, dst, true);
}

MPX_DECL c10::intrusive_ptr<c10d::Work> NcclRulesGroup::recv(std::vector<at::Tensor>& tensors, int src, int)
{
  return post(tensors, src, false);
}

MPX_DECL void NcclRulesGroup::check_thread(const std::string& op)
{
  bool was = false;
  if (owned_.compare_exchange_strong(was, true)) {
    owner_ = std::this_thread::get_id();
    owner_first_ = op;
    return;
  }
  if (owner_ != std::this_thread::get_id())
    throw config_error("mpx: " + name_ + ": " + op + " was posted from a second thread; the group's first operation (" + owner_first_ +
                       ") came from another. NCCL's rule: a communicator is used from one thread");
}

MPX_DECL c10::intrusive_ptr<c10d::Work> NcclRulesGroup::post(std::vector<at::Tensor>& tensors, int peer, bool is_send)
{
  if (tensors.size() != 1 || peer < 0 || peer >= getSize() || peer == getRank())
    throw config_error("mpx: " + name_ + ": a send or receive takes one tensor and another member's rank");
  std::lock_guard<std::mutex> l(m_);
  auto& p = peers_[peer];
  if (!p) {
    p = std::make_unique<Peer>();
    p->worker = std::thread([this, peer, q = p.get()] { run(*q, peer); });
  }
  const at::Tensor& t = tensors[0];
  Op op;
  op.is_send = is_send;
  op.tensor = t;
  op.work = c10::make_intrusive<NcclRulesWork>();
  op.what = std::string(is_send ? "send #" : "receive #") + std::to_string(is_send ? p->sends++ : p->recvs++) + (is_send ? " to" : " from") +
            " member " + std::to_string(peer) + " (" + std::to_string(t.numel()) + " x " + std::string(c10::toString(t.scalar_type())) + ")";
  check_thread(op.what);
  auto work = op.work;
  p->queue.push_back(std::move(op));
  p->cv.notify_all();
  return work;
}

MPX_DECL void NcclRulesGroup::run(Peer& p, int peer)
{
  std::unique_lock<std::mutex> l(m_);
  while (true) {
    p.cv.wait(l, [&] { return p.stop || !p.queue.empty(); });
    if (p.queue.empty()) return;  // stopping, nothing left
    Op op = std::move(p.queue.front());
    p.queue.pop_front();
    const std::exception_ptr broken = p.broken;
    l.unlock();
    std::exception_ptr failed = broken;
    if (!failed) try {
        transfer(op, peer);
      } catch (...) {
        failed = std::current_exception();
      }
    op.work->done(failed);
    l.lock();
    p.broken = failed;
  }
}

MPX_DECL void NcclRulesGroup::transfer(Op& op, int peer)
{
  // what travels first: count, dtype; then the data (in the sender's count and dtype)
  auto desc = torch::tensor({op.tensor.numel(), std::int64_t(op.tensor.scalar_type())}, torch::kLong);
  auto wait = [&](c10::intrusive_ptr<c10d::Work> w, const char* part) {
    try {
      w->wait(timeout_);
    } catch (const std::exception& e) {
      throw peer_error("mpx: " + name_ + ", member " + std::to_string(getRank()) + ": " + op.what + " did not meet its " + part +
                       " (the wait's limit: " + std::to_string(timeout_.count()) + " ms); under NCCL's rules it holds every later " +
                       "operation towards member " + std::to_string(peer) + " until that member posts the matching " +
                       (op.is_send ? "receive" : "send") + " (" + e.what() + ")");
    }
  };
  std::vector<at::Tensor> d{desc};
  if (op.is_send) {
    wait(inner_->send(d, peer, 0), "receiver");
    std::vector<at::Tensor> v{op.tensor.contiguous()};
    wait(inner_->send(v, peer, 0), "receiver");
    return;
  }
  wait(inner_->recv(d, peer, 0), "sender");
  const std::int64_t n = desc[0].item<std::int64_t>();
  const auto dtype = static_cast<at::ScalarType>(desc[1].item<std::int64_t>());
  const bool same = n == op.tensor.numel() && dtype == op.tensor.scalar_type() && op.tensor.is_contiguous();
  std::vector<at::Tensor> v{same ? op.tensor : torch::empty({n}, torch::TensorOptions().dtype(dtype))};
  wait(inner_->recv(v, peer, 0), "sender");  // received in full either way: the sender's queue goes on
  if (!same)
    throw peer_error("mpx: " + name_ + ", member " + std::to_string(getRank()) + ": " + op.what + " met a send of " + std::to_string(n) +
                     " x " + std::string(c10::toString(dtype)) + "; NCCL's rule: count and dtype are the same on both sides " +
                     "(messages meet in posting order: the two ranks post them in different orders, or sizes differ)");
}

}  // namespace mpx
#endif  // MPX_DEFINITIONS
