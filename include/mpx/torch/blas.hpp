// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file torch/blas.hpp
/// Which BLAS LibTorch runs on. Debian's LibTorch links `libblas.so.3`, which is the reference (netlib)
/// BLAS — about 40x slower than OpenBLAS — unless `libopenblas0-pthread` is installed and the
/// alternatives system points `libblas.so.3` at it. `mpx::check_blas()` turns a slow set-up into a
/// clear message instead of a mysteriously slow run.

#include <mpx/linkage.hpp>  // MPX_DECL, MPX_DEFINITIONS
#include <fstream>    // std::ifstream
#include <stdexcept>  // std::runtime_error
#include <string>     // std::string

namespace mpx
{

/// The path of the BLAS library mapped into this process (empty if none is mapped).
MPX_DECL std::string blas_library();

/// True when the mapped BLAS is the reference implementation (Debian's /usr/lib/<arch>/blas/).
MPX_DECL bool blas_is_reference();

/// Throws, naming the fix, when LibTorch runs on the reference BLAS.
MPX_DECL void check_blas();

}  // namespace mpx

#if MPX_DEFINITIONS
// ---- definitions (compiled once under MPX_SEPARATE_COMPILATION: linkage.hpp) ----

namespace mpx
{

MPX_DECL std::string blas_library()
{
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    const auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    std::string path = line.substr(slash);
    const auto base = path.substr(path.rfind('/') + 1);
    if (base.rfind("libblas.so", 0) == 0 || base.rfind("libopenblas", 0) == 0 || base.rfind("libmkl_rt", 0) == 0)
      return path;
  }
  return {};
}

MPX_DECL bool blas_is_reference()
{
  const std::string p = blas_library();
  return p.find("/blas/libblas.so") != std::string::npos;
}

MPX_DECL void check_blas()
{
  if (blas_is_reference())
    throw std::runtime_error("mpx: LibTorch is using the reference BLAS (" + blas_library() +
                             "), about 40x slower than OpenBLAS; install it with `apt-get install libopenblas0-pthread` "
                             "(or run scripts/install-deps.sh)");
}

}  // namespace mpx
#endif  // MPX_DEFINITIONS
