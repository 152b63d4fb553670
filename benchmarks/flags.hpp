// SPDX-License-Identifier: Apache-2.0
#pragma once
// The benchmarks' own options: flags after their positional arguments, which mpx::relaunch_self passes on
// to every rank with the rest of the command line.
//   --trace=FILE   the last step's Chrome trace of every rank (mpx modes)
//   --verbose      every step's parts, on every rank
//   --no-overlap   data parallelism's bucket all-reduce after the last backward, not inside it
//   --bucket-mb=X  data parallelism's bucket size
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

namespace bench
{
struct Flags
{
  std::string trace;
  bool verbose = false, no_overlap = false;
  double bucket_mb = 0;  ///< 0: mpx's default
};

/// The flags of `argv` (an unknown one is an std::invalid_argument).
inline Flags flags_of(int argc, char** argv)
{
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (!a.starts_with("--")) continue;
    const auto eq = a.find('=');
    const std::string name = a.substr(0, eq), value = eq == std::string::npos ? "" : a.substr(eq + 1);
    if (name == "--trace") f.trace = value;
    else if (name == "--verbose") f.verbose = true;
    else if (name == "--no-overlap") f.no_overlap = true;
    else if (name == "--bucket-mb") f.bucket_mb = std::stod(value);
    else throw std::invalid_argument("unknown flag " + a + " (--trace=FILE, --verbose, --no-overlap, --bucket-mb=X)");
  }
  return f;
}

/// The positional arguments of `argv` (the flags left out), the program's name first.
inline std::vector<std::string> positional_of(int argc, char** argv)
{
  std::vector<std::string> out;
  for (int i = 0; i < argc; ++i)
    if (i == 0 || !std::string(argv[i]).starts_with("--")) out.emplace_back(argv[i]);
  return out;
}
}  // namespace bench
