// SPDX-License-Identifier: Apache-2.0
// mpxrun: starts the ranks of an mpx program without Python (torchrun's variables, one process per rank).
//   mpxrun --nproc-per-node N [--max-restarts K] [--nnodes K --node-rank R --master-addr A --master-port P] prog args...
#include <mpx/runtime/launch/launch.hpp>

#include <CLI/CLI.hpp>

#include <iostream>

int main(int argc, char** argv)
{
  CLI::App app{"mpxrun: start the ranks of an mpx program (torchrun-compatible environment)"};
  mpx::LaunchOptions o;
  std::vector<std::string> command;
  long grace_ms = 5000, notice_ms = 3000;
  bool no_prefix = false;
  app.add_option("--nproc-per-node", o.nproc_per_node, "ranks on this node")->required()->check(CLI::PositiveNumber);
  app.add_option("--nnodes", o.nnodes, "nodes in the job")->check(CLI::PositiveNumber);
  app.add_option("--node-rank", o.node_rank, "this node's index")->check(CLI::NonNegativeNumber);
  app.add_option("--master-addr", o.master_addr, "address of rank 0's node");
  app.add_option("--master-port", o.master_port, "port of the rendezvous store (default: a free one, single node)");
  app.add_option("--max-restarts", o.max_restarts, "after a failure, start every rank again up to K times (single node)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--notice-ms", notice_ms, "after a failure, milliseconds the other ranks have to stop by themselves before SIGTERM")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--grace-ms", grace_ms, "milliseconds between SIGTERM and SIGKILL")->check(CLI::NonNegativeNumber);
  app.add_flag("--no-prefix", no_prefix, "do not prefix output lines with the rank");
  app.prefix_command();  // the first positional argument and everything after it: the program and its arguments
  CLI11_PARSE(app, argc, argv);
  command = app.remaining();
  if (command.empty()) {
    std::cerr << "mpxrun: no program given\n" << app.help();
    return 2;
  }
  o.grace = std::chrono::milliseconds(grace_ms);
  o.notice = std::chrono::milliseconds(notice_ms);
  o.prefix_output = !no_prefix;
  try {
    return mpx::launch(o, command);
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 2;
  }
}
