// SPDX-License-Identifier: Apache-2.0
// The runtime's non-template code, compiled once: the library of the CMake target mpx::compiled
// (linkage.hpp). Built with MPX_SEPARATE_COMPILATION, like every TU that links it.
#if !defined(MPX_SEPARATE_COMPILATION)
#error "src/mpx.cpp is mpx::compiled's library: build it with MPX_SEPARATE_COMPILATION (the target sets it)"
#endif
#define MPX_COMPILING_LIBRARY 1
#include <mpx/mpx.hpp>
