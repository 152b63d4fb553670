// SPDX-License-Identifier: Apache-2.0
// Compile-time benchmark TU: a pipeline of P stages (one per slot) with M micro-batches under schedule
// SCHED, whose proof is a static_assert. Compiled by run.sh with -DMPX_BENCH_P=.. -DMPX_BENCH_M=.. -DMPX_BENCH_SCHED=..; without them it
// is the baseline (the same includes, no pipeline). With -DMPX_BENCH_GPU the stages sit on GPUs and the
// proof under NCCL's order (Pipeline::nccl_order_proof) runs as well.
#include <mpx/core.hpp>

#ifdef MPX_BENCH_P
struct Tensor {};
template <> struct mpx::tensor_traits<Tensor> { static constexpr bool is_tensor = true; };
struct Block { Tensor forward(Tensor); };

#ifdef MPX_BENCH_GPU  // stages on GPUs: the NCCL-order proof runs too
template <int I> using Device = mpx::GPU<I>;
#else
template <int I> using Device = mpx::CPU<I>;
#endif
template <std::size_t... I>
auto make(std::index_sequence<I...>) -> mpx::Pipeline<mpx::Stage<Block, Device<int(I)>>..., mpx::Schedule<mpx::MPX_BENCH_SCHED>, mpx::Microbatches<MPX_BENCH_M>>;
using Pipe = decltype(make(std::make_index_sequence<MPX_BENCH_P>{}));
static_assert(Pipe::proved_at_compile_time, "raise MPX_COMPILE_TIME_PROOF_STEPS for this benchmark");
static_assert(mpx::proof_v<Pipe>.ok());
#ifdef MPX_BENCH_GPU
static_assert(Pipe::on_gpus && Pipe::nccl_order_proof.ok() && Pipe::nccl_order_proof.steps > 0);
#endif
int bubble_permille = int(mpx::proof_v<Pipe>.bubble() * 1000);
#endif
