// SPDX-License-Identifier: Apache-2.0
// Catch2 v2's main, compiled once (v3 links Catch2::Catch2WithMain instead).
#define CATCH_CONFIG_MAIN
#include "catch.hpp"
