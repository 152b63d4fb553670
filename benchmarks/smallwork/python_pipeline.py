# SPDX-License-Identifier: Apache-2.0
"""The Python contender of the small-work benchmark: the same model and step as smallwork_bench.cpp
(2 x 4 layers of Linear 512x512 + GELU, AdamW, micro-batches of 8 rows), pipelined over two ranks with
plain torch.distributed (Gloo), written the way a careful user would: every receive posted ahead with
irecv at the start of the step, sends with isend, loss / m per micro-batch, sends waited at the end.
Orders: gpipe (every forward, then every backward) and 1f1b. One intra-op thread per rank.

    mpxrun --nproc-per-node 2 python3 python_pipeline.py gpipe|1f1b M [steps]

Rank 0 prints "result py-<order> <median seconds per step> m <M>" (the slower rank's median).
"""
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

WIDTH, LAYERS_PER_STAGE, ROWS = 512, 4, 8


class Stack(torch.nn.Module):
    def __init__(self, layers):
        super().__init__()
        self.fcs = torch.nn.ModuleList(torch.nn.Linear(WIDTH, WIDTH) for _ in range(layers))

    def forward(self, x):
        for fc in self.fcs:
            x = torch.nn.functional.gelu(fc(x))
        return x


def main():
    order, m = sys.argv[1], int(sys.argv[2])
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    assert world == 2, "python_pipeline.py runs on exactly 2 ranks"
    dist.init_process_group("gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
                            rank=rank, world_size=2)
    torch.manual_seed(rank)
    stage = Stack(LAYERS_PER_STAGE)
    opt = torch.optim.AdamW(stage.parameters(), lr=1e-4)
    peer = 1 - rank
    data = [torch.randn(ROWS * m, WIDTH, generator=torch.Generator().manual_seed(s)) for s in range(steps + 2)]
    times = []
    for s in range(steps + 2):
        t0 = time.perf_counter()
        xs = data[s].chunk(m)
        bufs = [torch.empty(ROWS, WIDTH) for _ in range(m)]
        recvs = [dist.irecv(b, src=peer) for b in bufs]  # activations on rank 1, gradients on rank 0
        outs, ins, sends = [None] * m, [None] * m, []

        def forward(i):
            if rank == 0:
                outs[i] = stage(xs[i])
                sends.append(dist.isend(outs[i].detach(), dst=peer))
            else:
                recvs[i].wait()
                ins[i] = bufs[i].requires_grad_()
                outs[i] = stage(ins[i]).pow(2).mean() / m

        def backward(i):
            if rank == 0:
                recvs[i].wait()
                outs[i].backward(bufs[i])
            else:
                outs[i].backward()
                sends.append(dist.isend(ins[i].grad, dst=peer))
            outs[i] = None

        if order == "gpipe":
            for i in range(m):
                forward(i)
            for i in range(m):
                backward(i)
        else:  # 1f1b: rank 0 runs one forward ahead
            warmup = 1 if rank == 0 else 0
            for i in range(warmup):
                forward(i)
            for i in range(m - warmup):
                forward(warmup + i)
                backward(i)
            for i in range(m - warmup, m):
                backward(i)
        for w in sends:
            w.wait()
        opt.step()
        opt.zero_grad()
        if s >= 2:
            times.append(time.perf_counter() - t0)
    t = torch.tensor([statistics.median(times)], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    if rank == 0:
        print(f"result py-{order} {t.item():.6f} m {m}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
