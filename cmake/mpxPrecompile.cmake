# mpx_precompile_headers(<target> [CORE])
# Precompiles for <target> what each of its TUs that use mpx parses first: <torch/torch.h> and
# <mpx/mpx.hpp> (with CORE, only <mpx/core.hpp>: a target on mpx::core alone). LibTorch's headers are most
# of a TU's compile time (benchmarks/results/compile_time_*: downstream TUs), and a precompiled header is
# shared by the target's TUs. For several targets, precompile once and reuse:
#   mpx_precompile_headers(first)
#   target_precompile_headers(second REUSE_FROM first)
function(mpx_precompile_headers target)
  cmake_parse_arguments(arg "CORE" "" "" ${ARGN})
  if(arg_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "mpx_precompile_headers(${target} ${ARGN}): unknown argument ${arg_UNPARSED_ARGUMENTS}; write mpx_precompile_headers(<target> [CORE])")
  endif()
  if(arg_CORE)
    target_precompile_headers(${target} PRIVATE <mpx/core.hpp>)
  else()
    if(NOT TARGET mpx::mpx)
      message(FATAL_ERROR "mpx_precompile_headers(${target}): mpx::mpx (LibTorch) is not available; pass CORE for a target on mpx::core")
    endif()
    target_precompile_headers(${target} PRIVATE <torch/torch.h> <mpx/mpx.hpp>)
  endif()
endfunction()
