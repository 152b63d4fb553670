// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/wire/receiver.hpp
/// `Receiver`: the one thread that receives a channel's messages where they travel as on NCCL (one group
/// per channel, header then payloads: boundary_links.hpp). In the order receives were added — the channel's
/// order, which is its micro-batch order — it posts a header receive, waits for the header, checks it and
/// posts the payload receives, then goes on to the next; so the group sees header, payloads, header,
/// payloads, exactly as the sender posts them, from one thread (NCCL's rules: messages meet in posting order,
/// a communicator is used from one thread). Payloads flow while the rank computes. Every wait has the
/// timeout, so a dead or silent peer fails the receive (and whoever awaits it) instead of hanging.

#include <mpx/runtime/wire/receive.hpp>  // mpx::PendingRecv, mpx::post_header, mpx::detail::post_payloads, wait_bounded

#include <chrono>              // std::chrono::milliseconds
#include <condition_variable>  // std::condition_variable
#include <deque>               // std::deque
#include <exception>           // std::rethrow_exception
#include <mutex>               // std::mutex
#include <thread>              // std::thread

namespace mpx
{

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

  /// Adds a prepared receive (prepare_recv): the thread posts it when those before it are posted.
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
      std::exception_ptr failed;
      try {
        post_header(*r, pg_);
        detail::wait_bounded(r->header_work, r->comm, timeout_);  // blocks this thread, not the compute
        detail::post_payloads(pg_, *r);  // its last act publishes the payloads; r is not touched after
      } catch (...) {
        failed = std::current_exception();
      }
      l.lock();
      if (failed) r->error = failed;
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

}  // namespace mpx
