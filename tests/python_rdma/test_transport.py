# SPDX-License-Identifier: MIT
"""The Python binding's transport over real verbs: soft-RoCE in the VM
(scripts/rxe-vm.sh, see README.md here), or a host with an RDMA device.
Every test needs $KVP_ADDR0 and is skipped without it.

 - an agent's facts: fds, meta before and after registration (the blob
   carries the registered numpy arrays' addresses and keys), listen twice;
 - pulls from Python, producers and consumers polled from one thread, both
   in this process: TP 1 -> 1 with a carried blob (add_engine), every byte
   of the consumer's memory checked, DONE's numbers, stats, engine info,
   the borrowed plan; TP 2 -> 1 with connect() blocking in C while a Python
   thread polls the producers (it can only because connect releases the
   GIL), every byte checked against the agent's own plan executed by numpy;
 - errors with the library's reasons (IDS_MAX, NO_ENGINE, IDS_RANGE,
   NOT_UP), EXPIRED, a shared secret that differs (ENGINE_DOWN -EPERM),
   FAILED with its ids after remove_engine();
 - a streamed pull: nothing before publish, ARRIVED for the first layer,
   DONE after the last publish;
 - asyncio (poll_async on both sides), registered buffers held;
 - the dma-buf fallback of soft-RoCE;
 - python/examples/connector.py, the two-process prefill TP 2 / decode TP 1
   connector, bulk and streamed.
"""
import asyncio
import errno
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from conftest import (ADDR, CONS_ENGINE, LAYERS, NUM_BLOCKS, PROD_ENGINE,
                      REPO, drive, execute, fail_on, has, layout, memory)

import kvpull

EV = kvpull.EventType
CONNECTOR = os.path.join(REPO, "python", "examples", "connector.py")


def producer(lay, port, rank=0, **kw):
    """A producer rank of lay, its memory filled, registered, listening on
    port + rank; returns (agent, memory)."""
    a = kvpull.Agent(lay, "producer", addr=ADDR, max_peers=8, **kw)
    mem = memory(lay, rank)
    a.register_all(mem)
    a.listen(ADDR, port + rank)
    return a, mem


def consumer(lay, **kw):
    kw.setdefault("max_ids", 64)
    a = kvpull.Agent(lay, "consumer", addr=ADDR, max_peers=8, **kw)
    mem = memory(lay)
    a.register_all(mem)
    return a, mem


def up(p_agents, c, peers, timeout_ms=30000):
    """add_engine on c, polled with the producers until ENGINE_UP."""
    e = c.add_engine(peers, timeout_ms=timeout_ms)
    evs = drive(p_agents + [c], lambda ev: has(ev[-1], EV.ENGINE_UP) or
                has(ev[-1], EV.ENGINE_DOWN), timeout_ms / 1000 + 10)
    fail_on(evs[-1], EV.ENGINE_DOWN)
    assert has(evs[-1], EV.ENGINE_UP)[0].engine == e
    return e


def same_layout_expected(lay, pmem, dmem, lids, rids):
    """TP 1 -> 1, one layout: block rids[i] of every view lands in block
    lids[i]; the rest stays as it was."""
    out = [m.copy() for m in dmem]
    for v in lay.views:
        for lb, rb in zip(lids.tolist(), rids.tolist()):
            lo, ro = v.offset + lb * v.stride, v.offset + rb * v.stride
            out[v.region][lo:lo + v.stride] = pmem[v.region][ro:ro + v.stride]
    return out


def assert_memory(got, want):
    bad = sum(int(np.count_nonzero(g != w)) for g, w in zip(got, want))
    assert bad == 0, "%d wrong bytes" % bad


# ---- one agent --------------------------------------------------------------


def test_open_fds_meta_listen(port):
    lay = layout()
    with kvpull.Agent(lay, "producer", addr=ADDR, max_peers=8) as p:
        fds = p.fds()
        assert len(fds) == kvpull.AGENT_FDS and min(fds) >= 0
        assert p.fileno() not in fds
        ready, wake = p.arm()
        assert ready in (False, True)
        with pytest.raises(kvpull.Error) as ei:
            p.meta()
        assert ei.value.code == -errno.ENXIO
        mem = memory(lay, 0)
        p.register_all(mem)
        assert p.registered == {r: (m.ctypes.data, m.nbytes)
                                for r, m in enumerate(mem)}
        blob = p.meta()
        assert blob == p.meta()
        with kvpull.Layout.from_meta(blob) as back:
            assert back.compat_hash == lay.compat_hash
            for r, m in enumerate(mem):
                addr, rkey = back.region_key(r)
                assert addr == m.ctypes.data and rkey != 0
        p.listen(ADDR, port)
        with pytest.raises(kvpull.Error) as ei:
            p.listen(ADDR, port + 1)
        assert ei.value.code == -errno.EBUSY
        assert p.stats().mem_bytes > 0
    assert p.closed


