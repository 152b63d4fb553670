// SPDX-License-Identifier: Apache-2.0
#pragma once
/// The pipelines the runtime tests train, shared by the rank program (rank_main.cpp) and the test driver
/// (runtime.test.cpp), which trains the same model in one process as the reference.

#include "support/tiny_tp_transformer.hpp"

#include <mpx/mpx.hpp>

#include <stdexcept>  // std::invalid_argument
#include <string>     // std::string
#include <vector>     // std::vector
#include <string>
#include <vector>

namespace scenario
{
using mpx::CPU;
using mpx::Layers;
using mpx::Microbatches;
using mpx::Schedule;
using mpx::Stage;
using tiny::Model;

template <class Sched, int M = 4>
using P2 = mpx::Pipeline<Stage<Model, CPU<0>, Layers<0, 3>>, Stage<Model, CPU<1>, Layers<3, 6>>, Schedule<Sched>,
                         Microbatches<M>, mpx::Batch<tiny::Batch>>;
template <class Sched>
using P3 = mpx::Pipeline<Stage<Model, CPU<0>, Layers<0, 2>>, Stage<Model, CPU<1>, Layers<2, 4>>,
                         Stage<Model, CPU<2>, Layers<4, 6>>, Schedule<Sched>, Microbatches<4>, mpx::Batch<tiny::Batch>>;
template <class Sched>
using P4 = mpx::Pipeline<Stage<Model, CPU<0>, Layers<0, 1>>, Stage<Model, CPU<1>, Layers<1, 3>>,
                         Stage<Model, CPU<2>, Layers<3, 5>>, Stage<Model, CPU<3>, Layers<5, 6>>, Schedule<Sched>,
                         Microbatches<4>, mpx::Batch<tiny::Batch>>;
/// Both stages sharded over the replicas (ZeRO level L: optimizer state; 2: gradients too; 3: parameters too).
template <class Sched, int L, int M = 4>
using P2Sharded = mpx::Pipeline<Stage<Model, CPU<0>, Layers<0, 3>, mpx::Sharded<L>>, Stage<Model, CPU<1>, Layers<3, 6>, mpx::Sharded<L>>,
                                Schedule<Sched>, Microbatches<M>, mpx::Batch<tiny::Batch>>;
/// Activations and gradients cross the wire in bf16.
using P2Bf16 = mpx::Pipeline<Stage<Model, CPU<0>, Layers<0, 3>, mpx::WireCompression<mpx::BF16>>,
                             Stage<Model, CPU<1>, Layers<3, 6>>, Microbatches<4>, mpx::Batch<tiny::Batch>>;
/// Both stages checkpointed: the same gradients as the plain run.
template <class Sched>
using P2Ckpt = mpx::Pipeline<Stage<Model, CPU<0>, Layers<0, 3>, mpx::Checkpointed>,
                             Stage<Model, CPU<1>, Layers<3, 6>, mpx::Checkpointed>, Schedule<Sched>, Microbatches<4>,
                             mpx::Batch<tiny::Batch>>;
/// Both stages' forwards under bf16 autocast (fp32 master weights and gradients).
using P2Bf16Autocast = mpx::Pipeline<Stage<Model, CPU<0>, Layers<0, 3>, mpx::Precision<mpx::BF16>>,
                                     Stage<Model, CPU<1>, Layers<3, 6>, mpx::Precision<mpx::BF16>>, Microbatches<4>,
                                     mpx::Batch<tiny::Batch>>;
/// Every block checkpointed on its own (the tiny model marks its blocks with mpx::checkpoint_block).
template <class Sched>
using P2Blocks = mpx::Pipeline<Stage<Model, CPU<0>, Layers<0, 3>, mpx::CheckpointBlocks>,
                               Stage<Model, CPU<1>, Layers<3, 6>, mpx::CheckpointBlocks>, Schedule<Sched>, Microbatches<4>,
                               mpx::Batch<tiny::Batch>>;
/// Stage 0 Frozen: nothing before it trains, so it runs forward only (no backward, no gradient message);
/// `Extra` policies go on both stages (checkpointing).
template <class Sched, class... Extra>
using P2Frozen = mpx::Pipeline<Stage<Model, CPU<0>, Layers<0, 3>, mpx::Frozen, Extra...>, Stage<Model, CPU<1>, Layers<3, 6>, Extra...>,
                               Schedule<Sched>, Microbatches<4>, mpx::Batch<tiny::Batch>>;
/// The middle stage Frozen after a trainable one: it runs its backward (stage 0's gradient flows through it).
using P3FrozenMiddle = mpx::Pipeline<Stage<Model, CPU<0>, Layers<0, 2>>, Stage<Model, CPU<1>, Layers<2, 4>, mpx::Frozen>,
                                     Stage<Model, CPU<2>, Layers<4, 6>>, Microbatches<4>, mpx::Batch<tiny::Batch>>;
/// Interleaved: 2 slots x 2 chunks.
using P2x2 = mpx::Pipeline<Stage<Model, CPU<0>, Layers<0, 1>>, Stage<Model, CPU<1>, Layers<1, 3>>,
                           Stage<Model, CPU<0>, Layers<3, 4>>, Stage<Model, CPU<1>, Layers<4, 6>>,
                           Schedule<mpx::Interleaved1F1B>, Microbatches<4>, mpx::Batch<tiny::Batch>>;
/// Interleaved: 3 slots x 2 chunks.
using P3x2 = mpx::Pipeline<Stage<Model, CPU<0>, Layers<0, 1>>, Stage<Model, CPU<1>, Layers<1, 2>>,
                           Stage<Model, CPU<2>, Layers<2, 3>>, Stage<Model, CPU<0>, Layers<3, 4>>,
                           Stage<Model, CPU<1>, Layers<4, 5>>, Stage<Model, CPU<2>, Layers<5, 6>>,
                           Schedule<mpx::Interleaved1F1B>, Microbatches<6>, mpx::Batch<tiny::Batch>>;
/// GPU-tagged, for the no-CUDA start-up error.
using PGpu = mpx::Pipeline<Stage<Model, mpx::GPU<0>, Layers<0, 3>>, Stage<Model, mpx::GPU<1>, Layers<3, 6>>,
                           Microbatches<2>, mpx::Batch<tiny::Batch>>;

/// Tensor parallelism (the tiny model written with mpx::tp blocks, which in a group of one is tiny::Model):
/// one stage split 2 ways; 2 stages each split 2 ways (4 ranks; with 2 replicas, 8); stage 0 on one rank,
/// stage 1 on two (3 ranks); the same sequence-parallel. SGD with momentum (tp.test.cpp says why not AdamW).
using TpStage = mpx::Optimizer<mpx::SGD>;
using PTp2 = mpx::Pipeline<Stage<tiny_tp::Model, CPU<0>, Layers<0, 6>, mpx::TensorParallel<2>, TpStage>, Microbatches<2>,
                           mpx::Batch<tiny::Batch>>;
template <class M>
using PTp2Pp2 = mpx::Pipeline<Stage<M, CPU<0>, Layers<0, 3>, mpx::TensorParallel<2>, TpStage>,
                              Stage<M, CPU<1>, Layers<3, 6>, mpx::TensorParallel<2>, TpStage>, Microbatches<4>, mpx::Batch<tiny::Batch>>;
/// ZeRO-2 over tensor-parallel shards: each replica holds half of each tensor-parallel rank's gradients and state.
template <class M>
using PTp2Pp2Sharded = mpx::Pipeline<Stage<M, CPU<0>, Layers<0, 3>, mpx::TensorParallel<2>, TpStage, mpx::Sharded<2>>,
                                     Stage<M, CPU<1>, Layers<3, 6>, mpx::TensorParallel<2>, TpStage, mpx::Sharded<2>>,
                                     Microbatches<4>, mpx::Batch<tiny::Batch>>;
using PTp1Tp2 = mpx::Pipeline<Stage<tiny_tp::Model, CPU<0>, Layers<0, 3>, TpStage>,
                              Stage<tiny_tp::Model, CPU<1>, Layers<3, 6>, mpx::TensorParallel<2>, TpStage>, Microbatches<4>,
                              mpx::Batch<tiny::Batch>>;
using PTp2Tp1 = mpx::Pipeline<Stage<tiny_tp::Model, CPU<0>, Layers<0, 3>, mpx::TensorParallel<2>, TpStage>,
                              Stage<tiny_tp::Model, CPU<1>, Layers<3, 6>, TpStage>, Schedule<mpx::ZBH1>, Microbatches<4>,
                              mpx::Batch<tiny::Batch>>;

/// One parity scenario as the test driver sees it: ranks, replicas, micro-batches, each stage's layers.
struct Spec
{
  std::string name;
  int world = 2;
  int replicas = 1;
  int microbatches = 4;
  std::vector<std::pair<int, int>> ranges;
  bool bf16 = false;  ///< the stages run under bf16 autocast (the reference too)
  bool sgd = false;   ///< the stages train with SGD (else AdamW)
  std::vector<bool> frozen;  ///< per stage: Frozen (the reference does not train it either)
};

template <class P>
struct type
{
  using pipeline = P;
};

/// The one list of parity scenarios: calls `f(type<P>{}, replicas)` with scenario `name`'s pipeline type
/// and replica count; false if there is no such scenario.
template <class F>
bool visit(const std::string& name, F&& f)
{
  using mpx::GPipe, mpx::OneFOneB, mpx::ZBH1;
  auto is = [&](const char* n) { return name == n; };
  if (is("p2-gpipe")) return f(type<P2<GPipe>>{}, 1), true;
  if (is("p2-1f1b")) return f(type<P2<OneFOneB>>{}, 1), true;
  if (is("p2-zbh1")) return f(type<P2<ZBH1>>{}, 1), true;
  if (is("p3-gpipe")) return f(type<P3<GPipe>>{}, 1), true;
  if (is("p3-1f1b")) return f(type<P3<OneFOneB>>{}, 1), true;
  if (is("p3-zbh1")) return f(type<P3<ZBH1>>{}, 1), true;
  if (is("p4-gpipe")) return f(type<P4<GPipe>>{}, 1), true;
  if (is("p4-1f1b")) return f(type<P4<OneFOneB>>{}, 1), true;
  if (is("p4-zbh1")) return f(type<P4<ZBH1>>{}, 1), true;
  if (is("p2x2-interleaved")) return f(type<P2x2>{}, 1), true;
  if (is("p3x2-interleaved")) return f(type<P3x2>{}, 1), true;
  if (is("dp2-p2x2-interleaved")) return f(type<P2x2>{}, 2), true;
  if (is("dp2-p2-1f1b")) return f(type<P2<OneFOneB>>{}, 2), true;
  if (is("dp2-p2-zbh1")) return f(type<P2<ZBH1>>{}, 2), true;
  if (is("dp2-p2-1f1b-zero1")) return f(type<P2Sharded<OneFOneB, 1>>{}, 2), true;
  if (is("dp2-p2-1f1b-zero2")) return f(type<P2Sharded<OneFOneB, 2>>{}, 2), true;
  if (is("dp2-p2-zbh1-zero2")) return f(type<P2Sharded<ZBH1, 2>>{}, 2), true;
  if (is("dp2-p2-gpipe-zero1")) return f(type<P2Sharded<GPipe, 1>>{}, 2), true;
  if (is("dp2-p2-1f1b-zero3")) return f(type<P2Sharded<OneFOneB, 3>>{}, 2), true;
  if (is("dp2-p2-zbh1-zero3")) return f(type<P2Sharded<ZBH1, 3>>{}, 2), true;
  if (is("dp2-p2-gpipe-zero3")) return f(type<P2Sharded<GPipe, 3>>{}, 2), true;
  if (is("dp2-tp2-pp2-zero2")) return f(type<PTp2Pp2Sharded<tiny_tp::Model>>{}, 2), true;
  if (is("dp2-tp2-pp2-sp-zero2")) return f(type<PTp2Pp2Sharded<tiny_tp::SeqModel>>{}, 2), true;
  if (is("dp2-p2-1f1b-zero2-m2")) return f(type<P2Sharded<OneFOneB, 2, 2>>{}, 2), true;  // one pipeline type at 2 and 4 replicas:
  if (is("dp4-p2-1f1b-zero2-m2")) return f(type<P2Sharded<OneFOneB, 2, 2>>{}, 4), true;  // their checkpoints move between them
  if (is("p2-frozen-gpipe")) return f(type<P2Frozen<GPipe>>{}, 1), true;
  if (is("p2-frozen-1f1b")) return f(type<P2Frozen<OneFOneB>>{}, 1), true;
  if (is("p2-frozen-zbh1")) return f(type<P2Frozen<ZBH1>>{}, 1), true;
  if (is("p2-frozen-1f1b-checkpointed")) return f(type<P2Frozen<OneFOneB, mpx::Checkpointed>>{}, 1), true;
  if (is("dp2-p2-frozen-1f1b")) return f(type<P2Frozen<OneFOneB>>{}, 2), true;
  if (is("dp2-p2-frozen-zbh1")) return f(type<P2Frozen<ZBH1>>{}, 2), true;
  if (is("p3-frozen-middle-1f1b")) return f(type<P3FrozenMiddle>{}, 1), true;
  if (is("p2-bf16-wire")) return f(type<P2Bf16>{}, 1), true;
  if (is("p2-1f1b-checkpointed")) return f(type<P2Ckpt<OneFOneB>>{}, 1), true;
  if (is("p2-zbh1-checkpointed")) return f(type<P2Ckpt<ZBH1>>{}, 1), true;
  if (is("p2-1f1b-block-checkpointed")) return f(type<P2Blocks<OneFOneB>>{}, 1), true;
  if (is("p2-zbh1-block-checkpointed")) return f(type<P2Blocks<ZBH1>>{}, 1), true;
  if (is("p2-bf16-autocast")) return f(type<P2Bf16Autocast>{}, 1), true;
  if (is("tp2")) return f(type<PTp2>{}, 1), true;
  if (is("tp2-pp2")) return f(type<PTp2Pp2<tiny_tp::Model>>{}, 1), true;
  if (is("dp2-tp2-pp2")) return f(type<PTp2Pp2<tiny_tp::Model>>{}, 2), true;
  if (is("tp2-pp2-sp")) return f(type<PTp2Pp2<tiny_tp::SeqModel>>{}, 1), true;
  if (is("dp2-tp2-pp2-sp")) return f(type<PTp2Pp2<tiny_tp::SeqModel>>{}, 2), true;
  if (is("tp1-tp2")) return f(type<PTp1Tp2>{}, 1), true;
  if (is("tp2-tp1-zbh1")) return f(type<PTp2Tp1>{}, 1), true;
  return false;
}

/// Scenario `name`'s spec, read off its pipeline type.
inline Spec spec(const std::string& name)
{
  Spec s;
  s.name = name;
  const bool found = visit(name, [&](auto t, int replicas) {
    using P = typename decltype(t)::pipeline;
    s.replicas = replicas;
    s.world = P::ranks_per_replica * replicas;
    s.microbatches = P::num_microbatches;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (s.ranges.emplace_back(P::template stage<int(I)>::layer_begin, P::template stage<int(I)>::layer_end), ...);
      (s.frozen.push_back(P::template stage<int(I)>::frozen), ...);
    }(std::make_index_sequence<std::size_t(P::num_stages)>{});
    s.bf16 = std::is_same_v<typename P::template stage<0>::precision, mpx::BF16>;
    s.sgd = std::is_same_v<typename P::template stage<0>::optimizer, mpx::SGD>;
  });
  if (!found) throw std::invalid_argument("no parity scenario named " + name);
  return s;
}

