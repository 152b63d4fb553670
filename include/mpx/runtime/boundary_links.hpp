// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/boundary_links.hpp
/// `BoundaryLinks`: this rank's ends of the pipeline channels, over its pipeline lanes (world.hpp). `post`
/// posts the receive of one boundary value — always on lane tp_rank, the rank's own — `take` waits for it
/// (the wait is the action's idle time), `send` starts one on each lane that `send_lanes` names, and
/// `finish_sends` waits until every send of the step has completed. The lane rule: a value for slot d
/// leaves a rank of tensor-parallel rank k (of its slot's degree t) on the lanes j < degree(d) with
/// j mod t = k, so each of d's ranks receives exactly one copy, on its own lane (at degree 1 everywhere: one
/// lane, one send). How values travel:
/// - between ranks of one host (CPU messages), packed through a shared-memory ring per channel and direction
///   (`ShmLinks`, shm_links.hpp): a send is a copy into the ring, a post records the receive, and `take`
///   reads the channel's messages in the order their receives were posted (Gloo's matching);
/// - otherwise over Gloo, packed on the lane's group, matched by tag; each channel's capacity (`ChannelSize`,
///   per lane, peer and channel, at both ends) advanced by `next_step` at every step's start;
/// - as on NCCL (`World::ordered`: NCCL, or the NCCL-rules stand-in on CPU), each channel of each lane on
///   a group of its own two ranks (`World::channels`), as header + payloads, received by one `Receiver`
///   thread per incoming channel. NCCL runs a group's messages in posting order, and a posted receive holds
///   what follows it until its send arrives: on a group that carries one channel, in one direction, what
///   follows a receive is only the same channel's later receives, so receives posted ahead cannot hold back
///   a send, and every ordering the proof accepts (proof.hpp) runs.
/// Every failure here — a dead or silent peer, a message that breaks the boundary — is a `peer_error`.

#include <mpx/errors.hpp>     // mpx::peer_error
#include <mpx/runtime/shm_links.hpp>  // mpx::ShmLinks, mpx::ShmRing
#include <mpx/runtime/wire.hpp>       // mpx::send_tensors, mpx::post_recv, mpx::finish_recv, mpx::Receiver
#include <mpx/runtime/world/world.hpp>      // mpx::World
#include <mpx/linkage.hpp>  // MPX_DECL, MPX_DEFINITIONS

#include <chrono>   // std::chrono::steady_clock
#include <deque>    // std::deque
#include <map>      // std::map
#include <memory>   // std::unique_ptr
#include <string>   // std::string
#include <tuple>    // std::tuple
#include <utility>  // std::pair
#include <vector>   // std::vector

namespace mpx
{

class BoundaryLinks
{
 public:
  using clock = std::chrono::steady_clock;

  explicit BoundaryLinks(World& w);

  /// The lanes a value for slot `dst` leaves this rank on (see the file comment); none when another
  /// rank of this slot serves all of dst's ranks.
  std::vector<int> send_lanes(int dst) const;

  /// Over Gloo (CPU messages) values travel packed; as on NCCL, as header + payloads.
  bool packing() const { return comm_.is_cpu() && !ordered_; }

  /// At a step's start: each channel's capacity becomes the largest payload of the steps before.
  void next_step();

  /// Posts the receive of one value from slot `src` on `channel`.
  std::unique_ptr<PendingRecv> post(int src, int channel, Expect e, std::string what);

  /// Waits for a posted receive and returns its tensors (gradients: checked against the activations
  /// `like`); adds the time waited to `waited`.
  std::vector<at::Tensor> take(std::unique_ptr<PendingRecv>& r, clock::duration& waited, const std::vector<at::Tensor>& like = {});

  /// Starts sending one value (or its gradients) to slot `dst`, on every lane of `send_lanes(dst)`; `what`
  /// names it in errors.
  void send(int dst, int channel, int stage, int mb, bool gradient, const std::vector<at::Tensor>& ts, at::ScalarType wire, const std::string& what);

  /// Lets go of the sends that have completed without error, oldest first: their buffers (a stage's
  /// output, which a forward-only stage keeps no other way) are freed as soon as the peer has them. A
  /// failed one stays, for `finish_sends` to report.
  void release_completed_sends();

  /// Waits until every send started since the last call has completed.
  void finish_sends();