def test_register_holds_buffers():
    lay = layout()
    a = kvpull.Agent(lay, "consumer", addr=ADDR, max_peers=8)
    ba = bytearray(lay.region_size(0))
    a.register(0, ba)
    for r in range(1, len(lay.regions)):
        a.register(r, np.zeros(lay.region_size(r), np.uint8))
    with pytest.raises(BufferError):
        ba.extend(b"x")
    with pytest.raises(kvpull.Error) as ei:
        a.register(0, bytearray(lay.region_size(0)))
    assert ei.value.code == -errno.EINVAL          # registered already
    a.close()
    ba.extend(b"x")


# ---- pulls ------------------------------------------------------------------


def test_pull_tp1_every_byte(port):
    plat, clat = layout(), layout(engine_id=CONS_ENGINE)
    p, pmem = producer(plat, port)
    c, cmem = consumer(clat)
    try:
        e = up([p], c, [(ADDR, port, p.meta())])
        info = c.engine_info(e)
        assert info.state == kvpull.EngineState.UP
        assert (info.engine_id, info.tp_size) == (PROD_ENGINE, 1)
        plan = c.plan(e)
        assert plan.sources == [0] and plan.dump().startswith("plan:")
        with c.engine_layout(e, 0) as rl:
            assert rl.region_key(0)[0] == pmem[0].ctypes.data
        lids = np.arange(20, 28, dtype=np.uint32)
        rids = np.arange(0, 8, dtype=np.uint32)
        before = [m.copy() for m in cmem]
        p.expect(CONS_ENGINE, 1, timeout=60)
        c.pull_from(e, 1, [(lids, rids)])
        evs = drive([p, c], lambda ev: has(ev[1], EV.DONE, 1) and
                    has(ev[0], EV.RELEASED, 1))
        fail_on(evs[1], EV.FAILED, EV.ENGINE_DOWN)
        done = has(evs[1], EV.DONE, 1)[0]
        per_block = sum(v.stride for v in clat.views)
        assert done.ok and done.engine == e and done.reads > 0
        assert done.bytes == 8 * per_block and done.elapsed_ns > 0
        assert has(evs[0], EV.RELEASED, 1)[0].engine_id == CONS_ENGINE
        assert_memory(cmem, same_layout_expected(clat, pmem, before, lids,
                                                 rids))
        cs, ps = c.stats(), p.stats()
        assert (cs.pulls, cs.done, cs.failed) == (1, 1, 0)
        assert cs.reads == done.reads and cs.read_bytes == done.bytes
        assert (ps.released, ps.expired) == (1, 0) and ps.notes_recv >= 1
        assert c.engine_info(e).done == 1
        # the metrics say the same (Agent.metrics(), kvp_agent_metrics())
        cm, pm = c.metrics(), p.metrics()
        assert sum(h["count"] for h in
                   cm["histograms"]["kvpull_pull_duration_seconds"]) == 1
        assert cm["counters"]["kvpull_read_bytes_total"][0]["value"] == \
            done.bytes
        assert {s["labels"]["outcome"]: s["value"] for s in pm["counters"][
            "kvpull_requests_reported_total"]} == {"released": 1,
                                                   "expired": 0}
        assert "kvpull_pulls_total 1\n" in c.metrics("text")
    finally:
        c.close()
        p.close()
    assert plan.closed                  # borrowed: closed with the agent


