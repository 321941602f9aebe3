# SPDX-License-Identifier: MIT
"""kvpull's backend for InferenceX's kv-transfer suite
(python/kvpull/integrations/inferencex.py) and its CPU lane's pure parts
(inferencex_run.py), on the host: the layout from the suite's own
plan_config(), the ids from its block tables (the READs the consumer's
plan emits for them, done by numpy, move exactly the suite's descriptors'
bytes), the bulk row, and the backend's post/wait/prep and target thread
over a stand-in agent.  The suite is ../shared/third_party/inferencex-kv
beside the repository or $INFERENCEX_KV (docs/inferencex.md); the VM test
is tests/python_rdma/test_inferencex.py."""
import argparse
import errno
import json
import os
import re
import sys
import threading
import time

import numpy as np
import pytest

from conftest import REPO

import kvpull
from kvpull.integrations import inferencex_run as ixr

SUITE = ixr.suite_dir()
sys.path[:0] = [os.path.join(SUITE, "bench"), SUITE]

import kv_workload  # noqa: E402
import run_kv  # noqa: E402
from kvpull.integrations import inferencex as ix  # noqa: E402

ARGS = ["--workload-name", "kv-dsv4", "--precision", "fp8", "--runner",
        "host", "--isl-ladder", "1024 2048", "--page-tokens", "16 64",
        "--batch-sizes", "1 2", "--ops", "pull"]
MAX_LEN = 8 << 20      # soft-RoCE's max_msg_sz, what the VM's agent uses


def suite_args(*extra):
    ap = argparse.ArgumentParser()
    run_kv.add_kv_args(ap)
    return ap.parse_args(ARGS + list(extra))


def grid(args):
    cfgs = [cfg for cfg, _ in run_kv._grid(args)[0]]
    pool = max(c["pool_bytes"] for c in cfgs)
    bulk = min(max(c["req_bytes"] for c in cfgs), run_kv.BULK_CAP)
    return cfgs, pool, bulk


def tables(cfg, r):
    return (kv_workload.block_table(cfg, kv_workload.table_seed(cfg, "local"),
                                    r),
            kv_workload.block_table(cfg, kv_workload.table_seed(cfg, "remote"),
                                    r))


def layouts(args):
    cfgs, pool, bulk = grid(args)
    bulks = ix.bulk_sizes(args, bulk)
    tl, groups = ix.build_layout(cfgs, pool, bulks, bulk, ix.TARGET_ENGINE)
    il, groups2 = ix.build_layout(cfgs, pool, bulks, bulk,
                                  ix.INITIATOR_ENGINE)
    assert groups == groups2
    return cfgs, pool, bulk, tl, il, groups


def test_layout_is_the_suites_pool():
    """One group per suite region and point, one view per layer where
    kv_workload.page_offsets() puts that layer's page 0, pages page_bytes
    apart, entries as tokens; a bulk group per bulk row."""
    args = suite_args()
    cfgs, pool, bulk, tl, _il, groups = layouts(args)
    assert len(cfgs) == 4
    assert ix.bulk_sizes(args, bulk) == [c["req_bytes"] for c in cfgs
                                         if c["page_tokens"] == 64]
    assert tl.regions == [pool, bulk]
    assert tl.info.ngroups == 4 * 4 + 2
    entry = {"csa": 576, "csa-idx": 132, "hca": 576, "window": 576}
    views = {(v.group, v.layer): v for v in tl.views}
    fields = tl.fields
    nviews = 0
    for cfg in cfgs:
        zero = {name: np.zeros(1, np.int64) for name in entry}
        offs = kv_workload.page_offsets(cfg, zero)
        at = 0
        for r, g in zip(cfg["regions"], groups[ix.geometry(cfg)]):
            grp = tl.group(g)
            assert grp.kind == kvpull.GroupKind.MLA
            assert grp.block_tokens * entry[r["name"]] == r["page_bytes"]
            for layer in range(r["layers"]):
                v = views[g, layer]
                assert (v.region, v.num_blocks, v.stride, v.offset) == (
                    0, r["pool_pages"], r["page_bytes"], offs[at + layer])
                nviews += 1
            at += r["layers"]
    for n in ix.bulk_sizes(args, bulk):
        v = views[groups["bulk", n][0], 0]
        assert (v.region, v.num_blocks, v.stride, v.offset) == (1, 1, n, 0)
        nviews += 1
    assert tl.info.nviews == nviews == len(fields)
    for v, f in fields:                    # entries of the group's region
        g = tl.view(v).group
        assert f.elem_size * f.dim[0].size * (f.ndim == 1) in (
            0, tl.group(g).block_tokens * f.elem_size)
        assert f.kind == (kvpull.FieldKind.K if g >= 16 else
                          kvpull.FieldKind.LATENT)


