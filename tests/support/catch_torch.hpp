// SPDX-License-Identifier: Apache-2.0
#pragma once
// Catch for tests that use LibTorch. LibTorch's logging header defines a glog-style CHECK (fatal on
// failure) that would replace Catch's if it came second: include it first, drop its CHECK, then Catch.
#include <c10/util/Logging.h>
#undef CHECK
#include "catch.hpp"