def test_tp2_to_tp1_connect_releases_the_gil(port):
    plats = [layout(2, r) for r in range(2)]
    prods = [producer(lay, port, r) for r, lay in enumerate(plats)]
    clat = layout(engine_id=CONS_ENGINE)
    c, cmem = consumer(clat)
    stop = threading.Event()
    pevents = [[], []]

    def serve():                         # the producers' engine loop
        while not stop.is_set():
            for i, (a, _m) in enumerate(prods):
                pevents[i] += a.poll(64)
            time.sleep(0.0005)

    t = threading.Thread(target=serve)
    t.start()
    try:
        # blocks in C; the handshake needs serve() to run meanwhile
        c.connect([(ADDR, port), (ADDR, port + 1)], timeout_ms=60000)
        plan = c.plan()
        assert plan is not None and sorted(plan.sources) == [0, 1]
        lids = np.array([3, 9, 4, 30, 17], np.uint32)
        rids = np.array([0, 1, 2, 3, 4], np.uint32)
        req = [(lids, rids, 70)]            # 70 tokens: a partial block
        want, nbytes = execute(plan, req, [m for _a, m in prods], cmem)
        for a, _m in prods:
            a.expect(CONS_ENGINE, 11, timeout=60)
        c.pull(11, req)
        evs = drive([c], lambda ev: has(ev[0], EV.DONE, 11) or
                    has(ev[0], EV.FAILED, 11))[0]
        fail_on(evs, EV.FAILED)
        assert has(evs, EV.DONE, 11)[0].bytes == nbytes
        assert_memory(cmem, want)
        end = time.monotonic() + 30
        while not all(has(pe, EV.RELEASED, 11) for pe in pevents):
            c.poll()                     # the notifications go out
            assert time.monotonic() < end, pevents
            time.sleep(0.001)
    finally:
        stop.set()
        t.join()
        c.close()
        for a, _m in prods:
            a.close()


def test_errors_carry_reasons(port):
    plat, clat = layout(), layout(engine_id=CONS_ENGINE)
    p, _pmem = producer(plat, port)
    c, _cmem = consumer(clat, max_ids=16)
    try:
        ids = np.arange(17, dtype=np.uint32)
        with pytest.raises(kvpull.Error) as ei:
            c.pull(1, [(ids[:2], ids[:2])])
        assert ei.value.code == -errno.ENOTCONN
        assert ei.value.reason == kvpull.Reason.NOT_UP
        assert c.last_error()[0] == kvpull.Reason.NOT_UP
        e = up([p], c, [(ADDR, port)])          # blob in-band this time
        with pytest.raises(kvpull.Error) as ei:
            c.pull_from(e, 2, [(ids, ids)])
        assert ei.value.code == -errno.EINVAL
        assert ei.value.reason == kvpull.Reason.IDS_MAX
        assert "max_ids" in ei.value.why
        with pytest.raises(kvpull.Error) as ei:
            c.pull_from(e + 100, 3, [(ids[:2], ids[:2])])
        assert (ei.value.code, ei.value.reason) == (
            -errno.ENOENT, kvpull.Reason.NO_ENGINE)
        with pytest.raises(kvpull.Error) as ei:
            c.pull_from(e, 4, [(np.array([NUM_BLOCKS], np.uint32),
                                np.array([0], np.uint32))])
        assert (ei.value.code, ei.value.reason) == (
            -errno.ERANGE, kvpull.Reason.IDS_RANGE)
        with pytest.raises(kvpull.Error) as ei:
            c.listen(ADDR, port + 5)
        assert ei.value.code == -errno.EINVAL
        p.expect(CONS_ENGINE, 5, timeout=60)
        with pytest.raises(kvpull.Error) as ei:
            p.expect(CONS_ENGINE, 5, timeout=60)
        assert ei.value.code == -errno.EEXIST
        assert c.stats().pulls == 0
    finally:
        c.close()
        p.close()


def test_expired_then_already():
    with kvpull.Agent(layout(), "producer", addr=ADDR, max_peers=8) as p:
        p.expect(CONS_ENGINE, 9, timeout=0.2)
        evs = drive([p], lambda ev: has(ev[0], EV.EXPIRED, 9), 10)[0]
        ex = has(evs, EV.EXPIRED, 9)[0]
        assert ex.reason == kvpull.Reason.TIMEOUT and ex.req_id == 9
        with pytest.raises(kvpull.Error) as ei:
            p.expect(CONS_ENGINE, 9, timeout=1)
        assert ei.value.code == -errno.EALREADY
        assert p.stats().expired == 1


