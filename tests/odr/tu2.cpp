// SPDX-License-Identifier: Apache-2.0
#include <mpx/core.hpp>
int mpx_odr_tu2() { return int(mpx::Op::W); }
