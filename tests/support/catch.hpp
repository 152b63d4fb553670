// SPDX-License-Identifier: Apache-2.0
#pragma once
// Catch2 v3 where installed, else v2 (Debian 12 ships v2). MPX_CATCH2_V2 forces v2 (scripts/gpu_check.sh
// builds without CMake, with v2's single header, where a v3 may be installed too).
#if __has_include(<catch2/catch_all.hpp>) && !defined(MPX_CATCH2_V2)
#include <catch2/catch_all.hpp>
#else
#include <catch2/catch.hpp>
#endif
