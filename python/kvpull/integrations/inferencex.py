# SPDX-License-Identifier: MIT
"""kvpull as a backend of InferenceX's kv-transfer suite (its five hooks,
``kv_backend.KVBackend``), with the suite's ``bench/`` on ``sys.path``, as
for its own adapters.  Rank 0 (target) is a kvpull producer, rank 1
(initiator) a consumer; both build one layout holding every pool geometry
of the run's grid (:func:`build_layout`).  The target's blob and address
ride the suite's exchange; a thread polls the producer and keeps the next
``EXPECT_AHEAD`` request ids expected (the initiator numbers its pulls 1, 2,
...), since the target's main thread waits in the suite's barriers.  How
and why: docs/inferencex.md.
"""
import ctypes
import errno
import math
import os
import sys
import threading
import time

import numpy as np

import kv_workload
from kv_backend import KVBackend

import kvpull
from kvpull.enums import EventType

TARGET_ENGINE, INITIATOR_ENGINE, PORT = 1, 2, 48850
#: Request ids expected ahead; seconds a wait may take (the agent's stall
#: bound, ms, fails a pull first); the connect bound, ms.
EXPECT_AHEAD, WAIT_S, STALL_MS, CONNECT_MS = 256, 900, 600000, 120000
PUSH = ("kvpull pulls (RDMA READ) only: push (WRITE) is not its operation; "
        "run the suite with --ops pull")
_EMPTY = np.empty(0, np.uint32)
_DMABUF_FD = 1  # CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD


def geometry(cfg):
    """A pool geometry's key: what the layout's views encode of it."""
    return tuple((r["name"], r["layers"], r["page_bytes"], r["pool_pages"],
                  r["base"]) for r in cfg["regions"])


def entry_bytes(preset):
    """Bytes of one cache entry per region name of ``preset``."""
    shape = kv_workload.PRESETS[preset]
    out = {"window": (shape["window"] or {}).get("entry_bytes")}
    for g in shape["groups"]:
        out[g["name"]], out[g["name"] + "-idx"] = g["entry_bytes"], \
            g["indexer_bytes"]
    return out


def bulk_sizes(args, bulk_bytes):
    """The bytes of the run's bulk rows (as ``run_kv.main`` sizes them)."""
    return sorted({min(kv_workload.plan_config(
        args.workload_name.removeprefix("kv-"), args.precision, int(isl), 64,
        args.pool_slack)["req_bytes"], bulk_bytes)
        for isl in args.isl_ladder.split()})