/// Batch rows per replica per step: 12 (divisible by 4 and 6); 6 at 4 replicas, so that 2 and 4 replicas
/// train on the same 24 rows (a checkpoint moves from one to the other: runtime.test.cpp "[zero]").
inline constexpr int rows_per_replica(int replicas) { return replicas == 4 ? 6 : 12; }
inline constexpr int steps = 5;
inline const tiny::Config config{};

/// What a test asks of its ranks beyond the scenario: the rank program's flags (rank_main.cpp), and what the
/// one-process reference computes with (runtime.test.cpp).
struct Knobs
{
  int split_trials = 0;          ///< --split-trials=N: ZB-H1 settles its split after N trials of each way (0: the default)
  bool overlap = false;          ///< --overlap: no clipping and no skip: the optimizers step during the end-of-step all-reduce
  bool unmarked_blocks = false;  ///< --unmarked-blocks: the tiny model marks no blocks (ZB-H1 then runs a whole backward in I)
  bool free_between = false;     ///< --free-between: ZeRO-3 frees a stage's parameters while another stage computes
  int sharding = 0;              ///< --sharding=L: TrainOptions::sharding (ZeRO level L of every trainable stage)
  std::string trace;             ///< --trace=FILE: the last step's Chrome trace of every rank, written by rank 0
  int inf_stage = -1;            ///< --inject-inf=STAGE,STEP: an inf in that stage's gradient at that step
  long inf_step = -1;
  int exit_rank = -1;            ///< --exit-before-sum=RANK,STEP: that rank's process ends after its walk of that step
  long exit_step = -1;
  long resume_at = -1;           ///< --resume-at=STEP: save there, then go on from the files in new trainers
  long resume_from_step = -1;    ///< --resume-from=STEP,DIR: at that step, new trainers go on from DIR (another run's --resume-at files)
  std::string resume_from;
  /// --die-by=exit|kill|stop: how the rank told to die (kill-rank, kill-step) does it: `_exit(3)`, SIGKILL, or
  /// SIGSTOP (alive and silent; a child of its SIGKILLs it 18 s later)
  std::string die_by = "exit";

