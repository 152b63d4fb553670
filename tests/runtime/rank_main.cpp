// SPDX-License-Identifier: Apache-2.0
// One rank of the runtime tests: trains a scenario's pipeline for a few steps, prints every step's loss
// ("loss <step> <value>") and saves the parameters of its stages to <out>/stage<s>.pt.
//   mpx.tests.runtime_rank <scenario> <out-dir> [kill-rank kill-step] [flags]
// The flags: what a test asks beyond the scenario (scenario::Knobs, scenarios.hpp).
#include "scenarios.hpp"
#include "support/geometric_toy.hpp"

#include <malloc.h>  // mallinfo2
#include <signal.h>  // raise, kill, SIGKILL, SIGSTOP
#include <unistd.h>  // fork, getpid, getppid, sleep, _exit

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <iostream>
#include <optional>

namespace
{
scenario::Knobs knobs;  // the command line's flags

/// The tiny model, but its layer ranges declare a (B, T·D) boundary while handing on (B, T, D): the
/// receiving stage must stop at the wire, naming the stage, the field and both shapes.
struct MisdeclaredImpl : tiny::ModelImpl
{
  using hidden_type = mpx::Ranked<2>;
  using tiny::ModelImpl::ModelImpl;
};
TORCH_MODULE(Misdeclared);
using PMisdeclared = mpx::Pipeline<mpx::Stage<Misdeclared, mpx::CPU<0>, mpx::Layers<0, 3>>,
                                   mpx::Stage<Misdeclared, mpx::CPU<1>, mpx::Layers<3, 6>>, mpx::Microbatches<2>,
                                   mpx::Batch<tiny::Batch>>;

/// What a stage keeps between its forward and its backward, measured: stage 0 is wide (each micro-batch's
/// forward saves about 2 MiB of activations for its backward) and records the bytes in use at the start
/// of each of its forwards; rank 0 prints "held <forward> <bytes>" under GPipe (every forward before
/// any backward). Trained, the bytes grow by the saved activations with each forward; Frozen (forward
/// only) they must not.
namespace memory
{
/// Bytes in use: malloc's (small tensors and everything else) and the large tensors' blocks of mpx's
/// host cache (torch/host_memory.hpp, which make_world installs).
inline std::int64_t allocated_bytes()
{
  const struct mallinfo2 mi = ::mallinfo2();
  return std::int64_t(mi.uordblks + mi.hblkhd + mpx::host_memory_stats().live_bytes);
}
inline std::vector<std::int64_t> held;

struct WideImpl : torch::nn::Module
{
  using input_type = torch::Tensor;   // token ids (B, T)
  using output_type = torch::Tensor;  // (B, T, 256)
  WideImpl()
      : emb(register_module("emb", torch::nn::Embedding(scenario::config.vocab, 256))),
        up(register_module("up", torch::nn::Linear(256, 4096))), down(register_module("down", torch::nn::Linear(4096, 256)))
  {
  }
  torch::Tensor forward(const torch::Tensor& tokens)
  {
    held.push_back(allocated_bytes());
    return down(torch::gelu(up(emb(tokens))));
  }
  torch::nn::Embedding emb;
  torch::nn::Linear up, down;
};
TORCH_MODULE(Wide);
struct HeadImpl : torch::nn::Module
{
  using input_type = torch::Tensor;
  using output_type = torch::Tensor;  // logits (B, T, V)
  HeadImpl() : head(register_module("head", torch::nn::Linear(256, scenario::config.vocab))) {}
  torch::Tensor forward(const torch::Tensor& x) { return head(x); }
  torch::nn::Linear head;
};
TORCH_MODULE(Head);
template <class... Policies>
using P = mpx::Pipeline<mpx::Stage<Wide, mpx::CPU<0>, Policies...>, mpx::Stage<Head, mpx::CPU<1>>, mpx::Schedule<mpx::GPipe>,
                        mpx::Microbatches<8>, mpx::Batch<tiny::Batch>>;

template <class Pipe>
int run()
{
  const auto env = mpx::read_env();
  auto world = mpx::make_world<Pipe>(env);
  auto make = [](auto stage) {
    if constexpr (decltype(stage)::value == 0) return Wide();
    else return Head();
  };
  mpx::Trainer<Pipe, tiny::Batch> trainer(world, make, [](const tiny::Batch& b) { return b.tokens; }, tiny::loss, scenario::options());
  for (long step = 0; step < 2; ++step) {  // the second step's numbers: the allocator has its pools by then
    held.clear();
    auto batch = tiny::make_batch(scenario::config, 64, step, 0, 1);  // 8 rows x 8 tokens per micro-batch
    trainer.step(mpx::slice_microbatches(batch, Pipe::num_microbatches));
  }
  if (env.rank == 0)
    for (std::size_t k = 0; k < held.size(); ++k) std::printf("held %zu %lld\n", k, (long long)held[k]);
  std::fflush(stdout);
  return 0;
}
}  // namespace memory

/// The geometric toy cut after layer `cut` (slot 0 holds [0, cut), slot 1 [cut, 6)), one intra-op thread
/// per rank: prints "step_seconds <s>" for each of 12 steps (the first two warm up).
int toy_cut(int cut)
{
  torch::set_num_threads(1);
  const auto env = mpx::read_env();
  auto world = mpx::make_world<toy::Pipe>(env);
  auto make = [cut](auto stage) {
    torch::manual_seed(7 + decltype(stage)::value);
    return decltype(stage)::value == 0 ? toy::Geometric(0, cut) : toy::Geometric(cut, toy::num_layers);
  };
  auto options = scenario::options();
  options.clip_norm = 0;
  mpx::Trainer<toy::Pipe, toy::Batch> trainer(world, make, [](const toy::Batch& b) { return b.x; }, toy::loss, options);
  for (long step = 0; step < 12; ++step) {
    const auto st = trainer.step(mpx::slice_microbatches(toy::make_batch(4 * toy::rows_per_microbatch, step), 4));
    if (env.rank == 0 && step >= 2) std::printf("step_seconds %.6f\n", st.seconds);
  }
  std::fflush(stdout);
  return 0;
}

/// Ends this process as `--die-by` says (scenarios.hpp): _exit(3), SIGKILL, or SIGSTOP with a child that
/// SIGKILLs it 18 s later (a silent peer: its process alive, its sockets open, nothing sent; the survivors' waits
/// end at 10 s).
[[noreturn]] void die(const std::string& how)
{
  if (how == "kill") ::raise(SIGKILL);
  if (how == "stop") {
    const pid_t me = ::getpid();
    if (::fork() == 0) {
      ::sleep(18);
      if (::getppid() == me) ::kill(me, SIGKILL);
      ::_exit(0);
    }
    ::raise(SIGSTOP);
  }
  ::_exit(3);
}

template <class P>
int train(const std::string& out, int kill_rank, int kill_step, std::chrono::milliseconds timeout = std::chrono::seconds(30),
          mpx::RunSettings settings = {})
{
  const auto env = mpx::read_env();
  mpx::WorldOptions wo;
  wo.timeout = timeout;
  wo.settings = std::move(settings);
  auto world = mpx::make_world<P>(env, wo);
  const tiny::Config config = scenario::config_of(knobs);
  auto make = [&config](auto stage) {
    using S = typename P::template stage<decltype(stage)::value>;
    torch::manual_seed(100 + decltype(stage)::value);
    return typename S::module(config, S::layer_begin, S::layer_end == mpx::to_end ? config.layers : S::layer_end);
  };
  auto options = scenario::options(knobs);
  options.trace = !knobs.trace.empty();
  if (knobs.inf_stage >= 0) {  // an inf in that stage's gradient at that step
    const int at_stage = knobs.inf_stage;
    const long at_step = knobs.inf_step;
    options.scaler.enabled = true;
    options.scaler.init = 1024;
    options.scaler.interval = 2;  // grow quickly, to see it
    options.before_optimizer = [=](int stage, long step, const std::vector<at::Tensor>& params) {
      if (stage == at_stage && step == at_step) params.front().mutable_grad().view(-1)[0] = std::numeric_limits<float>::infinity();
    };
  }
  if (knobs.exit_rank >= 0) {  // that rank's process ends after its walk of that step
    const int at_rank = knobs.exit_rank;
    const long at_step = knobs.exit_step;
    options.before_optimizer = [=](int, long step, const std::vector<at::Tensor>&) {
      if (env.rank == at_rank && step == at_step) {
        std::cerr << "rank " << env.rank << " dies before the end-of-step sum (test)\n";
        std::fflush(nullptr);
        ::_exit(3);
      }
    };
  }
  // tiny_tp::loss: vocabulary-split logits under tensor parallelism, torch's cross-entropy otherwise
  using Trainer = mpx::Trainer<P, tiny::Batch>;
  auto input = [](const tiny::Batch& b) { return b.tokens; };
  std::optional<Trainer> trainer_slot;
  trainer_slot.emplace(world, make, input, tiny_tp::loss, options);
  for (long step = 0; step < scenario::steps; ++step) {
    if (step == knobs.resume_at) {  // save at this step, then go on from the files in a new trainer
      trainer_slot->save(out + "/state");
      trainer_slot.reset();
      trainer_slot.emplace(world, make, input, tiny_tp::loss, options);  // fresh weights (the seeds of step 0) ...
      trainer_slot->load(out + "/state");                                // ... replaced by the saved ones
      if (env.rank == 0) std::printf("resumed at step %ld\n", trainer_slot->steps_done());
    }
    if (step == knobs.resume_from_step) {  // go on from another run's files, in new trainers (fresh weights and optimizers)
      trainer_slot.reset();
      trainer_slot.emplace(world, make, input, tiny_tp::loss, options);
      trainer_slot->load(knobs.resume_from);
      if (env.rank == 0) std::printf("resumed at step %ld from %s\n", trainer_slot->steps_done(), knobs.resume_from.c_str());
    }
    auto& trainer = *trainer_slot;
    if (env.rank == kill_rank && step == kill_step) {
      std::cerr << "rank " << env.rank << " dies now (test, by " << knobs.die_by << ")\n";
      std::fflush(nullptr);
      die(knobs.die_by);
    }
    auto batch = tiny::make_batch(scenario::config, scenario::rows_per_replica(world.replicas), step, world.replica, world.replicas);
    const auto st = trainer.step(mpx::slice_microbatches(batch, P::num_microbatches));
    if (env.rank == 0) std::printf("loss %ld %.17g\nnorm %ld %.17g\n", step, st.loss, step, st.grad_norm);
    if (env.rank == 0 && options.scaler.enabled) std::printf("scale %ld %g skipped %d\n", step, st.loss_scale, int(st.skipped));
  }
  auto& trainer = *trainer_slot;
  for (int s = 0; s < P::num_stages; ++s)  // what the parameters hold between steps: under ZeRO-3 nothing
    if (trainer.holds(s) && env.rank == 0) {
      std::int64_t kept = 0;
      for (auto& p : trainer.parameters(s)) kept += p.numel();
      std::printf("rank 0 stage %d keeps %lld parameter elements between steps\n", s, (long long)kept);
    }
  trainer.gather_parameters();  // ZeRO-3: whole again on every replica, to be read
  for (int s = 0; s < P::num_stages; ++s)  // what each rank's optimizer steps: under ZeRO its shard
    if (trainer.holds(s) && world.replicas > 1) {
      std::int64_t all = 0;
      for (auto& p : trainer.parameters(s)) all += p.requires_grad() ? p.numel() : 0;
      std::printf("rank %d stage %d steps %lld of %lld\n", env.rank, s, (long long)trainer.stepped_elements(s), (long long)all);
    }
  if (world.replica == 0)
    for (int s = 0; s < P::num_stages; ++s)
      if (trainer.holds(s)) {
        auto whole = trainer.whole_parameters(s);  // a collective over the slot's tensor-parallel ranks
        if (world.tp_rank == 0) torch::save(whole, out + "/stage" + std::to_string(s) + ".pt");
        if (world.tp_size > 1 && env.rank == 0) {  // what this rank holds of the stage: the split is real
          std::int64_t mine = 0, all = 0;
          for (auto& p : trainer.parameters(s)) mine += p.numel();
          for (auto& p : whole) all += p.numel();
          std::printf("stage %d holds %lld of %lld parameters\n", s, (long long)mine, (long long)all);
        }
      }
  if (env.rank == 0) std::printf("bubble expected %.4f measured %.4f\n", trainer.expected_bubble(), trainer.measured_bubble());
  if (trainer.split_decision().decided()) {  // ZB-H1's measured split: the same choice on every rank?
    const double split = trainer.split_decision().split() ? 1 : 0;
    std::vector<at::Tensor> v{torch::tensor({split, -split}, torch::kDouble)};
    world.world->allreduce(v, {c10d::ReduceOp::MAX})->wait();
    const bool agreed = v[0][0].item<double>() == -v[0][1].item<double>();
    if (env.rank == 0) std::printf("split decided %d agreed %d\n", int(split), int(agreed));
  }
  std::fflush(stdout);
  if (!knobs.trace.empty()) trainer.write_trace(knobs.trace);
  return 0;
}

/// The wire protocol alone (wire.hpp), rank 0 sending to rank 1 on one channel: a sequence of messages
/// whose layout repeats, changes shape, changes wire dtype, drops a field, carries an empty tensor and
/// comes back. Sent twice: as header + payloads, all added ahead to a Receiver (its thread posts header,
/// payloads, next header, as on NCCL); then packed
/// (ChannelSize at both ends, the messages grouped into steps, each step's receives posted at its start),
/// where a payload that fits the capacity of earlier steps must travel in the header's message and a larger
/// one separately. Rank 1 checks every value and which messages were packed, and prints "wire ok".
int wire()
{
  const auto env = mpx::read_env();
  auto world = mpx::make_world<scenario::P2<mpx::OneFOneB>>(env);
  struct Msg
  {
    std::vector<std::int64_t> a;  // shape of field a (empty vector: absent)
    std::vector<std::int64_t> b;
    at::ScalarType wire;
  };
  const std::vector<Msg> msgs = {
      {{4, 3}, {5}, at::kFloat},
      {{4, 3}, {5}, at::kFloat},
      {{6, 3}, {5}, at::kFloat},     // a changes shape
      {{6, 3}, {}, at::kFloat},      // b absent (a field without gradient)
      {{6, 3}, {5}, at::kBFloat16},  // bf16 on the wire, b back
      {{6, 3}, {5}, at::kBFloat16},
      {{0, 3}, {5}, at::kBFloat16},  // a empty: header only
      {{6, 3}, {5}, at::kBFloat16},
      {{20, 3}, {5}, at::kFloat},    // larger than any before
      {{4, 3}, {5}, at::kFloat},
  };
  const std::vector<std::size_t> step_starts = {0, 2, 4, 8, 9};  // packed run: messages [start, next start) form a step
  auto value = [](const std::vector<std::int64_t>& shape, int k, int field) {  // integers: exact in bf16
    if (shape.empty()) return at::Tensor();
    return (torch::arange(c10::multiply_integers(shape), torch::kFloat) + 10 * k + 100 * field).reshape(shape);
  };
  auto payload_bytes = [](const Msg& m) {  // as packed: each field at an aligned offset
    std::int64_t n = 0;
    for (const auto* shape : {&m.a, &m.b})
      if (!shape->empty()) n += mpx::detail::aligned(c10::multiply_integers(*shape) * std::int64_t(c10::elementSize(m.wire)));
    return n;
  };
  const auto timeout = std::chrono::milliseconds(20000);
  const int tag_channel[2] = {0, 2};  // the unpacked run on channel 0, the packed one on channel 2
  for (int packing = 0; packing < 2; ++packing) {
    mpx::ChannelSize size;
    mpx::ChannelSize* sz = packing ? &size : nullptr;
    std::size_t next_step = 0;  // index into step_starts
    auto at_step_start = [&](std::size_t k) {
      if (!packing || next_step >= step_starts.size() || step_starts[next_step] != k) return false;
      ++next_step;
      size.next_step();
      return true;
    };
    if (env.rank == 0) {
      std::vector<mpx::PendingSend> sends;
      for (std::size_t k = 0; k < msgs.size(); ++k) {
        at_step_start(k);
        sends.push_back(mpx::send_tensors(world.pp, 1, tag_channel[packing], 1, int(k), false,
                                          {value(msgs[k].a, int(k), 0), value(msgs[k].b, int(k), 1)}, msgs[k].wire,
                                          "message " + std::to_string(k), torch::kCPU, sz));
      }
      for (auto& s : sends)
        for (auto& w : s.works) w->wait(timeout);
      continue;
    }
    std::optional<mpx::Receiver> receiver;
    if (!packing) receiver.emplace(world.pp, timeout);
    std::vector<std::unique_ptr<mpx::PendingRecv>> recvs(msgs.size());
    auto post = [&](std::size_t k) {
      recvs[k] = std::make_unique<mpx::PendingRecv>();
      const mpx::Expect e{1, int(k), false, {"a", "b"}, "Pair"};
      if (receiver) {  // the receiver posts each header once the payloads before it are posted
        mpx::prepare_recv(*recvs[k], 0, tag_channel[packing], e, "message " + std::to_string(k));
        receiver->add(recvs[k].get());
      } else {
        mpx::post_recv(*recvs[k], world.pp, 0, tag_channel[packing], e, "message " + std::to_string(k), torch::kCPU, sz);
      }
    };
    if (!packing)
      for (std::size_t k = 0; k < msgs.size(); ++k) post(k);  // all ahead
    std::int64_t largest_before = 0, largest = 0;  // the largest payload of earlier steps, and so far
    for (std::size_t k = 0; k < msgs.size(); ++k) {
      if (at_step_start(k)) {  // a step posts all its receives at its start, as a schedule's step does
        largest_before = largest;
        const std::size_t end = next_step < step_starts.size() ? step_starts[next_step] : msgs.size();
        for (std::size_t j = k; j < end; ++j) post(j);
      }
      if (receiver) receiver->await(*recvs[k]);
      auto got = mpx::finish_recv(world.pp, *recvs[k], timeout);
      const bool packed = recvs[k]->works.empty() && payload_bytes(msgs[k]) > 0;  // no payload receive was posted
      const bool want_packed = packing && payload_bytes(msgs[k]) <= largest_before && payload_bytes(msgs[k]) > 0;
      largest = std::max(largest, payload_bytes(msgs[k]));
      if (packed != want_packed) {
        std::cerr << (packing ? "packed run" : "unpacked run") << ", message " << k << ": " << (packed ? "packed" : "not packed")
                  << ", expected the opposite\n";
        return 1;
      }
      for (int field = 0; field < 2; ++field) {
        const auto want = value(field ? msgs[k].b : msgs[k].a, int(k), field);
        if (want.defined() != got[std::size_t(field)].defined() ||
            (want.defined() && (got[std::size_t(field)].scalar_type() != at::kFloat || !torch::equal(want, got[std::size_t(field)])))) {
          std::cerr << (packing ? "packed run" : "unpacked run") << ", message " << k << " field " << field << ": wrong value\n";
          return 1;
        }
      }
      if (packed) std::printf("message %zu packed\n", k);
    }
  }
  if (env.rank == 1) std::printf("wire ok\n");
  return 0;
}

int run(const std::string& name, const std::string& out, int kill_rank, int kill_step)
{
  using namespace scenario;
  int status = 2;
  if (visit(name, [&](auto t, int) { status = train<typename decltype(t)::pipeline>(out, kill_rank, kill_step); })) return status;
  // start-up errors
  if (name == "mismatch") {  // rank 1 is built with another micro-batch count
    if (mpx::read_env().rank == 1) return train<P2<mpx::OneFOneB, 2>>(out, -1, -1);
    return train<P2<mpx::OneFOneB, 4>>(out, -1, -1);
  }
  if (name == "tp-mismatch") {  // rank 1 is built without tensor parallelism: other groups, so compared before they are built
    if (mpx::read_env().rank == 1) return train<P2<mpx::OneFOneB>>(out, -1, -1);
    return train<PTp2>(out, -1, -1);
  }
  if (name == "gpu") return train<PGpu>(out, -1, -1);
  if (name == "settings-mismatch") {  // rank 1 is started with another seed
    const std::string seed = mpx::read_env().rank == 1 ? "2" : "1";
    return train<P2<mpx::OneFOneB>>(out, -1, -1, std::chrono::seconds(30), {{"config", "tiny"}, {"seed", seed}});
  }
  if (name == "wire") return wire();
  if (name.starts_with("toy-cut-")) return toy_cut(std::atoi(name.c_str() + 8));
  if (name == "memory-trained") return memory::run<memory::P<>>();
  if (name == "memory-frozen") return memory::run<memory::P<mpx::Frozen>>();
  if (name == "misdeclared") return train<PMisdeclared>(out, -1, -1, std::chrono::seconds(10));
  if (name == "kill") return train<P3<mpx::OneFOneB>>(out, kill_rank, kill_step, std::chrono::seconds(10));
  if (name == "kill-tp") return train<PTp2Pp2<tiny_tp::Model>>(out, kill_rank, kill_step, std::chrono::seconds(10));
  std::cerr << "unknown scenario " << name << "\n";
  return 2;
}
}  // namespace

int main(int argc, char** argv)
{
  std::vector<std::string> positional, flags;
  for (int i = 1; i < argc; ++i) (std::string(argv[i]).starts_with("--") ? flags : positional).emplace_back(argv[i]);
  if (positional.size() < 2) {
    std::cerr << "usage: " << argv[0] << " <scenario> <out-dir> [kill-rank kill-step] [flags: scenario::Knobs]\n";
    return 2;
  }
  try {
    knobs = scenario::Knobs::parse(flags);
    const bool kill = positional.size() >= 4;
    return run(positional[0], positional[1], kill ? std::stoi(positional[2]) : -1, kill ? std::stoi(positional[3]) : -1);
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
}
