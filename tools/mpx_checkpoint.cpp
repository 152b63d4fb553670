// SPDX-License-Identifier: Apache-2.0
// mpx_checkpoint: look into a checkpoint, and export its whole weights as one file.
//
//   mpx_checkpoint info   CKPT                   # step, layout, files and tensors (verified)
//   mpx_checkpoint export CKPT OUT.safetensors   # whole weights by global name, tensor-parallel shards joined
//
// CKPT is a checkpoint root (its `latest` is used) or one step-NNNNNNNN directory. The export is a plain
// safetensors file: LibTorch (`mpx::load_safetensors`), Python's `safetensors` or a few lines of Python
// (docs/08_checkpoints_and_restarts.md) read it.
#include <mpx/runtime/checkpoint.hpp>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <iostream>
#include <string>

int main(int argc, char** argv)
{
  CLI::App app{"mpx_checkpoint: inspect an mpx checkpoint, or export its whole weights as one safetensors file"};
  app.require_subcommand(1);
  std::string path, out;
  bool no_checksums = false;
  auto* info = app.add_subcommand("info", "step, layout, files and tensors of a checkpoint (every file verified)");
  info->add_option("checkpoint", path, "a checkpoint root or one step directory")->required();
  auto* exp = app.add_subcommand("export", "the whole weights, by global name, as one safetensors file");
  exp->add_option("checkpoint", path, "a checkpoint root or one step directory")->required();
  exp->add_option("out", out, "the file to write (.safetensors)")->required();
  for (auto* c : {info, exp}) c->add_flag("--no-checksums", no_checksums, "skip the XXH3-64 check of every file (sizes are still checked)");
  CLI11_PARSE(app, argc, argv);
  mpx::CheckpointOptions co;
  co.checksums = !no_checksums;
  try {
    const auto m = mpx::detail::read_manifest(mpx::detail::locate_checkpoint(path));
    if (*info) {
      std::cout << fmt::format("{}: step {}, saved by {} ranks (pipeline fingerprint {}), checksums {}\n", m.dir, m.step, m.world_size, m.fingerprint,
                               m.checksums ? "xxh3-64" : "none");
      for (auto& [file, sum] : m.files) {
        mpx::detail::verified(m, file, co);
        std::cout << fmt::format("  {:<40} {:>12} bytes  {:>4} tensors{}{}\n", file, sum.bytes, sum.tensors.size(),
                                 sum.global_names ? ", global names" : "", sum.cuts.empty() ? "" : fmt::format(", {} cut", sum.cuts.size()));
      }
      co.checksums = false;  // every file was verified just above
      const auto whole = mpx::consolidated_weights(m, co);
      long long n = 0;
      for (auto& [k, t] : whole) n += t.numel();
      std::cout << fmt::format("  whole weights: {} tensors, {} values\n", whole.size(), n);
    } else {
      mpx::export_checkpoint_weights(path, out, co);
      std::cout << fmt::format("mpx_checkpoint: wrote {} (the whole weights of {}, step {})\n", out, m.dir, m.step);
    }
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 2;
  }
  return 0;
}
