#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A pull from Python against the same pull from C: same agent, same plan.

Issue 22's goal: a pull of 128 block ids from Python costs at most 2 us
more than the same pull from C.  In one process, on one consumer agent
opened by the binding, three loops time each call alone and run
interleaved, in rounds:

  C       kvp_agent_pull(agent, req_id, ids) called from C
          (kvpb_time_pulls() of python/bench_pull.c, built by the Makefile
          into build/tools/libkvpull_pullbench.so): clock_gettime
          (CLOCK_MONOTONIC) before and after each call, ids prepared once
          as a struct kvp_ids over the numpy arrays.
  plain   agent.pull(req_id, [(local, remote)]): the binding's documented
          call, numpy int32 id arrays (zero copy), the list built per call
          as a connector does per request; time.perf_counter_ns() (the same
          clock) before and after.
  req     agent.pull(req_id, request), a kvpull.Request prepared once over
          the same arrays (the fastest documented path: its ids are refilled
          in place between requests of the same length).

Before each call, untimed, the producer expects the request; after it,
untimed, both agents are polled until the consumer's DONE and the
producer's RELEASED (kvpb_before() and kvpb_after(), C, the same for the
three loops, so every call starts from the same state).  Each request has
a fresh id.  Rounds rotate the loops' order; a first round is a warm-up;
the cyclic garbage collector is off while timing (as timeit does).  The
medians give pull_extra_us = median(plain) - median(C), and
pull_extra_req_us = median(req) - median(C).

  --vm    a producer and a consumer agent in this process on the RDMA device
          at $KVP_ADDR0 (scripts/rxe-vm.sh sets it: soft-RoCE in the VM),
          connected with agent.connect() while a thread polls the producer;
          the consumer's memory is checked against the producer's at the
          end.  On soft-RoCE the READs run inside ibv_post_send(), so each
          call's time includes its transfer: the layout is small
          (llama-3.1-8b cut to 1 layer of 1 KV head of dim 8, 4-token blocks:
          64 B per block per region) and the ids contiguous (2 READs, 16 KiB
          a pull).  Under TCG every CPU cost is inflated many times.
  --host  no RDMA device: the consumer agent is opened on the stand-in
          library of the host tests (tests/python/fakelib.py) whose
          kvp_agent_pull is kvpb_stub_pull(), C code that does what the real
          call does with the ids before posting (lists checked against
          max_ids, every id against the blocks, the local lists copied) and
          nothing else; the C loop calls the same stub.  The difference is
          the binding's cost alone, on the host's CPU.

The last line is

  python-host: pull_extra_us=X pull_extra_req_us=... c_pull_us=...
      py_pull_us=... py_req_us=... calls=N (stand-in library, no RDMA)

or python-vm: ... (soft-RoCE under TCG).  scripts/rdma-bench.sh --python
runs both.

Usage: PYTHONPATH=python python3 python/bench_pull.py --host|--vm
       [--rounds N] [--calls N] [--blocks N] [--ids contiguous|random]
       [--helper PATH]