def test_secret_mismatch_is_engine_down(port):
    plog, clog = [], []
    p, _ = producer(layout(), port, secret=b"a" * 32, log_fn=plog.append)
    c, _ = consumer(layout(engine_id=CONS_ENGINE), secret=b"b" * 32,
                    log_fn=clog.append)
    try:
        e = c.add_engine([(ADDR, port)], timeout_ms=20000)
        evs = drive([p, c], lambda ev: has(ev[1], EV.ENGINE_DOWN), 40)[1]
        down = has(evs, EV.ENGINE_DOWN)[0]
        assert down.engine == e and down.status == -errno.EPERM
        assert isinstance(down.error, kvpull.Error)
        info = c.engine_info(e)
        assert info.state == kvpull.EngineState.DOWN
        assert info.status == -errno.EPERM
        # the log callbacks: the producer's refusal with its reason and
        # the consumer's address, the consumer's engine down
        kind = kvpull.enums.LogKind
        refused = [r for r in plog if r["kind"] == kind.REFUSED]
        assert refused and all(r["reason"] == kvpull.Reason.AUTH and
                               r["peer_addr"] == ADDR for r in refused)
        assert len(refused) == p.stats().refused
        assert [r["status"] for r in clog
                if r["kind"] == kind.ENGINE_DOWN] == [-errno.EPERM]
    finally:
        c.close()
        p.close()


def test_pulls_reported_once_after_remove(port):
    """An engine removed with pulls in flight: each pull is reported once,
    FAILED with its own ids (which stay valid after the next poll), as
    tests/rdma_both.c pins in C: -ECANCELED, or -ESTALE (the producer
    expects none of them: a pull whose lease READ came back before the
    removal fails closed; never DONE). Which of the two depends on the
    device: soft-RoCE on loopback lands READs inside the post call; the
    host tests (test_agent.py) pin the FAILED ids' copy through a
    stand-in library."""
    plat, clat = layout(), layout(engine_id=CONS_ENGINE)
    p, _pmem = producer(plat, port)
    c, _cmem = consumer(clat)
    try:
        e = up([p], c, [(ADDR, port, p.meta())])
        plan = c.plan(e)
        want = {}
        for k in range(4):
            lids = np.array([5 + 3 * k, 6 + 3 * k, 7 + 3 * k], np.uint32)
            want[21 + k] = lids.tolist()
            c.pull_from(e, 21 + k,
                        [(lids, np.array([0, 1, 2], np.uint32) + 3 * k)])
        c.remove_engine(e)               # before any poll
        assert plan.closed

        def reported(ev):
            return all(has(ev[0], EV.DONE, r) or has(ev[0], EV.FAILED, r)
                       for r in want)

        evs = drive([c], reported, 20)[0]
        c.poll()                         # the C arrays are reused now
        for r, lids in want.items():
            done, failed = has(evs, EV.DONE, r), has(evs, EV.FAILED, r)
            assert len(failed) == 1 and not done, (r, evs)
            for f in failed:
                assert f.status in (-errno.ECANCELED, -errno.ESTALE)
                assert f.engine == e
                assert [a.tolist() for a in f.ids] == [lids]
        assert all(ev.type in (EV.DONE, EV.FAILED) and ev.req_id in want
                   for ev in evs)
    finally:
        c.close()
        p.close()


def test_streamed_pull(port):
    plat, clat = layout(), layout(engine_id=CONS_ENGINE)
    p, pmem = producer(plat, port)
    c, cmem = consumer(clat, stream_events=1)
    try:
        e = up([p], c, [(ADDR, port, p.meta())])
        lids = np.arange(10, 14, dtype=np.uint32)
        rids = np.arange(4, 8, dtype=np.uint32)
        before = [m.copy() for m in cmem]
        p.expect(CONS_ENGINE, 31, timeout=60)
        c.pull_stream(e, 31, [(lids, rids)])
        t0 = time.monotonic()
        evs = [[], []]
        while time.monotonic() - t0 < 0.5:      # nothing published yet
            evs[0] += p.poll()
            evs[1] += c.poll()
        assert not has(evs[1], EV.DONE) and not has(evs[1], EV.ARRIVED)
        p.publish(CONS_ENGINE, 31, (0, kvpull.TOKENS_END, 1))  # layer 0
        evs = drive([p, c], lambda ev: has(ev[1], EV.ARRIVED, 31))
        arr = has(evs[1], EV.ARRIVED, 31)[0]
        assert arr.layers == 1 and not has(evs[1], EV.DONE)
        p.publish(CONS_ENGINE, 31, (kvpull.TOKENS_END, kvpull.TOKENS_END,
                                    LAYERS))
        evs = drive([p, c], lambda ev: has(ev[1], EV.DONE, 31) and
                    has(ev[0], EV.RELEASED, 31))
        fail_on(evs[1], EV.FAILED)
        assert_memory(cmem, same_layout_expected(clat, pmem, before, lids,
                                                 rids))
        assert p.stats().publishes >= 2 and c.stats().arrivals >= 1
    finally:
        c.close()
        p.close()


