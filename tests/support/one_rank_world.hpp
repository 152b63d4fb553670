// SPDX-License-Identifier: Apache-2.0
#pragma once
// A world of one rank over loopback on a free port, for the runtime's single-process tests (collectives:
// NCCL on CUDA, Gloo on CPU). GPU stages run on CPU where there is no GPU.
#include <mpx/mpx.hpp>

namespace test
{
template <class P>
mpx::World one_rank_world(std::chrono::milliseconds timeout = std::chrono::seconds(60), std::string store_secret = {})
{
  static int port = mpx::detail::free_port();
  mpx::Env env;
  env.master_port = port++;  // each world its own store
  env.store_secret = std::move(store_secret);
  mpx::WorldOptions wo;
  wo.timeout = timeout;
  wo.allow_cpu = true;
  return mpx::make_world<P>(env, wo);
}
}  // namespace test