 private:
  /// A same-host channel: the message packed straight into the ring, or — when the ring has no room for
  /// it — a frame saying so, and the packed message over Gloo (the receiver receives it there).
  void send_shm(ShmRing& ring, ProcessGroupPtr& pg, int dst, int channel, detail::OutgoingMessage m, const std::string& what);

  /// Reads ring messages into the receives posted on it, oldest first, until `r` has its own (it may have
  /// it already: an earlier take read past it), checking each header as it lands (post_payloads: packed,
  /// so nothing more to receive).
  void arrive(PendingRecv& r);

  /// As on NCCL: the group of `channel` on `lane` (member 0 sends, member 1 receives).
  ProcessGroupPtr& channel_group(int lane, int channel);

  /// Runs `f`; any failure but a configuration error becomes a peer_error.
  template <class F>
  static void guarded(F&& f)
  {
    try {
      f();
    } catch (const peer_error&) {
      throw;
    } catch (const config_error&) {
      throw;
    } catch (const std::exception& e) {
      throw peer_error(e.what());
    }
  }

  ProcessGroupPtr pp_;                 // lane tp_rank: where this rank receives
  std::vector<ProcessGroupPtr> lanes_;  // where it sends
  std::vector<int> degree_;             // per slot, its tensor-parallel degree
  int tp_rank_, tp_size_;
  torch::Device comm_;
  bool ordered_;                                          // messages as on NCCL (see the file comment)
  std::map<std::pair<int, int>, ProcessGroupPtr> channels_;  // ordered: per (lane, channel), its group
  std::chrono::milliseconds timeout_;
  std::map<std::tuple<int, int, int>, ChannelSize> sent_, received_;  // per (lane, peer slot, channel): the capacity for packed payloads
  ShmLinks shm_;                                                      // same-host channels
  std::map<ShmRing*, std::deque<PendingRecv*>> posted_;               // per ring, receives posted and not yet read into
  std::vector<PendingSend> sends_;
  std::map<int, std::unique_ptr<Receiver>> receivers_;  // ordered: per incoming channel; last: they stop before the receives they point at are gone
};

}  // namespace mpx

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----