def test_asyncio(port):
    plat, clat = layout(), layout(engine_id=CONS_ENGINE)
    p, pmem = producer(plat, port)
    c, cmem = consumer(clat)
    lids = np.arange(0, 6, dtype=np.uint32)
    rids = np.arange(6, 12, dtype=np.uint32)
    before = [m.copy() for m in cmem]

    async def main():
        stop = asyncio.Event()
        released = []

        async def serve():               # the producer's loop
            while not stop.is_set():
                for ev in await p.poll_async(timeout=0.1):
                    if ev.type == EV.RELEASED:
                        released.append(ev.req_id)

        async def wait_for(type, req_id=None):
            while True:
                for ev in await c.poll_async(timeout=30):
                    if ev.type == type and (req_id is None or
                                            ev.req_id == req_id):
                        return ev
                    if ev.type in (EV.FAILED, EV.ENGINE_DOWN):
                        raise AssertionError(repr(ev))

        server = asyncio.ensure_future(serve())
        e = c.add_engine([(ADDR, port, p.meta())], timeout_ms=30000)
        await asyncio.wait_for(wait_for(EV.ENGINE_UP), 40)
        p.expect(CONS_ENGINE, 41, timeout=60)
        c.pull_from(e, 41, [(lids, rids)])
        done = await asyncio.wait_for(wait_for(EV.DONE, 41), 40)
        end = time.monotonic() + 30
        while 41 not in released and time.monotonic() < end:
            await c.poll_async(timeout=0.05)
        stop.set()
        await server
        return done, released

    try:
        done, released = asyncio.run(main())
        assert done.ok and released == [41]
        assert_memory(cmem, same_layout_expected(clat, pmem, before, lids,
                                                 rids))
    finally:
        c.close()
        p.close()


def test_dmabuf_fallback():
    if not os.environ.get("KVP_DEV0", "").startswith("rxe"):
        pytest.skip("the fallback is soft-RoCE's")
    lay = layout()
    with kvpull.Agent(lay, "producer", addr=ADDR, max_peers=8) as p, \
            open("/dev/null", "rb") as null:
        mem = memory(lay, 0)
        with pytest.raises(kvpull.Error) as ei:
            p.register_dmabuf(0, null.fileno(), 0, mem[0].nbytes)
        assert ei.value.code == -errno.ENOTSUP
        for r, m in enumerate(mem):
            assert p.register_dmabuf(r, null.fileno(), 0, m.nbytes, m)
        assert p.stats().dmabuf_fallbacks == len(mem)
        assert p.registered[0] == (mem[0].ctypes.data, mem[0].nbytes)


# ---- the example ------------------------------------------------------------


@pytest.mark.parametrize("mode", ["bulk", "stream"])
def test_connector_example(port, mode):
    # each worker serves /metrics and checks its own counts there
    args = [sys.executable, CONNECTOR, "pair", "--addr", ADDR,
            "--port", str(port), "--ctrl-port", str(port + 4),
            "--timeout", "150", "--metrics-port", str(port + 6)]
    if os.environ.get("KVP_ADDR1"):
        args += ["--decode-addr", os.environ["KVP_ADDR1"]]
    if mode == "stream":
        args.append("--stream")
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"))
    r = subprocess.run(args, capture_output=True, text=True, timeout=400,
                       env=env)
    out = r.stdout + r.stderr
    print(out)
    assert r.returncode == 0, out
    assert "decode: every byte checked" in out
    assert "every request released by both ranks" in out
    assert "prefill: /metrics: " in out and "decode: /metrics: " in out
    assert out.rstrip().endswith("1 passed, 0 failed")