def build_layout(cfgs, pool_bytes, bulks, bulk_bytes, engine_id):
    """``(layout, groups)``: a pool of ``pool_bytes`` (region 0) holding
    each geometry of ``cfgs`` (``plan_config()`` results), and a bulk buffer
    (region 1).  ``groups`` maps :func:`geometry` to the group of each of
    its regions, in order: blocks of cache entries (kvpull's tokens), one
    view per layer at ``base + layer * pool_pages * page_bytes``; and
    ``("bulk", n)``, for each n of ``bulks``, to a group whose one block is
    the buffer's first n bytes."""
    lay = kvpull.Layout.create(engine_id=engine_id)
    pool, bulk = lay.add_region(pool_bytes), lay.add_region(bulk_bytes)
    groups = {}
    for cfg in cfgs:
        if geometry(cfg) in groups:
            continue
        entry, idx = entry_bytes(cfg["preset"]), []
        for r in cfg["regions"]:
            e, page = entry[r["name"]], r["page_bytes"]
            if page % e:
                raise ValueError("%s: %d-byte pages of %d-byte entries"
                                 % (r["name"], page, e))
            g = lay.add_group("mla", block_tokens=page // e)
            for layer in range(r["layers"]):
                v = lay.add_view(g, pool, layer, r["pool_pages"], page,
                                 r["base"] + layer * r["pool_pages"] * page)
                lay.add_field(v, "latent", e, [("token", page // e, e)])
            idx.append(g)
        groups[geometry(cfg)] = idx
    for n in bulks:
        g = lay.add_group("full", block_tokens=1)
        v = lay.add_view(g, bulk, 0, 1, n)
        c = math.gcd(n, 4096)
        lay.add_field(v, "k", c, [("token", 1, n), ("dim", n // c, c)])
        groups["bulk", n] = [g]
    return lay, groups


def _dmabuf(ptr, n):
    """(fd, offset of ptr): a dma-buf of CUDA memory [ptr, ptr + n) widened
    to pages (cuMemGetHandleForAddressRange), or (-1, 0)."""
    try:
        get = ctypes.CDLL("libcuda.so.1").cuMemGetHandleForAddressRange
    except (OSError, AttributeError):
        return -1, 0
    page = os.sysconf("SC_PAGE_SIZE")
    base = ptr - ptr % page
    size = -(-(ptr + n - base) // page) * page
    fd = ctypes.c_int(-1)
    rc = get(ctypes.byref(fd), ctypes.c_uint64(base), ctypes.c_size_t(size),
             ctypes.c_int(_DMABUF_FD), ctypes.c_ulonglong(0))
    return (fd.value, ptr - base) if rc == 0 else (-1, 0)


class KvpullBackend(KVBackend):
    """The suite's backend over :class:`kvpull.Agent` (see the module)."""
    name = "kvpull"
    maturity = "candidate"
    #: The agent class (the host tests give a stand-in).
    agent_class = kvpull.Agent

    def __init__(self, args, role, device):
        super().__init__(args, role, device)
        if "push" in args.ops.split():
            raise ValueError(PUSH)
        self.library_version = "%d.%d.%d" % kvpull.version()
        self._agent = self._thread = self._error = None
        self._stop, self._next, self._events = threading.Event(), 1, {}
        #: READs of each transfer's first DONE by (isl, page, request index)
        #: or ("bulk", bytes, 0); request indexes by (isl, page) and ids;
        #: requests by geometry and ids.
        self.reads, self._seen, self._reqs = {}, {}, {}

    # -- lifecycle ------------------------------------------------------
    def register(self, pool, bulk) -> None:
        import run_kv  # its grid: the geometries the run will pull
        cfgs = [cfg for cfg, _ in run_kv._grid(self.args)[0]]
        target = self.role == "target"
        self.layout, self._groups = build_layout(
            cfgs, pool.nbytes, bulk_sizes(self.args, bulk.nbytes),
            bulk.nbytes, TARGET_ENGINE if target else INITIATOR_ENGINE)
        self._ngroups = self.layout.info.ngroups
        self._addr = os.environ.get("KVPULL_ADDR") or \
            kv_workload.iface_ipv4(self.args.socket_ifname)
        dev = (self.args.kv_device or "").replace(
            "{gpu}", os.environ.get("LOCAL_RANK", "0")) or None
        batch = max(int(b) for b in self.args.batch_sizes.split())
        attrs = dict(max_inflight=2 * EXPECT_AHEAD, handshake_ms=CONNECT_MS) \
            if target else dict(max_inflight=max(64, 2 * batch),
                                stall_ms=STALL_MS, max_ids=max(
                                    r["pages_req"] for c in cfgs
                                    for r in c["regions"]))
        self._agent = self.agent_class(
            self.layout, "producer" if target else "consumer",
            device=dev, addr=self._addr, **attrs)
        cuda = getattr(getattr(pool, "_t", None), "is_cuda", False) or \
            self.args.fabric == "mnnvl"
        for region, mem in enumerate((pool, bulk)):
            fd, off = _dmabuf(mem.ptr, mem.nbytes) if cuda else (-1, 0)
            if fd < 0:  # host memory (or GPU memory with nvidia-peermem)
                self._agent.register(region, mem.ptr, mem.nbytes, keep=mem)
                continue
            try:
                self._agent.register_dmabuf(region, fd, off, mem.nbytes,
                                            mem.ptr, keep=mem)
            finally:
                os.close(fd)
        if target:
            self._port = int(os.environ.get("KVPULL_PORT", PORT))
            self._agent.listen(self._addr, self._port)

    def publish(self) -> dict:
        if self.role != "target":
            return {"engine": INITIATOR_ENGINE}
        return {"meta": self._agent.meta(), "addr": self._addr,
                "port": self._port}

    def connect(self, peer: dict) -> None:
        if self.role != "target":
            self._agent.connect([(peer["addr"], peer["port"], peer["meta"])],
                                timeout_ms=CONNECT_MS)
            return
        self._thread = threading.Thread(target=self._serve, daemon=True,
                                        name="kvpull-target")
        self._thread.start()

    def _serve(self):
        """Target: poll the producer; keep EXPECT_AHEAD ids expected."""
        a, nxt, held = self._agent, 1, 0
        try:
            while not self._stop.is_set():
                while held < EXPECT_AHEAD:
                    try:
                        a.expect(INITIATOR_ENGINE, nxt, timeout=3600)
                    except kvpull.Error as e:  # a full lease bucket: later
                        if e.code != -errno.ENOSPC:
                            raise
                        break
                    nxt, held = nxt + 1, held + 1
                for ev in a.poll(64, timeout=0.05):
                    if ev.type in (EventType.RELEASED, EventType.EXPIRED):
                        held -= 1
        except BaseException as e:  # noqa: BLE001 (reported at teardown)
            self._error = e

    def teardown(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        if self._error is not None:
            print("[kvpull] target thread failed: %r" % self._error,
                  file=sys.stderr, flush=True)
        if self._agent is not None and self.role != "target":
            s = self._agent.stats()
            print("[kvpull] stats reads=%d read_bytes=%d done_reads=%d" % (
                s.reads, s.read_bytes, sum(self.reads.values())), flush=True)
        if self._agent is not None:
            self._agent.close()

    # -- transfers (initiator) ----------------------------------------------
    def make_paged(self, cfg, op, local_tables, remote_tables):
        start = time.perf_counter()
        geo = geometry(cfg)
        groups = self._check(self._groups.get(geo), op, cfg["isl"])
        name = cfg["regions"][0]["name"]
        ck = (geo, local_tables[name].tobytes(), remote_tables[name].tobytes())
        req = self._reqs.get(ck)  # a request of an earlier burst: as it was
        if req is None:
            ids = [(_EMPTY, _EMPTY)] * self._ngroups
            for r, g in zip(cfg["regions"], groups):
                ids[g] = (local_tables[r["name"]].astype(np.uint32),
                          remote_tables[r["name"]].astype(np.uint32))
            req = self._reqs[ck] = kvpull.Request(ids)
        prep = time.perf_counter() - start
        seen = self._seen.setdefault((cfg["isl"], cfg["page_tokens"]), {})
        key = (cfg["isl"], cfg["page_tokens"], seen.setdefault(ck, len(seen)))
        return self._transfer(req, key, "isl=%d page=%d request=%d descs=%d"
                              % (key + (cfg["descs"],))) + (prep,)

    def make_bulk(self, nbytes, op):
        start = time.perf_counter()
        groups = self._groups.get(("bulk", nbytes)) if op == "pull" else None
        ids = [(_EMPTY, _EMPTY)] * self._ngroups
        ids[self._check(groups, op, nbytes)[0]] = (np.zeros(1, np.uint32),) * 2
        req = kvpull.Request(ids)
        prep = time.perf_counter() - start
        return self._transfer(req, ("bulk", nbytes, 0),
                              "bulk bytes=%d descs=1" % nbytes) + (prep,)

    @staticmethod
    def _check(groups, op, what):
        """groups, after refusing push and what the layout does not hold."""
        if op != "pull":
            raise ValueError(PUSH)
        if groups is None:
            raise ValueError("kvpull: %r is not a transfer of the run's grid "
                             "(the layout holds those only)" % (what,))
        return groups

    def _transfer(self, req, key, what):
        """(post, wait): each post pulls ``req`` under the next request id,
        each wait takes the oldest one posted to DONE."""
        pending = []

        def post():
            rid, self._next = self._next, self._next + 1
            end = time.monotonic() + WAIT_S
            while True:
                try:
                    self._agent.pull(rid, req)
                    break
                except kvpull.Error as e:  # -EBUSY: poll, then retry
                    if e.code != -errno.EBUSY or time.monotonic() > end:
                        raise
                self._drain(0.001)
            pending.append(rid)

        def wait():
            rid, end = pending.pop(0), time.monotonic() + WAIT_S
            while rid not in self._events:
                if time.monotonic() > end:
                    raise TimeoutError("kvpull: request %d not done in %d s"
                                       % (rid, WAIT_S))
                self._drain(0.01)  # sleeps until an event: rxe needs the CPU
            ev = self._events.pop(rid)
            if ev.type != EventType.DONE:
                raise RuntimeError("kvpull: request %d FAILED: %s (reason %s)"
                                   % (rid, ev.error, ev.reason.name))
            if key not in self.reads:
                self.reads[key] = ev.reads
                print("[kvpull] %s reads=%d bytes=%d" % (what, ev.reads,
                                                         ev.bytes), flush=True)
        return post, wait

    def _drain(self, timeout):
        for ev in self._agent.poll(64, timeout=timeout):
            if ev.type in (EventType.DONE, EventType.FAILED):
                self._events[ev.req_id] = ev