namespace mpx
{

MPX_DECL BoundaryLinks::BoundaryLinks(World& w)
    : pp_(w.pp), lanes_(w.lanes), degree_(w.degree), tp_rank_(w.tp_rank), tp_size_(w.tp_size), comm_(w.comm_device),
      ordered_(w.ordered()), channels_(w.channels), timeout_(w.timeout), shm_(w, packing())
{
}

MPX_DECL ProcessGroupPtr& BoundaryLinks::channel_group(int lane, int channel)
{
  auto it = channels_.find({lane, channel});
  if (it == channels_.end() || !it->second)
    throw config_error("mpx: no group for channel " + std::to_string(channel) + " on lane " + std::to_string(lane) +
                       " (messages as on NCCL need one per channel: make_world builds them; mpx bug)");
  return it->second;
}

MPX_DECL std::vector<int> BoundaryLinks::send_lanes(int dst) const
{
  std::vector<int> out;
  for (int j = tp_rank_; j < degree_[std::size_t(dst)]; j += tp_size_) out.push_back(j);
  return out;
}

MPX_DECL void BoundaryLinks::next_step()
{
  for (auto* sizes : {&sent_, &received_})
    for (auto& [key, size] : *sizes) size.next_step();
}

MPX_DECL std::unique_ptr<PendingRecv> BoundaryLinks::post(int src, int channel, Expect e, std::string what)
{
  auto r = std::make_unique<PendingRecv>();
  guarded([&] { r->ring = shm_.incoming(tp_rank_, src, channel); });
  if (r->ring) {
    r->src = src, r->channel = channel, r->expect = std::move(e), r->what = std::move(what);
    posted_[r->ring].push_back(r.get());
    return r;
  }
  if (ordered_) {
    guarded([&] {
      ProcessGroupPtr& g = channel_group(tp_rank_, channel);
      prepare_recv(*r, 0, channel, std::move(e), std::move(what), comm_);  // member 0 sends
      auto& receiver = receivers_[channel];
      if (!receiver) receiver = std::make_unique<Receiver>(g, timeout_);
      receiver->add(r.get());
    });
    return r;
  }
  guarded([&] {
    post_recv(*r, pp_, src, channel, std::move(e), std::move(what), comm_, packing() ? &received_[{tp_rank_, src, channel}] : nullptr);
  });
  return r;
}

MPX_DECL std::vector<at::Tensor> BoundaryLinks::take(std::unique_ptr<PendingRecv>& r, clock::duration& waited, const std::vector<at::Tensor>& like)
{
  const auto w0 = clock::now();
  std::vector<at::Tensor> out;
  guarded([&] {
    if (r->ring) arrive(*r);
    if (!ordered_) {
      out = finish_recv(pp_, *r, timeout_, like);
      return;
    }
    receivers_.at(r->channel)->await(*r);
    out = finish_recv(channel_group(tp_rank_, r->channel), *r, timeout_, like);
  });
  r.reset();
  waited += clock::now() - w0;
  return out;
}

MPX_DECL void BoundaryLinks::send(int dst, int channel, int stage, int mb, bool gradient,
                                  const std::vector<at::Tensor>& ts, at::ScalarType wire, const std::string& what)
{
  release_completed_sends();
  for (int lane : send_lanes(dst))
    guarded([&] {
      if (ordered_) {  // member 1 of the channel's group receives
        sends_.push_back(send_tensors(channel_group(lane, channel), 1, channel, stage, mb, gradient, ts, wire, what, comm_));
        return;
      }
      if (ShmRing* ring = shm_.outgoing(lane, dst, channel)) {
        send_shm(*ring, lanes_[std::size_t(lane)], dst, channel, detail::make_message(stage, mb, gradient, ts, wire, comm_), what);
        return;
      }
      sends_.push_back(send_tensors(lanes_[std::size_t(lane)], dst, channel, stage, mb, gradient, ts, wire, what, comm_,
                                    packing() ? &sent_[{lane, dst, channel}] : nullptr));
    });
}

MPX_DECL void BoundaryLinks::release_completed_sends()
{
  std::size_t done = 0;
  for (; done < sends_.size(); ++done) {
    bool complete = true;
    for (auto& wk : sends_[done].works) complete = complete && wk->isCompleted() && !wk->exception();
    if (!complete) break;
  }
  sends_.erase(sends_.begin(), sends_.begin() + std::ptrdiff_t(done));
}

MPX_DECL void BoundaryLinks::finish_sends()
{
  for (auto& s : sends_)
    for (auto& wk : s.works) {
      try {
        detail::wait_bounded(wk, comm_, timeout_);
      } catch (const std::exception& e) {
        sends_.clear();
        throw peer_error(s.what + ": the send did not complete: " + e.what());
      }
    }
  sends_.clear();
}

MPX_DECL void BoundaryLinks::send_shm(ShmRing& ring, ProcessGroupPtr& pg, int dst, int channel, detail::OutgoingMessage m, const std::string& what)
{
  m.header.data_ptr<std::int64_t>()[5] = m.bytes;
  const auto total = std::uint64_t(detail::header_bytes + m.bytes);
  const bool inline_sent = ring.try_write(total, [&](auto put) {
    detail::for_each_packed_piece(m, [&](const void* src, std::int64_t n) {
      static constexpr std::uint8_t zeros[detail::align] = {};
      put(src != nullptr ? src : zeros, std::uint64_t(n));
    });
  });
  if (inline_sent) return;
  ring.write_over_group(total, what);
  PendingSend p;
  p.what = what;
  std::vector<at::Tensor> v{detail::pack_message(m)};
  p.works.push_back(pg->send(v, dst, detail::header_tag(channel)));
  p.keep = std::move(v);
  sends_.push_back(std::move(p));
}

MPX_DECL void BoundaryLinks::arrive(PendingRecv& r)
{
  auto& queue = posted_[r.ring];
  while (!r.header.defined()) {
    if (queue.empty()) throw peer_error(r.what + ": taken twice, or never posted (mpx bug)");
    PendingRecv& next = *queue.front();
    queue.pop_front();
    bool over = false;
    std::uint64_t bytes = 0;
    next.header = next.ring->read(over, bytes, next.what);
    if (over) {  // this one came over Gloo
      next.header = torch::empty({std::int64_t(bytes)}, torch::kByte);
      std::vector<at::Tensor> v{next.header};
      pp_->recv(v, next.src, detail::header_tag(next.channel))->wait(timeout_);
    }
    if (next.header.numel() < detail::header_bytes)
      throw peer_error(next.what + ": a message of " + std::to_string(next.header.numel()) + " bytes, shorter than its header (" +
                       std::to_string(detail::header_bytes) + ")");
    detail::post_payloads(pp_, next);
  }
}

}  // namespace mpx
#endif  // MPX_DEFINITIONS