def execute(plan, req, src, dst):
    """Do the plan's READs for req with numpy: src (the target's pool and
    bulk) into dst (the initiator's); return the emission."""
    em = plan.emit(req)
    for off, ln, region, _s, first, nsge, _g in em.wrs.tolist():
        data = src[region][off:off + ln]
        pos = 0
        for o, n, r in em.sges[first:first + nsge].tolist():
            dst[r][o:o + n] = data[pos:pos + n]
            pos += n
    return em


def pattern(n):
    """The suite's pool pattern over n bytes (a byte per 256-byte chunk)."""
    k = np.arange(-(-n // 256), dtype=np.int64)
    return np.repeat(((k * 131 + 7) & 0xFF).astype(np.uint8), 256)[:n]


def pools(pool, bulk):
    src = [pattern(pool), np.full(bulk, 0xAB, np.uint8)]
    return src, [np.full(pool, 0x5A, np.uint8), np.full(bulk, 0xCD, np.uint8)]


def test_ids_from_tables_move_the_suites_descriptors():
    """make_paged()'s request, emitted by the consumer's plan and done by
    numpy, writes every descriptor of kv_workload.desc_array() (the lists
    NIXL is given) and nothing else, each from its own source bytes; the
    suite's verification and the lane's every-byte check pass; READs <=
    descriptors (random tables leave little to coalesce: pinned counts)."""
    args = suite_args("--isl-ladder", "1024")
    cfgs, pool, bulk, tl, il, groups = layouts(args)
    plan = kvpull.Plan.compile(il, tl, max_sge=16, max_len=MAX_LEN)
    be = ix.KvpullBackend(args, "initiator", None)
    be._groups, be._ngroups = groups, il.info.ngroups
    reads = {}
    for cfg in cfgs:
        for r in range(2):
            loc, rem = tables(cfg, r)
            src, dst = pools(pool, bulk)
            be._transfer = lambda req, key, what: (req, key)
            req, key, prep = be.make_paged(cfg, "pull", loc, rem)
            assert key == (cfg["isl"], cfg["page_tokens"], r)
            em = execute(plan, req, src, dst)
            la = kv_workload.desc_array(0, cfg, loc, 0)
            ra = kv_workload.desc_array(0, cfg, rem, 0)
            want = np.full(pool, 0x5A, np.uint8)
            for (lo, n, _), (ro, _n, _) in zip(la.tolist(), ra.tolist()):
                want[lo:lo + n] = src[0][ro:ro + n]
            assert np.array_equal(dst[0], want)
            assert em.nbytes == cfg["req_bytes"]
            assert kv_workload.verify_transfer(
                lambda o: dst[0][o:o + 8].tobytes(), cfg, loc, rem) == (
                    True, "")
            assert ixr.verify_every_byte(dst[0], cfg, loc, rem) == (
                True, "", cfg["req_bytes"])
            reads[key] = (len(em.wrs), cfg["descs"])
    assert reads == {
        (1024, 16, 0): (4393, 4576), (1024, 16, 1): (4516, 4576),
        (1024, 64, 0): (1300, 1330), (1024, 64, 1): (1300, 1330)}


def test_bulk_is_one_contiguous_read():
    """A bulk row reads the buffer's first n bytes from offset 0, in one
    READ where max_len allows (8 MiB pieces on soft-RoCE)."""
    args = suite_args()
    cfgs, pool, bulk, tl, il, groups = layouts(args)
    be = ix.KvpullBackend(args, "initiator", None)
    be._groups, be._ngroups = groups, il.info.ngroups
    be._transfer = lambda req, key, what: (req, key)
    src, clean = pools(pool, bulk)
    for max_len, n in ((MAX_LEN, 2), (0, 1)):
        plan = kvpull.Plan.compile(il, tl, max_sge=16, max_len=max_len)
        for size in ix.bulk_sizes(args, bulk):
            dst = [m.copy() for m in clean]
            req, key, _p = be.make_bulk(size, "pull")
            assert key == ("bulk", size, 0)
            em = execute(plan, req, src, dst)
            assert len(em.wrs) == (n if size > MAX_LEN else 1)
            assert em.wrs["offset"].tolist() == [
                w * MAX_LEN for w in range(len(em.wrs))]
            assert (dst[1][:size] == 0xAB).all()
            assert (dst[1][size:] == 0xCD).all()
            assert (dst[0] == 0x5A).all()


def test_push_and_unknown_transfers_are_refused():
    with pytest.raises(ValueError, match="push .WRITE. is not its"):
        ix.KvpullBackend(suite_args("--ops", "pull push"), "initiator", None)
    args = suite_args()
    cfgs, pool, bulk, _tl, il, groups = layouts(args)
    be = ix.KvpullBackend(args, "initiator", None)
    be._groups, be._ngroups = groups, il.info.ngroups
    loc, rem = tables(cfgs[0], 0)
    with pytest.raises(ValueError, match="push .WRITE. is not its"):
        be.make_paged(cfgs[0], "push", loc, rem)
    with pytest.raises(ValueError, match="push .WRITE. is not its"):
        be.make_bulk(ix.bulk_sizes(args, bulk)[0], "push")
    other = kv_workload.plan_config("dsv4", "fp8", 8192, 16)
    with pytest.raises(ValueError, match="8192 is not a transfer of the "
                       "run's grid"):
        be.make_paged(other, "pull", *tables(other, 0))
    with pytest.raises(ValueError, match="1000 is not a transfer"):
        be.make_bulk(1000, "pull")


class StandIn:
    """A stand-in kvpull.Agent: pulls done at once by numpy through the
    consumer's plan, one DONE each (FAILED for ids in `fail`, -EBUSY for
    the first `busy` pulls); a producer's expects and events recorded."""

    def __init__(self, layout, role, **attrs):
        self.role, self.attrs, self.events = role, attrs, []
        self.layout, self.calls, self.expected = layout, [], []
        self.fail, self.busy, self.lock = set(), 0, threading.Lock()

    def register(self, region, addr, n, keep=None):
        self.calls.append(("register", region, n))

    def listen(self, addr, port):
        self.calls.append(("listen", addr, port))

    def meta(self):
        return b"blob"

    def connect(self, peers, timeout_ms):
        self.calls.append(("connect", peers, timeout_ms))

    def expect(self, engine, rid, timeout):
        with self.lock:
            self.expected.append((engine, rid))

    def pull(self, rid, req):
        if self.busy:
            self.busy -= 1
            raise kvpull.Error(-errno.EBUSY, "kvp_agent_pull")
        em = execute(self.plan, req, self.src, self.dst)
        self.calls.append(("pull", rid))
        self.events.append(kvpull.Event(
            "FAILED", -errno.ESTALE, rid, reason=kvpull.Reason.LEASE)
            if rid in self.fail else kvpull.Event(
                "DONE", 0, rid, reads=len(em.wrs), bytes=em.nbytes))

    def poll(self, n, timeout=0):
        with self.lock:
            out, self.events = self.events[:n], self.events[n:]
        if not out and timeout:
            time.sleep(0.001)
        return out

    def stats(self):
        return kvpull.AgentStats(reads=7, read_bytes=9)

    def close(self):
        self.calls.append(("close",))


class Mem:
    def __init__(self, arr):
        self.ptr, self.nbytes = arr.ctypes.data, arr.size


def backend(role, monkeypatch):
    monkeypatch.setenv("KVPULL_ADDR", "10.0.0.%d" % (role == "target"))
    monkeypatch.setattr(ix.KvpullBackend, "agent_class", StandIn)
    args = suite_args()
    cfgs, pool, bulk = grid(args)
    be = ix.KvpullBackend(args, role, None)
    be.register(Mem(np.zeros(pool, np.uint8)), Mem(np.zeros(bulk, np.uint8)))
    return be, cfgs, pool, bulk


def test_initiator_posts_waits_and_fails_closed(monkeypatch, capsys):
    be, cfgs, pool, bulk = backend("initiator", monkeypatch)
    a = be._agent
    assert a.role == "consumer"
    assert a.attrs == dict(device=None, addr="10.0.0.0", max_inflight=64,
                           stall_ms=ix.STALL_MS, max_ids=128)
    assert a.calls == [("register", 0, pool), ("register", 1, bulk)]
    assert be.publish() == {"engine": ix.INITIATOR_ENGINE}
    be.connect({"meta": b"blob", "addr": "10.0.0.1", "port": 5})
    assert a.calls[-1] == ("connect", [("10.0.0.1", 5, b"blob")],
                           ix.CONNECT_MS)
    tl = ix.build_layout(cfgs, pool, ix.bulk_sizes(be.args, bulk), bulk,
                         ix.TARGET_ENGINE)[0]
    a.plan = kvpull.Plan.compile(be.layout, tl, max_sge=16, max_len=MAX_LEN)
    a.src, a.dst = pools(pool, bulk)
    cfg = cfgs[3]                          # 2048 tokens, 64-token pages
    made = [be.make_paged(cfg, "pull", *tables(cfg, r)) for r in range(2)]
    assert all(0 < prep < 1 for _p, _w, prep in made)
    a.busy = 3
    for _ in range(2):                     # a burst of 2, twice
        for post, _w, _p in made:
            post()
        for _p, wait, _ in made:
            wait()
    assert [c for c in a.calls if c[0] == "pull"] == [
        ("pull", i) for i in (1, 2, 3, 4)]
    assert be.reads == {(2048, 64, 0): 2508, (2048, 64, 1): 2507}
    assert capsys.readouterr().out.splitlines() == [
        "[kvpull] isl=2048 page=64 request=0 descs=2538 reads=2508 "
        "bytes=%d" % cfg["req_bytes"],
        "[kvpull] isl=2048 page=64 request=1 descs=2538 reads=2507 "
        "bytes=%d" % cfg["req_bytes"]]
    post, wait, _p = be.make_bulk(ix.bulk_sizes(be.args, bulk)[0], "pull")
    a.fail.add(5)
    post()
    with pytest.raises(RuntimeError, match=r"request 5 FAILED: .* stale: .*"
                       r"\(reason LEASE\)"):
        wait()
    be.teardown()
    assert a.calls[-1] == ("close",)
    assert capsys.readouterr().out == \
        "[kvpull] stats reads=7 read_bytes=9 done_reads=5015\n"


def test_target_listens_publishes_and_expects_ahead(monkeypatch):
    be, _cfgs, _pool, _bulk = backend("target", monkeypatch)
    a = be._agent
    assert a.role == "producer"
    assert a.attrs == dict(device=None, addr="10.0.0.1",
                           max_inflight=2 * ix.EXPECT_AHEAD,
                           handshake_ms=ix.CONNECT_MS)
    assert a.calls[-1] == ("listen", "10.0.0.1", ix.PORT)
    assert be.publish() == {"meta": b"blob", "addr": "10.0.0.1",
                            "port": ix.PORT}
    be.connect({"engine": ix.INITIATOR_ENGINE})
    want = [(ix.INITIATOR_ENGINE, i) for i in range(1, ix.EXPECT_AHEAD + 1)]
    end = time.monotonic() + 10
    while a.expected != want and time.monotonic() < end:
        time.sleep(0.01)
    assert a.expected == want
    with a.lock:                            # two reported: two more
        a.events += [kvpull.Event("RELEASED", 0, 1), kvpull.Event(
            "EXPIRED", 0, 2)]
    want += [(ix.INITIATOR_ENGINE, ix.EXPECT_AHEAD + i) for i in (1, 2)]
    while a.expected != want and time.monotonic() < end:
        time.sleep(0.01)
    assert a.expected == want
    be.teardown()
    assert not be._thread.is_alive()
    assert a.calls[-1] == ("close",)


def test_summary_lines(tmp_path):
    """--summary: one line per row, descs and reads for the burst, prep
    per request; a row whose reads were not printed says reads=-1."""
    log = tmp_path / "log"
    log.write_text(
        "[kvpull] isl=8192 page=64 request=0 descs=9786 reads=9665 bytes=1\n"
        "[kvpull] isl=8192 page=64 request=1 descs=9786 reads=9756 bytes=1\n"
        "[kvpull] bulk bytes=49139712 descs=1 reads=6 bytes=49139712\n")
    row = dict(kind="paged", isl=8192, page_tokens=64, batch=2, descs=9786,
               req_bytes=49139712, prep_ms=0.5,
               latency_ms={"p50": 826.04}, gbps_p50=0.119,
               verify={"passed": True, "detail": ""})
    rows = [row, dict(row, batch=4, verify={"passed": False}),
            dict(row, kind="bulk", page_tokens=None, descs=1, batch=1)]
    res = tmp_path / "r.json"
    res.write_text(json.dumps({"measurement": {"rows": rows}}))
    assert ixr.summary(str(log), str(res)) == [
        "inferencex: isl=8192 page=64 batch=2 descs=19572 reads=19421 "
        "prep_ms=0.250 p50_ms=826.0 gbps=0.1190 verify=ok",
        "inferencex: isl=8192 page=64 batch=4 descs=39144 reads=-1 "
        "prep_ms=0.125 p50_ms=826.0 gbps=0.2380 verify=FAILED",
        "inferencex: isl=8192 page=bulk batch=1 descs=1 reads=6 "
        "prep_ms=0.500 p50_ms=826.0 gbps=0.0595 verify=none"]


def test_every_byte_check_finds_one_wrong_byte():
    cfg = kv_workload.plan_config("dsv4", "fp8", 1024, 64)
    loc, rem = tables(cfg, 0)
    arr = np.zeros(cfg["pool_bytes"], np.uint8)
    ixr.paint_complement(arr, cfg, loc, rem)
    ok, detail, n = ixr.verify_every_byte(arr, cfg, loc, rem)
    assert not ok and n == 0
    src = pattern(cfg["pool_bytes"])
    assert np.array_equal(src[:1 << 16], ixr._expected(np.arange(1 << 16)))
    for (lo, ln, _), (ro, _n, _) in zip(
            kv_workload.desc_array(0, cfg, loc, 0).tolist(),
            kv_workload.desc_array(0, cfg, rem, 0).tolist()):
        arr[lo:lo + ln] = src[ro:ro + ln]
    assert ixr.verify_every_byte(arr, cfg, loc, rem) == (True, "",
                                                         cfg["req_bytes"])
    last = kv_workload.desc_array(0, cfg, loc, 0)[-1]
    at = int(last[0] + last[1] - 1)
    arr[at] ^= 1
    ok, detail, n = ixr.verify_every_byte(arr, cfg, loc, rem)
    assert not ok and detail.startswith("byte at offset %d: " % at)


def test_suite_files_are_unchanged():
    """The suite is wrapped, never edited: its files hash as PROVENANCE.md's
    commit left them (SHA-256 of bench/, pinned here)."""
    import hashlib
    h = hashlib.sha256()
    for name in sorted(n for n in os.listdir(os.path.join(SUITE, "bench"))
                       if n.endswith(".py")):
        with open(os.path.join(SUITE, "bench", name), "rb") as f:
            h.update(name.encode() + b"\0" + f.read())
    assert h.hexdigest() == SUITE_SHA256
    assert REPO


SUITE_SHA256 = \
    "0ed70224219968de28dece0938ec1f0eb424017b9a4c6ad6de6a2616019a3609"


def test_prep_lines(capsys):
    """--prep: one line per point of the grid, make_paged timed on this
    CPU with a stand-in agent (no figure asserted: a benchmark's)."""
    assert ixr.main(["--prep", "--"] + ARGS + ["--isl-ladder", "1024"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [re.sub(r"=[0-9.]+$", "", re.sub(r"_ms=[0-9.]+", "_ms", x))
            for x in lines] == [
        "prep: isl=1024 page=%d first_ms new_ms seen_ms" % p
        for p in (16, 64)]