"""
import argparse
import ctypes
import errno
import gc
import os
import statistics
import sys
import threading
import time
from ctypes import c_int, c_uint32, c_uint64, c_void_p

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402

import kvpull  # noqa: E402
from kvpull import _lib  # noqa: E402

PROD_ENGINE = 0x70726f64
CONS_ENGINE = 0x636f6e73


class Ctx(ctypes.Structure):
    """struct kvpb_ctx of bench_pull.c."""
    _fields_ = [("cons", c_void_p), ("prod", c_void_p), ("pull", c_void_p),
                ("poll", c_void_p), ("expect", c_void_p),
                ("cons_engine", c_uint64), ("timeout_ns", c_uint64)]


def load_helper(path):
    h = ctypes.CDLL(path)
    h.kvpb_before.argtypes = [c_void_p, c_uint64]
    h.kvpb_before.restype = c_int
    h.kvpb_after.argtypes = [c_void_p, c_uint64]
    h.kvpb_after.restype = c_int
    h.kvpb_time_pulls.argtypes = [c_void_p, c_uint64, c_void_p, c_uint32,
                                  c_void_p]
    h.kvpb_time_pulls.restype = c_int
    h.kvpb_stub_config.argtypes = [c_uint32, c_uint32, c_uint32]
    h.kvpb_stub_config.restype = None
    return h


def addr(fn):
    return ctypes.cast(fn, c_void_p).value


def layout(args, engine_id):
    m = kvpull.Model.preset("llama-3.1-8b").replace(
        layers=1, kv_heads=1, head_dim=args.head_dim)
    return kvpull.Layout.build(m, tp_size=1, engine_id=engine_id,
                               block_tokens=args.block_tokens,
                               num_blocks=args.num_blocks,
                               kv_layout="flash_hnd")


def block_ids(args):
    n = args.blocks
    if args.ids == "contiguous":
        local = np.arange(100, 100 + n, dtype=np.int32)
        remote = np.arange(600, 600 + n, dtype=np.int32)
    else:
        rng = np.random.default_rng(22)
        local = rng.permutation(args.num_blocks)[:n].astype(np.int32)
        remote = rng.permutation(args.num_blocks)[:n].astype(np.int32)
    return local, remote


def check(err, what):
    if err:
        raise kvpull.Error(err, what)


def measure(args, helper, ctx, agent, local, remote):
    """The three loops, interleaved; returns {name: [ns, ...]} and the
    number of pulls made."""
    ctxp = ctypes.addressof(ctx)
    before, after = helper.kvpb_before, helper.kvpb_after
    pc = time.perf_counter_ns
    req = kvpull.Request([(local, remote)])
    creq = req.address              # the struct kvp_ids C's loop gets
    ns = np.zeros(args.calls, np.uint64)
    next_id = [1]
    n = args.calls

    def run_c(out):
        rid = next_id[0]
        check(helper.kvpb_time_pulls(ctxp, rid, creq, n, ns.ctypes.data),
              "kvpb_time_pulls")
        next_id[0] += n
        out += ns.tolist()

    def run_plain(out):
        rid = next_id[0]
        for i in range(n):
            check(before(ctxp, rid + i), "kvpb_before")
            t = pc()
            agent.pull(rid + i, [(local, remote)])
            t = pc() - t
            out.append(t)
            check(after(ctxp, rid + i), "kvpb_after")
        next_id[0] += n

    def run_req(out):
        rid = next_id[0]
        for i in range(n):
            check(before(ctxp, rid + i), "kvpb_before")
            t = pc()
            agent.pull(rid + i, req)
            t = pc() - t
            out.append(t)
            check(after(ctxp, rid + i), "kvpb_after")
        next_id[0] += n

    loops = [("c", run_c), ("plain", run_plain), ("req", run_req)]
    res = {k: [] for k, _ in loops}
    for _k, f in loops:             # warm-up round, not counted
        f([])
    enabled = gc.isenabled()
    gc.disable()
    try:
        for r in range(args.rounds):
            k = r % len(loops)
            for name, f in loops[k:] + loops[:k]:
                f(res[name])
    finally:
        if enabled:
            gc.enable()
    return res, next_id[0] - 1


def timer_ns():
    pc = time.perf_counter_ns
    t = []
    for _ in range(2001):
        a = pc()
        t.append(pc() - a)
    return statistics.median(t)


def report(tag, res, total, note):
    med = {k: statistics.median(v) / 1e3 for k, v in res.items()}
    lo = {k: min(v) / 1e3 for k, v in res.items()}
    print("median of %d calls each (min): C %.2f us (%.2f), python "
          "%.2f us (%.2f), python with a prepared Request %.2f us (%.2f); "
          "%d pulls in all" % (len(res["c"]), med["c"], lo["c"],
                               med["plain"], lo["plain"], med["req"],
                               lo["req"], total))
    print("%s: pull_extra_us=%.2f pull_extra_req_us=%.2f c_pull_us=%.2f "
          "py_pull_us=%.2f py_req_us=%.2f calls=%d (%s)"
          % (tag, med["plain"] - med["c"], med["req"] - med["c"], med["c"],
             med["plain"], med["req"], len(res["c"]), note))


def host(args, helper):
    sys.path.insert(0, os.path.join(REPO, "tests", "python"))
    import fakelib
    from kvpull import agent as A
    fake = fakelib.FakeLib()
    stub = helper.kvpb_stub_pull
    proto = next(p for p in _lib._PROTOS if p[0] == "kvp_agent_pull")
    stub.restype, stub.argtypes = proto[1], list(proto[2:])
    fake.kvp_agent_pull = stub
    helper.kvpb_stub_poll.restype = c_int
    A.lib = fake
    lay = layout(args, CONS_ENGINE)
    agent = kvpull.Agent(lay, "consumer", max_ids=max(256, args.blocks))
    helper.kvpb_stub_config(agent.ngroups, max(256, args.blocks),
                            args.num_blocks)
    ctx = Ctx(cons=agent.handle, prod=None, pull=addr(stub),
              poll=addr(helper.kvpb_stub_poll), expect=None,
              cons_engine=CONS_ENGINE, timeout_ns=10 ** 9)
    local, remote = block_ids(args)
    print("host: consumer agent on the stand-in library "
          "(tests/python/fakelib.py), kvp_agent_pull = kvpb_stub_pull (C: "
          "ids checked and copied, nothing posted); %d ids per pull, "
          "%d rounds of %d calls per loop; perf_counter_ns pair %.0f ns"
          % (args.blocks, args.rounds, args.calls, timer_ns()))
    res, total = measure(args, helper, ctx, agent, local, remote)
    seen = [c for c in fake.calls if c[0] == "pull"]
    assert not seen, "the stub was bypassed"
    agent.close()
    lay.close()
    report("python-host", res, total, "stand-in library, no RDMA")


def vm(args, helper):
    ip = os.environ.get("KVP_ADDR0")
    if not ip:
        print("bench_pull.py --vm: KVP_ADDR0 is not set (run under "
              "scripts/rxe-vm.sh)", file=sys.stderr)
        return 77
    lib = _lib.lib
    play, clay = layout(args, PROD_ENGINE), layout(args, CONS_ENGINE)
    k = np.arange(play.regions[0], dtype=np.uint64)
    pmem = [((k * 7 + (k >> 12) + r * 31) & 0xFF).astype(np.uint8)
            for r in range(len(play.regions))]
    cmem = [np.zeros(s, np.uint8) for s in clay.regions]
    prod = kvpull.Agent(play, "producer", addr=ip, max_peers=8)
    prod.register_all(pmem)
    prod.listen(ip, args.port)
    cons = kvpull.Agent(clay, "consumer", addr=ip, max_peers=8,
                        max_ids=max(256, args.blocks))
    cons.register_all(cmem)
    stop = threading.Event()

    def serve():                        # the handshake runs in its poll
        while not stop.is_set():
            prod.poll(16)
            time.sleep(0.0005)

    t = threading.Thread(target=serve)
    t.start()
    try:
        cons.connect([(ip, args.port)], timeout_ms=60000)
    finally:
        stop.set()
        t.join()
    local, remote = block_ids(args)
    plan = cons.plan()
    em = plan.emit([(local, remote)])
    print("vm: producer and consumer agents on %s (%s), llama-3.1-8b cut to "
          "1 layer of 1 KV head of dim %d, %d-token blocks; a pull of %d %s "
          "ids: %d READs, %d bytes; %d rounds of %d calls per loop; "
          "perf_counter_ns pair %.0f ns"
          % (os.environ.get("KVP_DEV0", "?"), ip, args.head_dim,
             args.block_tokens, args.blocks, args.ids, len(em.wrs), em.nbytes,
             args.rounds, args.calls, timer_ns()))
    nbytes = em.nbytes
    plan.close()
    ctx = Ctx(cons=cons.handle, prod=prod.handle,
              pull=addr(lib.kvp_agent_pull), poll=addr(lib.kvp_agent_poll),
              expect=addr(lib.kvp_agent_expect), cons_engine=CONS_ENGINE,
              timeout_ns=30 * 10 ** 9)
    res, total = measure(args, helper, ctx, cons, local, remote)
    st = cons.stats()
    assert (st.pulls, st.done, st.failed) == (total, total, 0), st
    assert st.read_bytes == total * nbytes, (st.read_bytes, total, nbytes)
    bad = 0
    for v in clay.views:
        for lb, rb in zip(local.tolist(), remote.tolist()):
            lo, ro = v.offset + lb * v.stride, v.offset + rb * v.stride
            bad += int(np.count_nonzero(
                cmem[v.region][lo:lo + v.stride] !=
                pmem[v.region][ro:ro + v.stride]))
    assert bad == 0, "%d wrong bytes" % bad
    print("checked: %d pulls DONE, %d bytes read, the consumer's blocks "
          "equal the producer's" % (st.done, st.read_bytes))
    cons.close()
    prod.close()
    report("python-vm", res, total, "soft-RoCE under TCG")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--host", action="store_true")
    mode.add_argument("--vm", action="store_true")
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--calls", type=int, default=25,
                    help="calls per loop per round")
    ap.add_argument("--blocks", type=int, default=128)
    ap.add_argument("--num-blocks", type=int, default=1024)
    ap.add_argument("--block-tokens", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=8)
    ap.add_argument("--ids", choices=("contiguous", "random"),
                    default="contiguous")
    ap.add_argument("--port", type=int, default=19300)
    ap.add_argument("--helper", default=os.environ.get(
        "KVPULL_PULLBENCH", os.path.join(REPO, "build", "tools",
                                         "libkvpull_pullbench.so")))
    a = ap.parse_args()
    if a.rounds < 1 or a.calls < 1 or not 1 <= a.blocks <= 4096 or \
            a.num_blocks < 700 + a.blocks:
        ap.error("--rounds and --calls at least 1, --blocks 1-4096, "
                 "--num-blocks at least 700 + --blocks")
    if not os.path.isfile(a.helper):
        print("bench_pull.py: %s not found (make %s)" % (
            a.helper, os.path.relpath(a.helper, REPO)), file=sys.stderr)
        return 2
    helper = load_helper(a.helper)
    if a.host:
        host(a, helper)
        return 0
    return vm(a, helper)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except kvpull.Error as e:
        print("bench_pull.py: %s" % e, file=sys.stderr)
        sys.exit(1 if e.code != -errno.ENODEV else 77)
