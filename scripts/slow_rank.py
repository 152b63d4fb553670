#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Holds one rank of a running job to a fraction of a CPU core: a device slower than the others, for real.

  scripts/slow_rank.py LAUNCHER_PID RANK FRACTION [--after FILE:LINES] [--method signals|cgroup]

The rank is the launcher's child process whose environment has RANK=<RANK> (mpx::launch, moondream_train's own
launcher, torchrun's agent: its children); a rank started again after a restart is found again and held too.
Methods:
  signals  SIGSTOP / SIGCONT in 20 ms periods, running FRACTION of each (any user, any machine)
  cgroup   the CPU controller's quota: FRACTION of a core per 100 ms period (cgroup v1 cpu, or v2 cpu.max;
           needs a writable /sys/fs/cgroup) — what a container's or a batch system's CPU limit does
--after FILE:LINES  holds the rank only once FILE has LINES lines (e.g. a metrics file: after that many steps).
Runs until the launcher ends; prints what it did.
"""
import argparse, os, signal, sys, time


def children(pid):
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return out


def rank_of(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            for item in f.read().split(b"\0"):
                if item.startswith(b"RANK="):
                    return int(item[5:])
    except (OSError, ValueError):
        pass
    return None


def find_rank(launcher, rank):
    seen, todo = set(), [launcher]
    while todo:  # the launcher's descendants (torchrun: its agent's children)
        p = todo.pop()
        for c in children(p):
            if c in seen:
                continue
            seen.add(c)
            if rank_of(c) == rank:
                return c
            todo.append(c)
    return None


def lines(path):
    try:
        with open(path) as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


class Cgroup:
    def __init__(self, fraction):
        self.path = None
        name = f"mpx_slow_{os.getpid()}"
        v1, v2 = "/sys/fs/cgroup/cpu", "/sys/fs/cgroup"
        if os.path.isdir(v1) and os.access(v1, os.W_OK):
            self.path = os.path.join(v1, name)
            os.makedirs(self.path, exist_ok=True)
            with open(os.path.join(self.path, "cpu.cfs_period_us"), "w") as f:
                f.write("100000")
            with open(os.path.join(self.path, "cpu.cfs_quota_us"), "w") as f:
                f.write(str(int(100000 * fraction)))
        elif os.path.exists(os.path.join(v2, "cgroup.controllers")) and os.access(v2, os.W_OK):
            self.path = os.path.join(v2, name)
            os.makedirs(self.path, exist_ok=True)
            with open(os.path.join(self.path, "cpu.max"), "w") as f:
                f.write(f"{int(100000 * fraction)} 100000")
        else:
            sys.exit("slow_rank.py: no writable CPU cgroup here (/sys/fs/cgroup/cpu or a cgroup v2 root); use --method signals")
        self.moved = set()

    def hold(self, pid):
        if pid not in self.moved:
            with open(os.path.join(self.path, "cgroup.procs"), "w") as f:
                f.write(str(pid))
            self.moved.add(pid)
            print(f"slow_rank.py: pid {pid} in {self.path} ({open(os.path.join(self.path, 'cgroup.procs')).read().split()})", flush=True)

    def close(self):
        try:
            os.rmdir(self.path)  # possible once its processes have ended
        except OSError:
            pass


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("launcher", type=int)
    ap.add_argument("rank", type=int)
    ap.add_argument("fraction", type=float)
    ap.add_argument("--after", default="")
    ap.add_argument("--method", choices=["signals", "cgroup"], default="signals")
    a = ap.parse_args()
    if not 0 < a.fraction < 1:
        sys.exit("slow_rank.py: FRACTION is the share of a core the rank keeps, between 0 and 1 (e.g. 0.5)")
    after_file, after_lines = (a.after.rsplit(":", 1) + ["0"])[:2] if a.after else ("", "0")
    group = Cgroup(a.fraction) if a.method == "cgroup" else None
    period, held, pids = 0.02, 0.0, set()
    try:
        while os.path.exists(f"/proc/{a.launcher}"):
            if after_file and lines(after_file) < int(after_lines):
                time.sleep(0.02)
                continue
            pid = find_rank(a.launcher, a.rank)
            if pid is None:
                time.sleep(0.02)
                continue
            if pid not in pids:
                pids.add(pid)
                print(f"slow_rank.py: holding rank {a.rank} (pid {pid}) to {a.fraction:g} of a core by {a.method}", flush=True)
            if group:
                try:
                    group.hold(pid)
                except OSError:
                    pass  # it ended meanwhile
                time.sleep(0.05)
                continue
            try:
                os.kill(pid, signal.SIGSTOP)
                time.sleep(period * (1 - a.fraction))
                os.kill(pid, signal.SIGCONT)
                held += period * (1 - a.fraction)
            except ProcessLookupError:
                continue
            time.sleep(period * a.fraction)
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        if group:
            group.close()
    print(f"slow_rank.py: the launcher ended; held {len(pids)} process(es)" + (f", stopped {held:.1f} s" if not group else ""), flush=True)


if __name__ == "__main__":
    main()
