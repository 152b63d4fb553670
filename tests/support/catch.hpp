// SPDX-License-Identifier: Apache-2.0
#pragma once
// Catch2 v3 where installed, else v2 (Debian 12 ships v2).
#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_all.hpp>
#else
#include <catch2/catch.hpp>
#endif
