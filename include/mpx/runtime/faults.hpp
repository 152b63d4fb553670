// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file runtime/faults.hpp
/// Faults injected for real, for the tests of failure handling (restarts, checkpoints, the launcher's
/// report). `MPX_FAULT` lists faults, comma-separated, each `kind:rank:step[:attempt]`: global rank `rank`
/// meets it at step `step` (the steps done before it) of restart attempt `attempt` (TORCHELASTIC_RESTART_COUNT,
/// default 0, so the restarted job goes on). Kinds:
///
/// | kind | what happens, where |
/// |---|---|
/// | `sigkill`, `sigstop`, `sigsegv`, `abort` | the signal (abort: `std::abort`) at the start of the step |
/// | `exception` | an exception from the rank's first forward of the step: a stage failing, as any would |
/// | `save<k>` | SIGKILL in the save of that step (the steps done), after its k-th phase (state_io.hpp) |
///
/// The runtime calls `inject_fault` at those points; with MPX_FAULT unset it costs a call and one branch.

#include <mpx/runtime/errors.hpp>  // mpx::config_error
#include <mpx/runtime/linkage.hpp>  // MPX_DECL, MPX_DEFINITIONS

#include <signal.h>  // raise

#include <algorithm>  // std::min
#include <cstdio>     // std::fprintf
#include <cstdlib>    // std::getenv, std::abort
#include <stdexcept>  // std::runtime_error
#include <string>     // std::string
#include <vector>     // std::vector

namespace mpx
{

/// Where in a step a fault can be met.
enum class FaultPoint
{
  step,     ///< the start of a step
  forward,  ///< a stage's forward
  save,     ///< a phase of a save
};

/// One planned fault.
struct Fault
{
  std::string kind;  ///< sigkill, sigstop, sigsegv, abort, exception, save<k>
  int rank = 0;
  long step = 0;
  int attempt = 0;
};

namespace detail
{
/// Parses MPX_FAULT's value (see the file comment); a malformed entry is a `config_error` with the form.
MPX_DECL std::vector<Fault> parse_faults(const std::string& spec);

MPX_DECL const std::vector<Fault>& planned_faults();

MPX_DECL int fault_attempt();
}  // namespace detail

/// Meets the planned fault of (`rank`, `step`) at `at`, if there is one (see the file comment); `phase` is
/// the save's phase at FaultPoint::save.
MPX_DECL void inject_fault(FaultPoint at, int rank, long step, int phase = 0);

}  // namespace mpx

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: runtime/linkage.hpp) ----

namespace mpx::detail
{
MPX_DECL std::vector<Fault> parse_faults(const std::string& spec)
{
  std::vector<Fault> out;
  std::size_t i = 0;
  while (i < spec.size()) {
    const std::size_t end = std::min(spec.find(',', i), spec.size());
    const std::string item = spec.substr(i, end - i);
    i = end + 1;
    std::vector<std::string> part;
    for (std::size_t b = 0;;) {
      const std::size_t c = item.find(':', b);
      part.push_back(item.substr(b, c == std::string::npos ? std::string::npos : c - b));
      if (c == std::string::npos) break;
      b = c + 1;
    }
    const auto& k = part[0];
    const bool known = k == "sigkill" || k == "sigstop" || k == "sigsegv" || k == "abort" || k == "exception" ||
                       (k.size() > 4 && k.rfind("save", 0) == 0 && k.find_first_not_of("0123456789", 4) == std::string::npos);
    auto number = [&](const std::string& x) {
      if (x.empty() || x.find_first_not_of("0123456789") != std::string::npos) throw std::invalid_argument(x);
      return std::stol(x);
    };
    try {
      if (!known || part.size() < 3 || part.size() > 4) throw std::invalid_argument(item);
      out.push_back({k, int(number(part[1])), number(part[2]), part.size() == 4 ? int(number(part[3])) : 0});
    } catch (const std::exception&) {
      throw config_error("mpx: MPX_FAULT entry '" + item + "' is not kind:rank:step[:attempt] with kind one of sigkill, sigstop, sigsegv, "
                         "abort, exception, save<k> (e.g. MPX_FAULT=sigkill:1:3)");
    }
  }
  return out;
}

MPX_DECL const std::vector<Fault>& planned_faults()
{
  static const std::vector<Fault> faults = [] {
    const char* v = std::getenv("MPX_FAULT");
    return v ? parse_faults(v) : std::vector<Fault>{};
  }();
  return faults;
}

MPX_DECL int fault_attempt()
{
  const char* v = std::getenv("TORCHELASTIC_RESTART_COUNT");
  return v ? std::atoi(v) : 0;
}

}  // namespace mpx::detail

namespace mpx
{
MPX_DECL void inject_fault(FaultPoint at, int rank, long step, int phase)
{
  for (const Fault& f : detail::planned_faults()) {
    if (f.rank != rank || f.step != step || f.attempt != detail::fault_attempt()) continue;
    const bool save = f.kind.rfind("save", 0) == 0;
    if (save ? (at != FaultPoint::save || std::stoi(f.kind.substr(4)) != phase)
             : (at != (f.kind == "exception" ? FaultPoint::forward : FaultPoint::step)))
      continue;
    std::fprintf(stderr, "mpx: injecting fault %s at rank %d, step %ld (MPX_FAULT)\n", f.kind.c_str(), rank, step);
    std::fflush(stderr);
    if (f.kind == "exception") throw std::runtime_error("injected fault (MPX_FAULT=" + f.kind + ":" + std::to_string(rank) + ":" + std::to_string(step) + ")");
    if (f.kind == "abort") std::abort();
    ::raise(f.kind == "sigstop" ? SIGSTOP : f.kind == "sigsegv" ? SIGSEGV : SIGKILL);
  }
}

}  // namespace mpx
#endif  // MPX_DEFINITIONS
