#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Emission from Python against emission from C, on the same plan.

The plan and request are kvpull-bench's (tools/kvpull-bench.c):
llama-3.1-70b, producer TP 8 -> consumer TP 2 rank 0, 16-token blocks,
100000 blocks per region, flash_hnd, max_sge 16, READs up to 2^31 bytes;
one group of 10000 blocks (issue 22's figure), local ids 1000.., remote ids
5000.. (consecutive, as kvpull-bench's default).

  C       kvp_plan_emit() called through ctypes on prepared arguments
          (a prebuilt struct kvp_ids array and output arrays): the C
          function's time plus one ctypes call (~1 us).
  python  plan.emit([(local, remote)], out=buffers): the binding's whole
          path from numpy id arrays to numpy WR/SGE arrays (the Request
          built from the arrays, the call, the result views), into
          reusable EmitBuffers as a hot path keeps them.
  alloc   plan.emit([(local, remote)]): the same, allocating fresh arrays
          of emit_bound()'s size each call (reported, not the ratio).

The three run interleaved, --reps times each (default 41), after a warm-up;
the medians give emit_ratio = python / C.  With --kvpull-bench, the C time
kvpull-bench itself prints for the same request ("us per request", a mean
over its 2000 emissions; about 80 s) is shown too, and a second ratio
against it.  The last line is

  python: emit_ratio=Y c_ms=... py_ms=... alloc_ms=... alloc_ratio=...

Usage: PYTHONPATH=python python3 python/bench_emit.py [--reps N]
       [--blocks N] [--kvpull-bench]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import kvpull  # noqa: E402
from kvpull._lib import lib  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=41)
    ap.add_argument("--blocks", type=int, default=10000)
    ap.add_argument("--num-blocks", type=int, default=100000)
    ap.add_argument("--kvpull-bench", action="store_true",
                    help="also run build/tools/kvpull-bench (slow)")
    a = ap.parse_args()
    if a.reps < 1 or not 1 <= a.blocks <= a.num_blocks - 5000:
        ap.error("--reps at least 1, --blocks 1 to --num-blocks - 5000")

    kw = dict(block_tokens=16, num_blocks=a.num_blocks, kv_layout="flash_hnd")
    remote = kvpull.Layout.build("llama-3.1-70b", tp_size=8, engine_id=1,
                                 **kw)
    local = kvpull.Layout.build("llama-3.1-70b", tp_size=2, engine_id=2,
                                **kw)
    plan = kvpull.Plan.compile(local, remote, max_sge=16, max_len=0,
                               no_coalesce=False)
    lid = np.arange(1000, 1000 + a.blocks, dtype=np.uint32)
    rid = np.arange(5000, 5000 + a.blocks, dtype=np.uint32)

    # C: the bare call on prepared arguments.
    creq = kvpull.Request([(lid, rid)])
    maxw, maxs = plan.emit_bound(a.blocks)
    cwr = np.empty(maxw, kvpull.WR_DTYPE)
    csge = np.empty(maxs, kvpull.SGE_DTYPE)
    h, ids, wa, sa = plan.handle, creq.address, cwr.ctypes.data, \
        csge.ctypes.data
    emit_c = lib.kvp_plan_emit

    def run_c():
        t = time.perf_counter_ns()
        n = emit_c(h, ids, wa, maxw, sa, maxs, None)
        t = time.perf_counter_ns() - t
        assert n > 0, n
        return t, n

    buffers = plan.buffers(a.blocks)

    def run_py():
        t = time.perf_counter_ns()
        e = plan.emit([(lid, rid)], out=buffers)
        t = time.perf_counter_ns() - t
        return t, len(e.wrs)

    def run_alloc():
        t = time.perf_counter_ns()
        e = plan.emit([(lid, rid)])
        t = time.perf_counter_ns() - t
        return t, len(e.wrs)

    for f in (run_c, run_py, run_alloc):   # warm-up: pages, caches
        f()
        f()
    tc, tp, ta = [], [], []
    for _ in range(a.reps):
        t, nc = run_c()
        tc.append(t)
        t, npy = run_py()
        tp.append(t)
        t, na = run_alloc()
        ta.append(t)
    assert nc == npy == na, (nc, npy, na)
    e = plan.emit([(lid, rid)], out=buffers)
    assert np.array_equal(e.wrs, cwr[:nc]), "Python and C WRs differ"
    assert np.array_equal(e.sges, csge[:len(e.sges)]), "SGEs differ"

    c, py, al = (statistics.median(x) / 1e6 for x in (tc, tp, ta))
    info = plan.info
    print("plan: llama-3.1-70b TP 8 -> 2 rank 0, flash_hnd, max_sge %d, "
          "%d streams; request of %d blocks: %d WRs, %d SGEs, %d bytes"
          % (info.max_sge, info.nstreams, a.blocks, nc, len(e.sges),
             e.nbytes))
    print("median of %d interleaved runs: C %.3f ms (min %.3f), python "
          "%.3f ms (min %.3f), python allocating %.3f ms (min %.3f)"
          % (a.reps, c, min(tc) / 1e6, py, min(tp) / 1e6, al,
             min(ta) / 1e6))
    extra = ""
    if a.kvpull_bench:
        tool = os.path.join(os.path.dirname(os.path.dirname(
            os.path.abspath(__file__))), "build", "tools", "kvpull-bench")
        out = subprocess.run([tool, "--request", str(a.blocks),
                              "--num-blocks", str(a.num_blocks), "--iters",
                              "3"], check=True, capture_output=True,
                             text=True).stdout
        line = next(x for x in out.splitlines() if x.startswith("emit:"))
        bench_ms = float(re.search(r"([0-9.]+) us per request",
                                   line).group(1)) / 1e3
        print("kvpull-bench: " + line)
        extra = " bench_c_ms=%.3f bench_ratio=%.3f" % (bench_ms,
                                                       py / bench_ms)
    print("python: emit_ratio=%.3f c_ms=%.3f py_ms=%.3f alloc_ms=%.3f "
          "alloc_ratio=%.3f%s" % (py / c, c, py, al, al / c, extra))
    plan.close()
    local.close()
    remote.close()


if __name__ == "__main__":
    main()