  /// As the rank program takes them.
  std::vector<std::string> flags() const
  {
    std::vector<std::string> f;
    if (split_trials > 0) f.push_back("--split-trials=" + std::to_string(split_trials));
    if (overlap) f.push_back("--overlap");
    if (unmarked_blocks) f.push_back("--unmarked-blocks");
    if (free_between) f.push_back("--free-between");
    if (sharding > 0) f.push_back("--sharding=" + std::to_string(sharding));
    if (!trace.empty()) f.push_back("--trace=" + trace);
    if (inf_stage >= 0) f.push_back("--inject-inf=" + std::to_string(inf_stage) + "," + std::to_string(inf_step));
    if (exit_rank >= 0) f.push_back("--exit-before-sum=" + std::to_string(exit_rank) + "," + std::to_string(exit_step));
    if (resume_at >= 0) f.push_back("--resume-at=" + std::to_string(resume_at));
    if (resume_from_step >= 0) f.push_back("--resume-from=" + std::to_string(resume_from_step) + "," + resume_from);
    if (die_by != "exit") f.push_back("--die-by=" + die_by);
    return f;
  }

  /// Reads `flags()`'s form; an unknown flag is an std::invalid_argument.
  static Knobs parse(const std::vector<std::string>& flags)
  {
    Knobs k;
    auto pair = [](const std::string& v, auto& a, auto& b) {
      const auto comma = v.find(',');
      if (comma == std::string::npos) throw std::invalid_argument("expected A,B, got " + v);
      a = std::stoi(v.substr(0, comma)), b = std::stol(v.substr(comma + 1));
    };
    for (const auto& f : flags) {
      const auto eq = f.find('=');
      const std::string name = f.substr(0, eq), value = eq == std::string::npos ? "" : f.substr(eq + 1);
      if (name == "--split-trials") k.split_trials = std::stoi(value);
      else if (name == "--overlap") k.overlap = true;
      else if (name == "--unmarked-blocks") k.unmarked_blocks = true;
      else if (name == "--free-between") k.free_between = true;
      else if (name == "--sharding") k.sharding = std::stoi(value);
      else if (name == "--trace") k.trace = value;
      else if (name == "--inject-inf") pair(value, k.inf_stage, k.inf_step);
      else if (name == "--exit-before-sum") pair(value, k.exit_rank, k.exit_step);
      else if (name == "--resume-at") k.resume_at = std::stol(value);
      else if (name == "--resume-from" && value.find(',') != std::string::npos)
        k.resume_from_step = std::stol(value.substr(0, value.find(','))), k.resume_from = value.substr(value.find(',') + 1);
      else if (name == "--die-by" && (value == "exit" || value == "kill" || value == "stop")) k.die_by = value;
      else throw std::invalid_argument("unknown flag " + f);
    }
    return k;
  }
};

inline mpx::TrainOptions options(const Knobs& k = {})
{
  mpx::TrainOptions o;
  o.lr = mpx::WarmupCosine{1e-2, 2, 5, 0.1};
  o.weight_decay = 0.01;
  o.clip_norm = 1.0;
  o.momentum = 0.9;  // SGD stages
  if (k.split_trials > 0) o.split_trials = k.split_trials;  // ZB-H1: settle the split sooner
  o.free_between_computes = k.free_between;
  o.sharding = k.sharding;
  if (k.overlap) {  // no clipping and no skip: the optimizers step during the end-of-step all-reduce
    o.clip_norm = 0;
    o.skip_nonfinite = false;
  }
  return o;
}

/// The tiny model's config under `k` (marking its blocks or not).
inline tiny::Config config_of(const Knobs& k)
{
  tiny::Config c = config;
  c.mark_blocks = !k.unmarked_blocks;
  return c;
}
}  // namespace scenario
