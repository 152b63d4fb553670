// SPDX-License-Identifier: Apache-2.0
// A downstream program on mpx::compiled: the runtime's non-template code comes from the installed library.
#include <mpx/mpx.hpp>

#include <iostream>

int main()
{
  const auto env = mpx::read_env();                                  // compiled in the library
  const auto faults = mpx::detail::parse_faults("sigkill:1:3");      // and so is this
  std::cout << "compiled consumer ok: rank " << env.rank << ", " << faults.size() << " fault\n";
}
