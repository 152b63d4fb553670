// SPDX-License-Identifier: Apache-2.0
// Two translation units include all of mpx's core and link together: no ODR violations.
#include <mpx/core.hpp>
int mpx_odr_tu2();
int main() { return mpx_odr_tu2() == int(mpx::Op::W) ? 0 : 1; }
