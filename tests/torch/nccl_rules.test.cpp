// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/torch/nccl_rules.hpp: two real processes (forked), a Gloo group between them, and the
// NCCL-rules stand-in over it. What passes over Gloo (messages matched by tag) and deadlocks under NCCL's
// posting order fails here within the timeout, named; a group per direction passes; a size that differs
// and a second thread are named errors.
#include "support/catch_torch.hpp"

#include <mpx/errors.hpp>
#include <mpx/torch/nccl_rules.hpp>

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <sys/wait.h>  // waitpid
#include <unistd.h>    // fork, pipe, _exit

#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>

namespace
{
using namespace std::chrono_literals;
using Rank = std::function<std::string(int rank, const c10::intrusive_ptr<c10d::Store>& store)>;

mpx::ProcessGroupPtr gloo_group(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix, int rank)
{
  auto opts = c10d::ProcessGroupGloo::Options::create(std::chrono::milliseconds(20000));
  opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  return c10::make_intrusive<c10d::ProcessGroupGloo>(c10::make_intrusive<c10d::PrefixStore>(prefix, store), rank, 2, opts);
}
c10::intrusive_ptr<mpx::NcclRulesGroup> rules(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix, int rank)
{
  return c10::make_intrusive<mpx::NcclRulesGroup>(gloo_group(store, prefix, rank), 1500ms, "group " + prefix);
}

/// Runs `body` as ranks 0 and 1 in two forked processes; returns what each returned ("ok", or an error's text).
std::array<std::string, 2> two_ranks(const Rank& body)
{
  static int run = 0;
  const std::string path = "/tmp/mpx-nccl-rules-" + std::to_string(::getpid()) + "-" + std::to_string(run++);
  std::remove(path.c_str());
  std::array<std::string, 2> out;
  std::array<int, 2> fds{};
  std::array<pid_t, 2> pids{};
  for (int r = 0; r < 2; ++r) {
    int p[2];
    REQUIRE(::pipe(p) == 0);
    pids[r] = ::fork();
    if (pids[r] == 0) {
      ::close(p[0]);
      std::string said;
      try {
        said = body(r, c10::make_intrusive<c10d::FileStore>(path, 2));
      } catch (const std::exception& e) {
        said = e.what();
      }
      [[maybe_unused]] auto n = ::write(p[1], said.data(), said.size());
      ::_exit(0);
    }
    ::close(p[1]);
    fds[r] = p[0];
  }
  for (int r = 0; r < 2; ++r) {
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fds[r], buf, sizeof buf)) > 0) out[r].append(buf, std::size_t(n));
    ::close(fds[r]);
    int status = 0;
    ::waitpid(pids[r], &status, 0);
  }
  std::remove(path.c_str());
  return out;
}

std::string await(const c10::intrusive_ptr<c10d::Work>& w)
{
  w->wait(std::chrono::milliseconds(20000));
  return "ok";
}
}  // namespace

TEST_CASE("Receives posted ahead: fine over Gloo's tags, a named deadlock under NCCL's rules", "[torch][nccl_rules]")
{
  // the pipeline's old posting order: each rank posts its receive first, then sends what the other waits for
  auto exchange = [](bool stand_in) {
    return [stand_in](int rank, const c10::intrusive_ptr<c10d::Store>& store) {
      mpx::ProcessGroupPtr g = stand_in ? mpx::ProcessGroupPtr(rules(store, "pp/", rank)) : gloo_group(store, "pp/", rank);
      const int peer = 1 - rank;
      std::vector<at::Tensor> in{torch::zeros({4})}, out{torch::full({4}, float(rank + 1))};
      auto r = g->recv(in, peer, rank == 0 ? 1 : 0);  // rank 0 waits for a gradient (tag 1), rank 1 for an activation (tag 0)
      auto s = g->send(out, peer, rank == 0 ? 0 : 1);
      await(s);
      await(r);
      return in[0][0].item<float>() == float(peer + 1) ? std::string("ok") : std::string("wrong data");
    };
  };
  const auto gloo_run = two_ranks(exchange(false));
  CHECK(gloo_run[0] == "ok");
  CHECK(gloo_run[1] == "ok");
  const auto t0 = std::chrono::steady_clock::now();
  const auto rules_run = two_ranks(exchange(true));
  CHECK(std::chrono::steady_clock::now() - t0 < 15s);  // within the timeout (1.5 s), not a hang
  for (const auto& said : rules_run) {
    CHECK_THAT(said, Catch::Contains("receive #0 from member") && Catch::Contains("did not meet its sender") &&
                         Catch::Contains("holds every later operation"));
  }
}

