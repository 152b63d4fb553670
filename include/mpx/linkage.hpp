// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file linkage.hpp
/// Where the runtime's non-template code is compiled. By default mpx is header-only: those definitions are
/// `inline` and every TU that uses them compiles them again. Define `MPX_SEPARATE_COMPILATION` (the CMake
/// target `mpx::compiled` does, for its users too) and a header shows only their declarations; they are
/// compiled once, in `src/mpx.cpp`, into the library that target links. What must know the pipeline's
/// type is a thin typed front — `Trainer<P, Batch>`, `Executor<P, Batch>`, `StageSet<P>`, `print<P>` — over
/// a body that does not (`detail::TrainerCore`, `detail::ExecutorCore`, `StageSetBase`, `print_pipeline`),
/// so that a program's own TU compiles little of the runtime. Do not mix the two modes in
/// one program: link `mpx::compiled` into every target of it, or into none.
///
/// In a header: declarations carry `MPX_DECL`; the definitions follow in an `#if MPX_DEFINITIONS` block.

#if defined(MPX_SEPARATE_COMPILATION)
#define MPX_DECL
#if defined(MPX_COMPILING_LIBRARY)
#define MPX_DEFINITIONS 1
#else
#define MPX_DEFINITIONS 0
#endif
#else
#define MPX_DECL inline
#define MPX_DEFINITIONS 1
#endif
