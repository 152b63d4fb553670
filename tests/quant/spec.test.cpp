// SPDX-License-Identifier: Apache-2.0
// Tests for mpx/quant/spec.hpp: each format's name parses and prints back; anything else is a named error.
#include "support/catch_torch.hpp"

#include <mpx/quant/spec.hpp>

namespace q = mpx::quant;

TEST_CASE("quant::parse reads each format and its group, name_of prints it back, anything else is a named error", "[quant]")
{
  for (const char* text : {"fp32", "bf16", "int8", "int8/g128", "int4", "int4/g32", "int4/g128", "int4/channel", "nf4", "nf4/g32"})
    CHECK(q::name_of(q::parse(text)) == text);
  CHECK(q::parse("int4").group == 64);
  CHECK(q::parse("int8").group == 0);
  CHECK(q::parse("nf4").double_quant);
  for (const char* bad : {"int3", "int4/g", "int4/g7", "int4/64", "bf16/g32", "nf4/g0", "int4/g64x", ""})
    CHECK_THROWS_WITH(q::parse(bad), Catch::Contains("mpx::quant"));
}