TEST_CASE("A group per direction: the same exchange passes under NCCL's rules", "[torch][nccl_rules]")
{
  const auto run = two_ranks([](int rank, const c10::intrusive_ptr<c10d::Store>& store) {
    auto forward = rules(store, "f/", rank), backward = rules(store, "b/", rank);  // activations 0 -> 1, gradients 1 -> 0
    const int peer = 1 - rank;
    std::vector<at::Tensor> in{torch::zeros({4})}, out{torch::full({4}, float(rank + 1))};
    auto& receives_on = rank == 0 ? backward : forward;
    auto& sends_on = rank == 0 ? forward : backward;
    auto r = receives_on->recv(in, peer, 0);
    auto s = sends_on->send(out, peer, 0);
    await(s);
    await(r);
    return in[0][0].item<float>() == float(peer + 1) ? std::string("ok") : std::string("wrong data");
  });
  CHECK(run[0] == "ok");
  CHECK(run[1] == "ok");
}

TEST_CASE("Under NCCL's rules a send meets the receive posted in the same place, whatever the tags", "[torch][nccl_rules]")
{
  const auto run = two_ranks([](int rank, const c10::intrusive_ptr<c10d::Store>& store) {
    auto g = rules(store, "g/", rank);
    std::vector<at::Tensor> a{torch::full({2}, 1.f)}, b{torch::full({3}, 2.f)};
    if (rank == 0) {
      await(g->send(a, 1, 7));
      await(g->send(b, 1, 8));
      return std::string("ok");
    }
    std::vector<at::Tensor> first{torch::zeros({2})}, second{torch::zeros({4})};  // the second is one float too long
    await(g->recv(first, 0, 8));  // tags do not match, order does: it gets the first message
    if (first[0][0].item<float>() != 1.f) return std::string("wrong data");
    auto w = g->recv(second, 0, 7);
    try {
      await(w);
    } catch (const mpx::peer_error& e) {
      return std::string(e.what());
    }
    return std::string("a mismatch passed");
  });
  CHECK(run[0] == "ok");
  CHECK_THAT(run[1], Catch::Contains("receive #1 from member 0 (4 x Float) met a send of 3 x Float") &&
                         Catch::Contains("count and dtype are the same on both sides"));
}

TEST_CASE("Under NCCL's rules a group is used from one thread", "[torch][nccl_rules]")
{
  const auto run = two_ranks([](int rank, const c10::intrusive_ptr<c10d::Store>& store) {
    auto g = rules(store, "t/", rank);
    std::vector<at::Tensor> x{torch::ones({1})};
    if (rank == 1) {
      await(g->recv(x, 0, 0));
      return std::string("ok");
    }
    await(g->send(x, 1, 0));
    std::string said = "a second thread passed";
    std::thread([&] {
      try {
        g->send(x, 1, 0);
      } catch (const mpx::config_error& e) {
        said = e.what();
      }
    }).join();
    return said;
  });
  CHECK(run[1] == "ok");
  CHECK_THAT(run[0], Catch::Contains("send #1 to member 1 (1 x Float) was posted from a second thread") &&
                         Catch::Contains("send #0 to member 1") && Catch::Contains("used from one thread"));
}
