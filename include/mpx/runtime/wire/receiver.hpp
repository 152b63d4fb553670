// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/wire/receiver.hpp
/// `Receiver`: a thread that posts payload receives the moment their header arrives, so that payloads flow
/// while the rank computes (a Gloo send completes only once its receive is posted). Used where messages
/// travel as header + payloads (NCCL, whose receives must match the message's size); packed Gloo messages
/// need none. Receives are advanced in the order they were added, which is the order the schedule
/// consumes them. Every wait has the timeout, so a dead or silent peer fails the receive (and whoever
/// awaits it) instead of hanging.

#include <mpx/runtime/wire/receive.hpp>  // mpx::PendingRecv, mpx::detail::post_payloads

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
        // Gloo's receive work completes only inside wait(), so this thread blocks here, not the compute
        r->header_work->wait(timeout_);
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
