# SPDX-License-Identifier: MIT
"""A stand-in for libkvpull's agent calls, for the host tests (no RDMA
device here).

FakeLib has every attribute of the real library; its kvp_agent_* members
are C function pointers (ctypes.CFUNCTYPE) built from the binding's own
prototypes (kvpull._lib._PROTOS), whose bodies are Python methods. A call
through one goes through the same ctypes argument conversion as a call into
libkvpull, and the Python body sees what C would: integers for pointers, the
bytes of the structs. The bodies record each call (FakeLib.calls) and what
they read through its pointers while the call runs (the id lists of a pull,
the peers of a connect, the attributes of an open), and return what a test
put in FakeLib.ret (default 0). Exceptions raised inside a body are kept in
FakeLib.errors (ctypes would only print them); the fixture checks it is
empty.
"""
import ctypes
import errno
from ctypes import c_void_p

import numpy as np

from kvpull import _lib, _structs as S

HANDLE = 0x4B5000      # the fake kvp_agent *: never dereferenced
UINT64_MAX = (1 << 64) - 1


def _str(p):
    return None if p is None else bytes(p)


class FakeLib:
    def __init__(self):
        self.calls = []          # (name, args as the body received them)
        self.errors = []
        self.ret = {}            # short name -> int, or callable(*args)
        self.seen = {}           # short name -> what the last call read
        self.events = []         # poll: a list of lists of EventStruct
        self.meta_blob = b"\x01blob\x02" * 40
        self.why = b""
        self.reason = 0
        self.plan_ptr = None
        self.layout_ptr = None   # engine_layout: a layout to clone
        self.fd_list = []
        self.wake = UINT64_MAX
        self.ready = 0
        self.ngroups = 1
        self.stats = {}
        self.exposition = {0: "", 1: "{}"}   # metrics: text, JSON
        self.info = {}
        self.next_engine = 5
        self._failed_mem = []    # what the FAILED ids of the last poll use
        self._pending_mem = []   # ... and of the events not polled yet
        self._keep = []
        for name, restype, *argtypes in _lib._PROTOS:
            if not name.startswith("kvp_agent_"):
                continue
            short = name[len("kvp_agent_"):]
            fp = ctypes.CFUNCTYPE(restype, *argtypes)(self._body(short))
            self._keep.append(fp)
            setattr(self, name, fp)

    def __getattr__(self, name):
        # everything else (layouts, plans, strerror) is the real library
        return getattr(_lib.lib, name)

    def names(self):
        return [c[0] for c in self.calls]

    def _body(self, short):
        impl = getattr(self, "c_" + short)

        def body(*args):
            self.calls.append((short, args))
            try:
                r = impl(*args)
                if short in self.ret:
                    v = self.ret[short]
                    r = v(*args) if callable(v) else v
                return r
            except BaseException as e:      # noqa: B902 (kept for the test)
                self.errors.append((short, repr(e)))
                return -errno.EFAULT
        return body

    # ---- the C calls ---------------------------------------------------

    def c_open(self, attr, out):
        a = attr[0]
        d = a.to_dict()
        d["device"] = _str(a.device)
        d["addr"] = _str(a.addr)
        d["secret"] = ctypes.string_at(a.secret, a.secret_len) \
            if a.secret else None
        info = S.LayoutInfo()
        _lib.lib.kvp_layout_get_info(a.layout, ctypes.byref(info))
        d["layout_info"] = info.to_dict()
        self.ngroups = info.ngroups
        self.seen["open"] = d
        if self.ret.get("open", 0) == 0:
            out[0] = HANDLE
        return 0

    def c_close(self, h):
        return None

    def c_register(self, h, region, addr, length):
        self.seen["register"] = (region, addr, length)
        return 0

    def c_register_dmabuf(self, h, region, fd, offset, length, addr):
        self.seen["register_dmabuf"] = (region, fd, offset, length, addr)
        return 0

    def c_listen(self, h, ip, port):
        self.seen["listen"] = (_str(ip), port)
        return 0

    def c_metrics(self, h, fmt, buf, cap):
        # kvp_agent_metrics(): self.exposition[fmt] as snprintf() writes
        data = self.exposition[fmt].encode()
        self.seen.setdefault("metrics", []).append((fmt, cap))
        if cap:
            n = min(len(data), cap - 1)
            ctypes.memmove(buf, data[:n] + b"\0", n + 1)
        return len(data)

    def c_get_meta(self, h, buf, cap, length):
        length[0] = len(self.meta_blob)
        if cap < len(self.meta_blob):
            return -errno.ENOSPC
        ctypes.memmove(buf, self.meta_blob, len(self.meta_blob))
        return 0

    def _peers(self, peers, n):
        out = []
        for i in range(n):
            p = peers[i]
            meta = ctypes.string_at(p.meta, p.meta_len) if p.meta else None
            out.append((_str(p.addr), p.port, meta, p.meta_len))
        return out

    def c_connect(self, h, peers, n, timeout_ms):
        self.seen["connect"] = (self._peers(peers, n), n, timeout_ms)
        return 0

    def c_last_error(self, h, buf, n):
        if buf and n:
            w = self.why[:n - 1] + b"\0"
            ctypes.memmove(buf, w, len(w))
        return self.reason

    def c_plan(self, h):
        return self.plan_ptr

    def _ids(self, addr):
        # what C reads: the structs at addr and the ids they point to
        out = []
        for g in range(self.ngroups):
            ent = S.Ids.from_address(addr + g * ctypes.sizeof(S.Ids))
            lp = ctypes.cast(ent.local, c_void_p).value or 0
            rp = ctypes.cast(ent.remote, c_void_p).value or 0
            out.append({
                "local_ptr": lp, "remote_ptr": rp, "nlocal": ent.nlocal,
                "nremote": ent.nremote, "tokens": ent.tokens,
                "local": np.ctypeslib.as_array(
                    (ctypes.c_uint32 * ent.nlocal).from_address(lp)).copy()
                if ent.nlocal else np.empty(0, np.uint32),
                "remote": np.ctypeslib.as_array(
                    (ctypes.c_uint32 * ent.nremote).from_address(rp)).copy()
                if ent.nremote else np.empty(0, np.uint32),
            })
        return {"addr": addr, "groups": out}

    def c_pull(self, h, req_id, ids):
        self.seen["pull"] = dict(self._ids(ids), req_id=req_id)
        return 0

    def c_add_engine(self, h, peers, n, timeout_ms, engine):
        self.seen["add_engine"] = (self._peers(peers, n), n, timeout_ms)
        engine[0] = self.next_engine
        return 0

    def c_reconnect_engine(self, h, engine, peers, n, timeout_ms):
        self.seen["reconnect_engine"] = (
            engine, self._peers(peers, n) if peers else None, n, timeout_ms)
        return 0

    def c_remove_engine(self, h, engine):
        return 0

    def c_pull_from(self, h, engine, req_id, ids):
        self.seen["pull_from"] = dict(self._ids(ids), engine=engine,
                                      req_id=req_id)
        return 0

    def c_pull_stream(self, h, engine, req_id, ids):
        self.seen["pull_stream"] = dict(self._ids(ids), engine=engine,
                                        req_id=req_id)
        return 0

    def c_engine_info(self, h, engine, info):
        i = info[0]
        for k, v in self.info.items():
            setattr(i, k, v)
        return 0

    def c_engine_layout(self, h, engine, rank, out):
        p = c_void_p()
        err = _lib.lib.kvp_layout_clone(self.layout_ptr, ctypes.byref(p))
        if err:
            return err
        out[0] = p.value
        return 0

    def c_expect(self, h, consumer_engine, req_id, deadline_ns):
        self.seen["expect"] = (consumer_engine, req_id, deadline_ns)
        return 0

    def c_publish(self, h, consumer_engine, req_id, p):
        self.seen["publish"] = (consumer_engine, req_id, p[0].to_dict())
        return 0

    def c_poll(self, h, ev, cap):
        # the previous poll's FAILED ids are gone: scribble over them
        for a in self._failed_mem:
            if isinstance(a, np.ndarray):
                a[:] = 0xDEAD
        self._failed_mem, self._pending_mem = self._pending_mem, []
        if not self.events:
            return 0
        batch = self.events.pop(0)
        n = min(len(batch), cap)
        for i in range(n):
            ctypes.memmove(ev + i * ctypes.sizeof(S.EventStruct),
                           ctypes.addressof(batch[i]),
                           ctypes.sizeof(S.EventStruct))
        if n < len(batch):
            self.events.insert(0, batch[n:])
        return n

    def failed_event(self, req_id, groups, engine=1, status=-errno.ECONNRESET,
                     reason=15):
        """A FAILED EventStruct whose ids point into arrays this fake owns
        until its next poll (then overwritten, as C's are reused)."""
        arrays = [np.array(g, np.uint32) for g in groups]
        ids = (S.Ids * len(arrays))()
        for i, a in enumerate(arrays):
            ids[i].local = ctypes.cast(a.ctypes.data,
                                       ctypes.POINTER(ctypes.c_uint32))
            ids[i].nlocal = len(a)
        self._pending_mem += arrays + [ids]
        ev = S.EventStruct(type=2, status=status, req_id=req_id,
                           ngroups=len(arrays), engine=engine, reason=reason)
        ev.ids = ctypes.cast(ids, ctypes.POINTER(S.Ids))
        return ev

    def c_fds(self, h, fds, cap):
        for i, fd in enumerate(self.fd_list[:cap]):
            fds[i] = fd
        return len(self.fd_list)

    def c_arm(self, h, wake):
        wake[0] = self.wake
        return self.ready

    def c_get_stats(self, h, st):
        s = st[0]
        for k, v in self.stats.items():
            setattr(s, k, v)
        return None
