# SPDX-License-Identifier: MIT
"""python/examples/connector.py without RDMA: its KV caches against the
layouts, and its data path with the READs executed by numpy instead of the
NIC -- the plan the decode worker's agent compiles (TP 2 -> 1, the same
max_sge), emitted for each of its requests, every READ copied from the
prefill ranks' arrays into the decode worker's -- then the example's own
check of every byte. What only the VM can show (the agents, the handshake,
the NIC doing those READs) is tests/python_rdma/test_transport.py's."""
import importlib.util
import os

import numpy as np
import pytest

from conftest import REPO

import kvpull

PATH = os.path.join(REPO, "python", "examples", "connector.py")


@pytest.fixture(scope="module")
def C():
    spec = importlib.util.spec_from_file_location("connector", PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _execute(em, sources, prefill, decode):
    """Do the READs of an emission: bytes of producer rank sources[src]'s
    region, scattered into the decode cache's regions."""
    src_mem = [[t.view(np.uint8).reshape(-1) for t in c.regions]
               for c in prefill]
    dst_mem = [t.view(np.uint8).reshape(-1) for t in decode.regions]
    sges = em.sges
    for off, ln, region, src, first, nsge, _g in em.wrs.tolist():
        data = src_mem[sources[src]][region][off:off + ln]
        pos = 0
        for o, n, r in sges[first:first + nsge].tolist():
            dst_mem[r][o:o + n] = data[pos:pos + n]
            pos += n
        assert pos == ln


def test_caches_match_the_layouts(C):
    for tp, rank, heads in ((2, 0, 4), (2, 1, 4), (1, 0, 8)):
        lay = C.build_layout(tp, rank, 1)
        cache = C.KVCache(lay)           # asserts sizes and strides
        assert (cache.head0, cache.heads) == (rank * heads, heads)
        assert len(cache.regions) == 2 * C.LAYERS
        # vLLM's logical per-layer shape, over the same memory
        kv = cache.kv_caches[0]
        assert kv.shape == (2, C.NUM_BLOCKS, C.BLOCK, heads, C.HEAD_DIM)
        assert np.shares_memory(kv, cache.mem[0])
        lay.close()


def test_data_path_every_byte(C):
    pre = [C.build_layout(C.PREFILL_TP, r, C.PREFILL_ENGINE)
           for r in range(C.PREFILL_TP)]
    prefill = [C.KVCache(lay) for lay in pre]
    dec = C.build_layout(C.DECODE_TP, 0, C.DECODE_ENGINE)
    decode = C.KVCache(dec)
    for m in decode.mem:
        m[...] = C.BACKGROUND
    expected = [m.copy() for m in decode.mem]
    # the agent's plan: its default max_sge, from rank 0's blob
    plan = kvpull.Plan.compile(dec, pre[0], max_sge=kvpull.DEFAULT_MAX_SGE)
    assert plan.sources == [0, 1]
    per_block = sum(t[0].nbytes for t in decode.regions)
    pfree = list(np.random.default_rng(22).permutation(C.NUM_BLOCKS))
    dfree = list(np.random.default_rng(1).permutation(C.NUM_BLOCKS))
    for req, tokens, hit in C.REQUESTS:
        blocks = [int(pfree.pop()) for _ in range(C.blocks_of(tokens))]
        for layer in range(C.LAYERS):
            for cache in prefill:
                cache.fill(req, layer, blocks)
        remote = np.array(blocks, np.uint32)
        local = np.array([dfree.pop() for _ in range(len(blocks) - hit)],
                         np.uint32)
        em = plan.emit([(local, remote, tokens)])
        # what a DONE event's bytes would say: the local blocks, whole
        assert em.nbytes == len(local) * per_block
        _execute(em, plan.sources, prefill, decode)
        C.expect_pulled(expected, decode.heads, req, local, hit)
    assert C.wrong_bytes(decode, expected) == 0
    # the check sees one wrong byte, in a pulled block or in one that
    # must still hold the background
    decode.mem[2].view(np.uint8)[1, 5, 3, 7, 11] ^= 1
    assert C.wrong_bytes(decode, expected) == 1
    decode.mem[2].view(np.uint8)[1, 5, 3, 7, 11] ^= 1
    untouched = int(dfree[0])
    decode.mem[0][0][untouched][0, 0, 0] ^= 0x0100
    assert C.wrong_bytes(decode, expected) == 1
    plan.close()


def test_stream_progress_sequence_is_valid(C):
    # what the prefill worker publishes for each request with --stream
    seq = [(0, kvpull.TOKENS_END, layer + 1) for layer in range(C.LAYERS)]
    seq.append((kvpull.TOKENS_END, kvpull.TOKENS_END, C.LAYERS))
    prev = None
    covered = []
    for p in seq:
        for r in kvpull.progress_ranges(prev, p):
            # the last publish adds layers [LAYERS, UINT32_MAX): none here
            covered += range(r.layer0, min(r.layer1, C.LAYERS))
            assert (r.tok0, r.tok1) == (0, kvpull.TOKENS_END)
        prev = p
    assert covered == list(range(C.LAYERS))     # each layer once


# ---- the example's control flow, with a simulated transport ------------------

class _SimAgent:
    """Just enough of kvpull.Agent for connector.py, in one process: the
    READs of a pull are the plan's, done by numpy from the producer
    agents' registered arrays; DONE, RELEASED, ENGINE_UP and ARRIVED come
    through poll(), and fileno() is a pipe written when they do. It checks
    the example's side channel, loops, threads of events and its check of
    every byte -- not the library, which tests/python_rdma runs."""

    fabric = {}
    corrupt = False

    def __init__(self, layout, role="consumer", **kw):
        import threading
        self.layout = layout.clone()
        self.role = kvpull.Role.parse(role)
        self.kw = kw
        self.lock = threading.Lock()
        self.events = []
        self.r, self.w = os.pipe()
        os.set_blocking(self.r, False)
        self.expected, self.progress = set(), {}
        self.engines, self.streams = {}, []
        self.st = kvpull.AgentStats()
        self.mem = None

    def register_all(self, mems):
        self.mem = [m.reshape(-1).view(np.uint8) for m in mems]
        assert all(np.shares_memory(a, m) for a, m in zip(self.mem, mems))

    def listen(self, addr, port):
        self.fabric[(addr, port)] = self

    def meta(self):
        return self.layout.to_meta()

    def expect(self, ce, req, deadline_ns=None, timeout=None):
        self.expected.add((ce, req))

    def publish(self, ce, req, progress):
        self.st.publishes += 1
        self.progress[(ce, req)] = tuple(progress)

    def _push(self, ev):
        with self.lock:
            self.events.append(ev)
            os.write(self.w, b"x")

    def add_engine(self, peers, timeout_ms=10000):
        prods = [self.fabric[(a, p)] for a, p, _m in peers]
        remote = kvpull.Layout.from_meta(peers[0][2])
        plan = kvpull.Plan.compile(self.layout, remote,
                                   max_sge=kvpull.DEFAULT_MAX_SGE)
        self.engines[7] = (prods, plan)
        self._push(kvpull.Event("engine_up", engine=7,
                                engine_id=remote.engine_id))
        return 7

    def plan(self, engine=None):
        plan = self.engines[engine][1]
        return kvpull.Plan(plan.handle, plan.local, plan.remote, owned=False)

    def _do(self, engine, req, ids):
        prods, plan = self.engines[engine]
        em = plan.emit(ids)
        for off, ln, region, src, first, nsge, _g in em.wrs.tolist():
            data = prods[plan.sources[src]].mem[region][off:off + ln]
            pos = 0
            for o, n, r in em.sges[first:first + nsge].tolist():
                self.mem[r][o:o + n] = data[pos:pos + n]
                pos += n
        if self.corrupt and not self.st.reads:
            self.mem[0][0] ^= 0xFF       # once: the first pull's
        self.st.reads += len(em.wrs)
        self._push(kvpull.Event("done", req_id=req, engine=engine,
                                reads=len(em.wrs), bytes=em.nbytes))
        ce = self.layout.engine_id
        for r in plan.notify_ranks:
            if (ce, req) in prods[r].expected:
                prods[r].st.released += 1
                prods[r]._push(kvpull.Event("released", req_id=req,
                                            engine_id=ce))

    def pull_from(self, engine, req, ids):
        self._do(engine, req, ids)

    def pull_stream(self, engine, req, ids):
        self.streams.append([engine, req, ids, 0])

    def poll(self, max_events=16, timeout=0):
        end = kvpull.TOKENS_END
        ce = self.layout.engine_id
        for s in list(self.streams):
            engine, req, ids, seen = s
            prods, plan = self.engines[engine]
            progs = [prods[r].progress.get((ce, req)) for r in plan.sources]
            if None in progs:
                continue
            if all(p[0] == end for p in progs):
                self.streams.remove(s)
                self._do(engine, req, ids)
                continue
            layers = min(p[2] for p in progs)
            if layers > seen and self.kw.get("stream_events"):
                s[3] = layers
                self.st.arrivals += 1
                self._push(kvpull.Event("arrived", req_id=req,
                                        engine=engine, layers=layers))
        with self.lock:
            evs, self.events = (self.events[:max_events],
                                self.events[max_events:])
            try:
                os.read(self.r, 1 << 16)
            except BlockingIOError:
                pass
            if self.events:
                os.write(self.w, b"x")
        return evs

    def arm(self):
        with self.lock:
            return bool(self.events) or bool(self.streams), None

    def fileno(self):
        return self.r

    def stats(self):
        return self.st

    def close(self):
        for k, v in list(self.fabric.items()):
            if v is self:
                del self.fabric[k]
        os.close(self.r)
        os.close(self.w)


def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("stream, corrupt", [(False, False), (True, False),
                                             (False, True)])
def test_example_end_to_end_simulated(C, monkeypatch, capsys, stream,
                                      corrupt):
    import argparse
    import threading
    monkeypatch.setattr(kvpull, "Agent", _SimAgent)
    monkeypatch.setattr(_SimAgent, "corrupt", corrupt)
    args = argparse.Namespace(
        addr="10.77.0.1", decode_addr="10.77.0.1", port=18950,
        ctrl_addr="127.0.0.1", ctrl_port=_free_port(), timeout=60,
        stream=stream)
    res = {}

    def prefill():
        try:
            res["prefill"] = C.run_prefill(args)
        except Exception as e:          # noqa: BLE001 (reported below)
            res["prefill"] = repr(e)

    t = threading.Thread(target=prefill)
    t.start()
    try:
        res["decode"] = C.run_decode(args)
    finally:
        t.join(60)
    out = capsys.readouterr().out
    want = 1 if corrupt else 0
    assert res == {"prefill": want, "decode": want}, out
    assert ("decode: every byte checked" in out) != corrupt
    assert "every request released by both ranks" in out
    if stream:
        assert "ARRIVED layers" in out
    if corrupt:
        assert "1 of 16777216 bytes of the cache wrong" in out
