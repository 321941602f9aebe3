# SPDX-License-Identifier: MIT
"""Agents (``kvp_agent``): the transport.  One agent is one engine rank's
endpoint on one RDMA device: a producer (prefill) rank registers its KV
cache and listens, a consumer (decode) rank registers its own, adds
producer engines and pulls requests' blocks into it with RDMA READs.

::

    with kvpull.Agent(layout, "consumer", max_ids=512) as agent:
        agent.register_all(regions)              # numpy arrays, any buffer
        engine = agent.add_engine([("10.0.0.1", 18515), ("10.0.0.1", 18516)])
        for ev in agent.poll(timeout=10): ...    # EventType.ENGINE_UP
        agent.pull_from(engine, req_id, [(local_ids, remote_ids, tokens)])
        for ev in agent.poll(timeout=10): ...    # EventType.DONE

Every call goes to the C library through :mod:`ctypes`, which releases the
GIL for the call's duration; an agent also serialises its calls with a lock
of its own (the C agent is not thread-safe), so threads may share one.
Block id arrays go to C without a copy (see :func:`pack_ids`); memory given
to :meth:`Agent.register` is kept referenced until :meth:`Agent.close`.
"""
import ctypes
import errno
import select
import struct
import threading
import time
import weakref
from ctypes import byref, c_char, c_int, c_size_t, c_uint32, c_uint64, c_void_p

import numpy as np

from . import _structs as S
from . import _torch
from ._buf import byte_view, check_u32, check_u64, u32_array
from ._handle import Handle
from ._lib import lib
from .enums import (AGENT_ATTR_LOG, AGENT_FDS, WHY_LEN, EventType,
                    LogKind, LogLevel, Reason, Role)
from .errors import Error
from .layout import Layout
from .plan import Plan, Request, _progress

__all__ = ["Agent", "Event", "agent_attr", "pack_ids", "ATTR_DEFAULTS",
           "WAKE_NONE"]

#: ``*wake_ns`` of ``kvp_agent_arm()`` when nothing is due (UINT64_MAX);
#: :meth:`Agent.arm` reports it as ``None``.
WAKE_NONE = (1 << 64) - 1
_U64_MAX = WAKE_NONE
_U32_MAX = (1 << 32) - 1

#: What each keyword argument of :class:`Agent` means when left at 0 (or
#: ``None``): the C defaults of ``struct kvp_agent_attr`` (the numbers are
#: checked against verbs/agent.c by the tests).
ATTR_DEFAULTS = {
    "device": "the device `addr` belongs to, else the first",
    "addr": "none (consumer: the route picks the source address)",
    "max_ids": 8192,
    "max_inflight": 64,
    "max_peers": "1024 consumer ranks (producer), 64 producer ranks "
                 "(consumer)",
    "sq_depth": 512,
    "max_sge": 16,
    "secret": "none",
    "max_per_source": "max_peers",
    "handshake_ms": 10000,
    "stall_ms": 10000,
    "rq_depth": "max_inflight, at least 128",
    "max_read": "the port's max_msg_sz, at most 2^31",
    "qps_per_peer": 2,
    "tos": "the device's default",
    "plan_flags": 0,
    "max_mr": "the device's max_mr_size",
    "stream_events": 0,
    "max_qps": "2 x max_peers (producer), max_peers x qps_per_peer "
               "(consumer)",
    "idle_ms": 300000,
    "srq": 0,
    "read_window": 16,
    "read_window_bytes": "16 packets of the port's active MTU",
    "log_fn": "none (no log records)",
    "log_level": "KVP_LOG_INFO",
    "comp_mask": 0,
}

_U32_ATTRS = frozenset((
    "comp_mask", "max_ids", "max_inflight", "max_peers", "sq_depth",
    "max_sge", "max_per_source", "handshake_ms", "stall_ms", "rq_depth",
    "max_read", "qps_per_peer", "tos", "plan_flags", "stream_events",
    "max_qps", "idle_ms", "srq", "read_window", "read_window_bytes"))

_IDS = struct.Struct("@QQIIQ")      # struct kvp_ids (checked by the tests)
assert _IDS.size == ctypes.sizeof(S.Ids)
_pack_into = _IDS.pack_into
_U32 = np.dtype(np.uint32)
_I32 = np.dtype(np.int32)
_ndarray = np.ndarray
_from_buffer = c_char.from_buffer
_addressof = ctypes.addressof


def _einval(func, why):
    return Error(-errno.EINVAL, func, why)


def _cstr(s, func, what):
    """``s`` (str or bytes) as NUL-free bytes for a ``const char *``."""
    if isinstance(s, str):
        s = s.encode()
    elif not isinstance(s, bytes):
        raise TypeError("%s: %s must be a str, not %s"
                        % (func, what, type(s).__name__))
    if b"\0" in s:
        raise ValueError("%s: NUL in %s: %r" % (func, what, s))
    return s


# ---- attributes -------------------------------------------------------------

#: ``kvp_log_fn``: ``void (*)(void *user, const struct kvp_log_record *)``.
_LOG_FN = ctypes.CFUNCTYPE(None, c_void_p, ctypes.POINTER(S.LogRecord))


def _log_callback(fn):
    """The C log callback (``kvp_log_fn``) that hands ``fn`` each record as
    a dict: ``kind`` (:class:`LogKind`), ``level`` (:class:`LogLevel`),
    ``time_ns``, ``status``, ``reason`` and ``peer_reason``
    (:class:`Reason`), ``rank`` (None when not known), ``req_id``,
    ``engine_id``, ``engine``, ``stream``, ``bytes``, ``reads``,
    ``elapsed_ns``, ``peer_addr`` and ``line`` (str)."""
    def enum(cls, v):
        try:
            return cls(v)
        except ValueError:
            return v

    def call(_user, rec):
        r = rec.contents
        fn({"kind": enum(LogKind, r.kind), "level": enum(LogLevel, r.level),
            "time_ns": r.time_ns, "status": r.status,
            "reason": _REASONS.get(r.reason, r.reason),
            "peer_reason": _REASONS.get(r.peer_reason, r.peer_reason),
            "rank": None if r.rank == 0xFFFFFFFF else r.rank,
            "req_id": r.req_id, "engine_id": r.engine_id,
            "engine": r.engine, "stream": bool(r.stream),
            "bytes": r.bytes, "reads": r.reads, "elapsed_ns": r.elapsed_ns,
            "peer_addr": (r.peer_addr or b"").decode("utf-8", "replace"),
            "line": (r.line or b"").decode("utf-8", "replace")})
    return _LOG_FN(call)



def agent_attr(layout, role="consumer", **attrs):
    """The ``struct kvp_agent_attr`` (an :class:`AgentAttr`) that
    :class:`Agent` hands to ``kvp_agent_open()`` for these arguments: the
    members named by ``attrs`` set, every other 0 or NULL (the C default,
    see :data:`ATTR_DEFAULTS`).

    ``role`` is a :class:`Role` or its name; ``device`` and ``addr`` are
    strings; ``secret`` is bytes-like (or str), its length becoming
    ``secret_len``; ``log_fn`` a callable that gets each log record as a
    dict (the C callback's records: refusals with their reason and the
    peer's address, evictions, each request's start, completion or
    failure...; docs/metrics.md), at most ``log_level`` (a
    :class:`LogLevel` or its name), which sets ``comp_mask``'s
    ``KVP_AGENT_ATTR_LOG``: it runs inside the agent's calls (poll, pull)
    on their thread, with the agent's lock held, so it must not call the
    agent; an exception it raises goes to ``sys.unraisablehook``, never
    into C; the others are ints (``stream_events`` also a bool).
    :class:`TypeError` for an unknown member, :class:`ValueError` for an
    unknown role, :class:`Error` -EINVAL for a number the C member cannot
    hold (ctypes would truncate it).  The struct keeps what its pointers
    point to referenced (``_keep``)."""
    f = "kvp_agent_open"
    if not isinstance(layout, Layout):
        raise TypeError("%s: layout must be a kvpull.Layout, not %s"
                        % (f, type(layout).__name__))
    a = S.AgentAttr()
    a.role = Role.parse(role)
    a.layout = layout.handle
    keep = [layout]
    for k, v in attrs.items():
        if k in _U32_ATTRS:
            setattr(a, k, check_u32(v, f, k))
        elif k == "max_mr":
            a.max_mr = check_u64(v, f, k)
        elif k in ("device", "addr"):
            if v is not None:
                b = _cstr(v, f, k)
                keep.append(b)
                setattr(a, k, b)
        elif k == "secret":
            if v is not None:
                raw = v.encode() if isinstance(v, str) else \
                    bytes(memoryview(v).cast("B"))
                buf = ctypes.create_string_buffer(raw, len(raw))
                keep.append(buf)
                a.secret = _addressof(buf)
                a.secret_len = check_u32(len(raw), f, "secret length")
        elif k == "log_fn":
            if v is not None:
                if not callable(v):
                    raise TypeError("%s: log_fn must be callable, not %s"
                                    % (f, type(v).__name__))
                cb = _log_callback(v)
                keep.append(cb)
                a.log_fn = ctypes.cast(cb, c_void_p).value
        elif k == "log_level":
            a.log_level = int(LogLevel.parse(v)) if v else 0
        else:
            raise TypeError("%s: struct kvp_agent_attr has no member %r"
                            % (f, k))
    if a.log_fn:
        a.comp_mask |= AGENT_ATTR_LOG
    a._keep = keep
    return a


# ---- block ids --------------------------------------------------------------


def _id_array(x, func, g, side):
    # The hot path: a 1-D contiguous native uint32/int32 numpy array is used
    # as it is; anything else goes through u32_array (converted once).
    if type(x) is _ndarray and (x.dtype is _U32 or x.dtype is _I32) and \
            x.ndim == 1 and x.flags.c_contiguous:
        return x
    return u32_array(x, func, "group %d %s ids" % (g, side))


def _groups_error(func, n, ngroups):
    return _einval(func, "the request has %d group%s, the layout %d"
                   % (n, "" if n == 1 else "s", ngroups))


def _pack_ids(ids, ngroups, buf, addr, func, used=None):
    """Write the ``struct kvp_ids`` of ``ids`` into ``buf`` (at ``addr``);
    return the address to hand to C and what must stay referenced until
    the call returns (the arrays converted here; the caller's own arrays
    are referenced by ``ids``).  The pull calls' hot path: no string is
    formatted, no list built, no array copied, unless something is wrong
    or must be converted."""
    t = type(ids)
    if t is not list and t is not tuple:
        if isinstance(ids, Request):
            if len(ids) != ngroups:
                raise _groups_error(func, len(ids), ngroups)
            return ids.address, ids
        if not isinstance(ids, (list, tuple)):
            raise TypeError("%s: ids must be a kvpull.Request or a list "
                            "with one (local, remote[, tokens]) entry per "
                            "group, not %s" % (func, type(ids).__name__))
    n = len(ids)
    if n != ngroups:
        raise _groups_error(func, n, ngroups)
    keep = None
    off = 0
    for g in range(n):
        spec = ids[g]
        if isinstance(spec, dict):
            local, remote = spec["local"], spec["remote"]
            tokens = spec.get("tokens", 0)
        else:
            k = len(spec)
            if k == 3:
                local, remote, tokens = spec
            elif k == 2:
                local, remote = spec
                tokens = 0
            else:
                raise TypeError("%s: group %d: want (local, remote[, "
                                "tokens]), got %d items" % (func, g, k))
        if type(local) is not _ndarray or (local.dtype is not _U32 and
                                           local.dtype is not _I32) or \
                local.ndim != 1 or not local.flags.c_contiguous:
            local = _id_array(local, func, g, "local")
            keep = [local] if keep is None else keep + [local]
        if type(remote) is not _ndarray or (remote.dtype is not _U32 and
                                            remote.dtype is not _I32) or \
                remote.ndim != 1 or not remote.flags.c_contiguous:
            remote = _id_array(remote, func, g, "remote")
            keep = [remote] if keep is None else keep + [remote]
        nl = local.size
        nr = remote.size
        if nl > _U32_MAX or nr > _U32_MAX:
            raise _einval(func, "group %d: more than 2^32 ids" % g)
        if type(tokens) is not int or not 0 <= tokens <= _U64_MAX:
            tokens = check_u64(tokens, func, "group %d tokens" % g)
        try:
            pl = _addressof(_from_buffer(local))
        except (TypeError, ValueError):  # read-only or empty
            pl = local.ctypes.data
        try:
            pr = _addressof(_from_buffer(remote))
        except (TypeError, ValueError):
            pr = remote.ctypes.data
        _pack_into(buf, off, pl, pr, nl, nr, tokens)
        off += 32
        if used is not None:
            used += (local, remote)
    return addr, keep


def pack_ids(ids, ngroups):
    """The ``struct kvp_ids`` array the pull calls hand to C for ``ids``
    (a :class:`Request` is used as it is; else one ``(local, remote[,
    tokens])`` entry, :class:`GroupIds` or dict per group), for a layout of
    ``ngroups`` groups: returns ``(structs, keep)``, a ctypes array of
    :class:`Ids` and the id arrays its pointers point into, local and remote
    per group (keep them while the structs are used).

    A 1-D contiguous uint32 or int32 numpy array (or ``array.array('I')``,
    any buffer of such items) is pointed to where it is: no copy, no Python
    loop.  Other integer arrays are converted once (one numpy copy), their
    values checked (:class:`Error` -ERANGE past a uint32).  :class:`Error`
    -EINVAL for another number of groups than ``ngroups`` (C would read past
    the array)."""
    f = "kvp_agent_pull"
    ngroups = check_u32(ngroups, f, "ngroups")
    arr = (S.Ids * max(ngroups, 1))()
    used = []
    addr, _conv = _pack_ids(ids, ngroups, arr, _addressof(arr), f, used)
    if addr != _addressof(arr):         # a Request: its own structs
        ctypes.memmove(arr, addr, ngroups * _IDS.size)
        used = [a for g in ids for a in g[:2]]
    return arr, used


# ---- events -----------------------------------------------------------------

_EVENT = struct.Struct("@IiQQIIPIIQQIII")   # struct kvp_event (tests check)
_EV_SIZE = ctypes.sizeof(S.EventStruct)
_unpack_event = _EVENT.unpack_from
_TYPES = {int(m): m for m in EventType}
_REASONS = {int(m): m for m in Reason}
_FAILED = int(EventType.FAILED)
_ENGINE_EVENTS = (int(EventType.ENGINE_UP), int(EventType.ENGINE_DOWN))


def _copy_ids(ptr, n):
    """Copies of the local id lists of ``n`` ``struct kvp_ids`` at
    ``ptr``."""
    out = []
    for g in range(n):
        ent = S.Ids.from_address(ptr + g * _IDS.size)
        k = ent.nlocal
        a = np.empty(k, np.uint32)
        src = ctypes.cast(ent.local, c_void_p).value
        if k and src:
            ctypes.memmove(a.ctypes.data, src, 4 * k)
        out.append(a)
    return tuple(out)


class Event:
    """One event of :meth:`Agent.poll` (``struct kvp_event``), plain data:
    it stays valid after later polls and after the agent is closed.

    ``type`` (an :class:`EventType`), ``status`` (0 or a negative errno:
    FAILED, DISCONNECTED, ENGINE_DOWN), ``req_id`` (DONE, FAILED, RELEASED,
    EXPIRED), ``engine_id`` (RELEASED: the consumer engine; DISCONNECTED,
    ENGINE_UP, ENGINE_DOWN: the producer engine, 0 when not yet known),
    ``rank`` (DISCONNECTED: the peer rank), ``engine`` (consumer: the
    engine handle), ``reads``, ``bytes``, ``elapsed_ns`` (DONE), ``reason``
    and ``peer_reason`` (:class:`Reason`), ``layers`` (ARRIVED: layers
    ``[0, layers)`` landed) and ``ids`` (FAILED: per group, a numpy uint32
    copy of the request's local block ids, which may hold partial data;
    ``None`` otherwise -- the C array is only valid until the next poll, so
    the binding copies it during the poll that reports it)."""

    __slots__ = ("type", "status", "req_id", "engine_id", "rank", "engine",
                 "reads", "bytes", "elapsed_ns", "reason", "peer_reason",
                 "layers", "ids")

    def __init__(self, type, status=0, req_id=0, engine_id=0, rank=0,
                 engine=0, reads=0, bytes=0, elapsed_ns=0, reason=0,
                 peer_reason=0, layers=0, ids=None):
        """An event with these members (``type`` an :class:`EventType`, an
        int or a name; ``ids`` a sequence of id arrays or ``None``)."""
        self.type = _TYPES.get(type, type) if isinstance(type, int) else \
            EventType.parse(type)
        self.status = int(status)
        self.req_id = int(req_id)
        self.engine_id = int(engine_id)
        self.rank = int(rank)
        self.engine = int(engine)
        self.reads = int(reads)
        self.bytes = int(bytes)
        self.elapsed_ns = int(elapsed_ns)
        self.reason = _REASONS.get(int(reason), int(reason))
        self.peer_reason = _REASONS.get(int(peer_reason), int(peer_reason))
        self.layers = int(layers)
        self.ids = None if ids is None else tuple(
            np.array(x, dtype=np.uint32) for x in ids)

    @classmethod
    def from_struct(cls, ev):
        """The event of a ``struct kvp_event`` (an :class:`EventStruct`, or
        any buffer of its bytes), as :meth:`Agent.poll` makes it: enums
        for ``type`` and the reasons, and for FAILED copies of the local
        id lists its ``ids`` points to (which must still be valid)."""
        buf = bytes(ev)
        if len(buf) < _EVENT.size:
            raise ValueError("Event.from_struct: %d bytes, struct kvp_event "
                             "has %d" % (len(buf), _EV_SIZE))
        return _event_at(buf, 0)

    @property
    def ok(self):
        """True when ``status`` is 0."""
        return self.status == 0

    @property
    def error(self):
        """The :class:`Error` of a non-zero ``status`` (with ``reason``),
        or ``None``."""
        if not self.status:
            return None
        what = "%s" % getattr(self.type, "name", self.type)
        if self.type in (EventType.DONE, EventType.FAILED,
                         EventType.RELEASED, EventType.EXPIRED):
            what += " request %d" % self.req_id
        if self.engine:
            what += " engine %d" % self.engine
        return Error(self.status, "kvp_agent_poll", what, self.reason)

    def to_dict(self):
        """The members as a dict (``type`` and reasons as their names,
        ``ids`` as lists)."""
        return {
            "type": str(self.type), "status": self.status,
            "req_id": self.req_id, "engine_id": self.engine_id,
            "rank": self.rank, "engine": self.engine, "reads": self.reads,
            "bytes": self.bytes, "elapsed_ns": self.elapsed_ns,
            "reason": str(self.reason), "peer_reason": str(self.peer_reason),
            "layers": self.layers,
            "ids": None if self.ids is None else
            [a.tolist() for a in self.ids],
        }

    def __eq__(self, other):
        """Member by member (``ids`` by value)."""
        if not isinstance(other, Event):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None

    def __repr__(self):
        t = self.type
        name = getattr(t, "name", str(t))
        parts = [name]
        if t in (EventType.DONE, EventType.FAILED, EventType.RELEASED,
                 EventType.EXPIRED, EventType.ARRIVED):
            parts.append("req %d" % self.req_id)
        if self.engine:
            parts.append("engine %d" % self.engine)
        if self.engine_id:
            parts.append("engine_id %d" % self.engine_id)
        if t == EventType.DISCONNECTED:
            parts.append("rank %d" % self.rank)
        if t == EventType.DONE:
            parts.append("%d reads, %d bytes, %.3f ms" % (
                self.reads, self.bytes, self.elapsed_ns / 1e6))
        if t == EventType.ARRIVED:
            parts.append("layers %d" % self.layers)
        if self.status:
            parts.append("status %s" % errno.errorcode.get(
                -self.status, self.status))
        if self.reason:
            parts.append("reason %s" % getattr(self.reason, "name",
                                               self.reason))
        if self.peer_reason:
            parts.append("peer_reason %s" % getattr(
                self.peer_reason, "name", self.peer_reason))
        if self.ids is not None:
            parts.append("ids %s" % [len(a) for a in self.ids])
        return "<kvpull.Event %s>" % ", ".join(parts)


def _event_at(buf, off):
    (t, st, rid, eid, rank, ng, ids, eng, reads, nb, el, rs, prs,
     layers) = _unpack_event(buf, off)
    e = Event.__new__(Event)
    e.type = _TYPES.get(t, t)
    e.status = st
    e.req_id = rid
    e.engine_id = eid
    e.rank = rank
    e.engine = eng
    e.reads = reads
    e.bytes = nb
    e.elapsed_ns = el
    e.reason = _REASONS.get(rs, rs)
    e.peer_reason = _REASONS.get(prs, prs)
    e.layers = layers
    e.ids = _copy_ids(ids, ng) if t == _FAILED and ids else None
    return e


# ---- memory -----------------------------------------------------------------


def _memory(mem, length, keep, writable, func):
    """``(addr, nbytes, refs)`` of memory to register: a buffer (whose
    export ``refs`` holds, so that it cannot be resized or closed) or an
    integer address with a length."""
    if isinstance(mem, (int, np.integer)) and not isinstance(mem, bool):
        if length is None:
            raise TypeError("%s: an integer address needs a length" % func)
        return (check_u64(mem, func, "addr"),
                check_u64(length, func, "length"), (keep,))
    if _torch.is_tensor(mem):
        addr, size, _item, _shape, _strides = _torch.memory(mem, func)
        refs = (mem, keep)
    elif isinstance(mem, np.ndarray):
        if not (mem.flags.c_contiguous or mem.flags.f_contiguous):
            raise ValueError("%s: the array is not contiguous" % func)
        if writable and not mem.flags.writeable:
            raise ValueError("%s: the array is read-only (a consumer's "
                             "memory is written by RDMA READs)" % func)
        addr, size, refs = mem.ctypes.data, mem.nbytes, (mem, keep)
    else:
        try:
            mv = memoryview(mem)
        except TypeError:
            raise TypeError("%s: memory must be a buffer (numpy array, "
                            "bytearray, mmap...) or an integer address, not "
                            "%s" % (func, type(mem).__name__)) from None
        if not mv.c_contiguous:
            raise ValueError("%s: the buffer is not contiguous" % func)
        if writable and mv.readonly:
            raise ValueError("%s: the buffer is read-only (a consumer's "
                             "memory is written by RDMA READs)" % func)
        mv = mv.cast("B")
        addr = np.frombuffer(mv, np.uint8).ctypes.data if mv.nbytes else 0
        size, refs = mv.nbytes, (mv, mem, keep)
    n = size if length is None else check_u64(length, func, "length")
    if n > size:
        raise _einval(func, "length %d exceeds the buffer's %d bytes"
                      % (n, size))
    return addr, n, refs


# ---- peers ------------------------------------------------------------------


def _peers(peers, func):
    """A ``struct kvp_peer`` array for ``peers``, its length, and what its
    pointers point into."""
    if isinstance(peers, (str, bytes)):
        raise TypeError("%s: peers must be a list of (addr, port[, meta])"
                        % func)
    peers = list(peers)
    n = len(peers)
    arr = (S.Peer * max(n, 1))()
    keep = [arr]
    for i, p in enumerate(peers):
        if isinstance(p, S.Peer):
            arr[i] = p
            continue
        if isinstance(p, dict):
            addr, port, meta = p["addr"], p["port"], p.get("meta")
        else:
            p = tuple(p)
            if len(p) not in (2, 3):
                raise TypeError("%s: peer %d: want (addr, port[, meta]), "
                                "got %d items" % (func, i, len(p)))
            addr, port = p[0], p[1]
            meta = p[2] if len(p) == 3 else None
        b = _cstr(addr, func, "peer %d addr" % i)
        keep.append(b)
        arr[i].addr = b
        port = int(port)
        if not 0 <= port <= 0xFFFF:
            raise _einval(func, "peer %d: port %d is not a uint16"
                          % (i, port))
        arr[i].port = port
        if meta is not None:
            m = byte_view(meta)
            keep.append(m)
            arr[i].meta = m.ctypes.data
            arr[i].meta_len = check_u32(m.size, func,
                                        "peer %d meta length" % i)
    return arr, n, keep


def _timeout_ms(t, func, signed=False):
    t = int(t)
    lo, hi = (-(1 << 31), (1 << 31) - 1) if signed else (0, _U32_MAX)
    if not lo <= t <= hi:
        raise _einval(func, "timeout_ms %d is not a%s" % (
            t, " 32-bit int" if signed else " uint32"))
    return t


def _check_engine(engine, func):
    if type(engine) is not int or not 0 <= engine <= _U32_MAX:
        engine = check_u32(engine, func, "engine")
    return engine


def _check_req(req_id, func):
    if type(req_id) is not int or not 0 <= req_id <= _U64_MAX:
        req_id = check_u64(req_id, func, "req_id")
    return req_id


# ---- agents -----------------------------------------------------------------


class Agent(Handle):
    """One engine rank's RDMA endpoint (an owned ``kvp_agent *``), a
    producer, a consumer or both (``kvp_agent_open()``).

    ``Agent(layout, role, **attrs)`` opens it on an RDMA device for this
    rank's :class:`Layout` (copied), ``role`` a :class:`Role` or
    ``"producer"``, ``"consumer"``, ``"both"``.  The keyword arguments are
    the members of ``struct kvp_agent_attr``; each left out (or 0, None)
    takes the C default (:data:`ATTR_DEFAULTS`): ``device``, ``addr``,
    ``max_ids``, ``max_inflight``, ``max_peers``, ``sq_depth``,
    ``max_sge``, ``secret`` (bytes), ``max_per_source``, ``handshake_ms``,
    ``stall_ms``, ``rq_depth``, ``max_read``, ``qps_per_peer``, ``tos``,
    ``plan_flags``, ``max_mr``, ``stream_events``, ``max_qps``,
    ``idle_ms``, ``srq``, ``read_window``, ``read_window_bytes``,
    ``comp_mask``, ``log_fn`` and ``log_level`` (:func:`agent_attr`).

    :class:`Error` -ENODEV without an RDMA device (or none of that name or
    address), -EINVAL for a bad attribute (as the C call refuses it), and
    the binding's refusals before the call (:func:`agent_attr`).

    Producer: :meth:`register` every region, :meth:`listen`,
    :meth:`expect` each request, :meth:`poll` (RELEASED or EXPIRED; the
    handshakes run inside poll, so keep polling), :meth:`publish` for
    streamed pulls.  Consumer: :meth:`register` every region,
    :meth:`add_engine` (or :meth:`connect`), :meth:`pull_from` (or
    :meth:`pull`, :meth:`pull_stream`), :meth:`poll` (ENGINE_UP, DONE,
    FAILED...).  To sleep instead of spinning: :meth:`poll` with a
    ``timeout``, :meth:`poll_async`, or :meth:`fileno` and :meth:`arm` in
    your own selector loop.

    :meth:`close` (or leaving a ``with`` block, or garbage collection)
    closes the C agent, then drops the references to the memory it
    borrowed.  Calls on one agent are serialised by a lock of the agent's;
    each releases the GIL while in C.
    """

    __slots__ = ("_handle", "_lib", "_lock", "role", "layout", "_ngroups",
                 "_regions", "_ev", "_ev_addr", "_ev_buf", "_ev_cap", "_ids",
                 "_ids_addr", "_ep", "_borrowed", "_why", "_log_cb",
                 "__weakref__")

    _what = "agent"

    def __init__(self, layout, role="consumer", **attrs):
        """Open an agent (see the class)."""
        self._handle = None
        self._lock = threading.Lock()
        self._ep = None
        self._regions = {}
        self._borrowed = []
        self.layout = None
        self._lib = lib
        attr = agent_attr(layout, role, **attrs)
        # the log callback lives as long as the C agent that calls it
        self._log_cb = attr._keep
        #: The agent's :class:`Role`.
        self.role = Role(attr.role)
        clone = layout.clone()
        out = c_void_p()
        try:
            err = self._lib.kvp_agent_open(byref(attr), byref(out))
            if err:
                raise Error(err, "kvp_agent_open")
        except BaseException:
            clone.close()
            raise
        self._handle = out.value
        #: The agent's copy of its rank's :class:`Layout` (closed with it).
        self.layout = clone
        self._ngroups = clone.info.ngroups
        self._ids = ctypes.create_string_buffer(max(self._ngroups, 1) *
                                                _IDS.size)
        self._ids_addr = _addressof(self._ids)
        self._events(64)
        self._why = ctypes.create_string_buffer(2 * WHY_LEN)

    @classmethod
    def open(cls, layout, role="consumer", **attrs):
        """``Agent(layout, role, **attrs)``: open an agent."""
        return cls(layout, role, **attrs)

    def _events(self, cap):
        self._ev = (S.EventStruct * cap)()
        self._ev_addr = _addressof(self._ev)
        self._ev_buf = memoryview(self._ev).cast("B")
        self._ev_cap = cap

    # ---- lifetime ----------------------------------------------------

    def _live(self):
        # Called with the lock held: the handle, or ValueError once closed.
        h = self._handle
        if not h:
            raise ValueError("the agent is closed")
        return h

    def close(self):
        """Close the C agent (``kvp_agent_close()``: a consumer first sends
        the notifications it owes, for at most a second; pulls and expected
        requests in flight are dropped without events), then release the
        memory it borrowed and its layout.  Borrowed :class:`Plan` objects
        (:meth:`plan`) are closed first.  Idempotent."""
        lock = getattr(self, "_lock", None)
        if lock is None:                 # __init__ did not get that far
            return
        self._drop_plans(None, everything=True)
        with lock:
            h, self._handle = self._handle, None
            ep, self._ep = self._ep, None
            if ep is not None:
                ep.close()
            if h:
                self._lib.kvp_agent_close(h)
            self._regions = {}
            self._log_cb = None
        lay, self.layout = self.layout, None
        if lay is not None:
            lay.close()

    def _free(self, h):
        """Unused: :meth:`close` does the work under the agent's lock."""

    def __repr__(self):
        if self.closed:
            return "<kvpull.Agent closed>"
        i = self.layout.info
        return ("<kvpull.Agent %s, engine %d TP %d rank %d, %d of %d "
                "regions registered>" % (
                    self.role, i.engine_id, i.tp_size, i.tp_rank,
                    len(self._regions), i.nregions))

    # ---- memory ------------------------------------------------------

    def register(self, region, mem, length=None, *, keep=None):
        """Register layout region ``region``'s memory
        (``kvp_agent_register()``), once per region, before
        :meth:`listen` or the first engine.

        ``mem`` is a buffer -- a contiguous numpy array, a bytearray, an
        mmap, anything with the buffer protocol -- registered whole or its
        first ``length`` bytes; a ``torch.Tensor`` whose elements fill one
        span of memory in some order of its dims (vLLM's per-layer KV
        tensors in HND order are such transposed views), its shape,
        strides and element size checked against the layout's region
        (:class:`Error` -EINVAL naming the mismatch: a view of part of a
        tensor, a dim of another size or stride, another dtype size); or
        an integer address (a GPU tensor's
        ``data_ptr()``) with ``length``, and ``keep`` any object to keep
        referenced with it.  The agent keeps the buffer (and ``keep``)
        referenced, and its export held (a bytearray cannot be resized nor
        an mmap closed meanwhile), until :meth:`close`.  A consumer's
        memory, and a both-roles agent's, must be writable (RDMA writes
        into it): a read-only buffer is refused with :class:`ValueError`.

        :class:`Error` -EINVAL for a ``length`` past the buffer (before the
        call), and as the C call refuses: a bad region index, a length
        below the region's size, a region already registered; -EBUSY after
        listen or the first engine; -ENOMEM, -EFAULT from the device."""
        f = "kvp_agent_register"
        region = check_u32(region, f, "region")
        if _torch.is_tensor(mem):
            _a, _n, item, shape, strides = _torch.memory(mem, f)
            if region < self.layout.info.nregions:
                _torch.check_region(self.layout, region, item, shape,
                                    strides, f)
        addr, n, refs = _memory(mem, length, keep,
                                self.role != Role.PRODUCER, f)
        with self._lock:
            h = self._live()
            err = self._lib.kvp_agent_register(h, region, addr, n)
            if err:
                raise Error(err, f)
            self._regions[region] = (addr, n, refs)

    def register_all(self, mems):
        """:meth:`register` region ``i`` with ``mems[i]`` for every ``i``
        (buffers, or ``(addr, length)`` pairs)."""
        for i, m in enumerate(mems):
            if isinstance(m, tuple):
                self.register(i, *m)
            else:
                self.register(i, m)

    def register_dmabuf(self, region, fd, offset, length, addr=None, *,
                        keep=None):
        """Register region ``region`` from a dma-buf: ``length`` bytes at
        ``offset`` of the dma-buf ``fd`` (``kvp_agent_register_dmabuf()``;
        the fd may be closed on return).  ``addr``, optional, is the
        memory's address in this process (an int, or a buffer of at least
        ``length`` bytes): the region is known by it, and where the
        provider cannot register dma-bufs (soft-RoCE) ``addr`` is
        registered instead.  Returns ``True`` when it fell back to
        ``addr``, ``False`` when the dma-buf was registered.  The buffer
        and ``keep`` stay referenced until :meth:`close`.

        :class:`Error` -ENOTSUP when dma-bufs cannot be registered and
        ``addr`` is None; -EINVAL (a negative fd, and as :meth:`register`);
        -EBUSY; another errno from the registration."""
        f = "kvp_agent_register_dmabuf"
        region = check_u32(region, f, "region")
        fd = int(fd)
        if not -(1 << 31) <= fd < 1 << 31:
            raise _einval(f, "fd %d is not an int" % fd)
        offset = check_u64(offset, f, "offset")
        length = check_u64(length, f, "length")
        if addr is None:
            a, refs = None, (keep,)
        else:
            a, _n, refs = _memory(addr, length, keep,
                                  self.role != Role.PRODUCER, f)
        with self._lock:
            h = self._live()
            r = self._lib.kvp_agent_register_dmabuf(h, region, fd, offset,
                                                    length, a)
            if r < 0:
                raise Error(r, f)
            self._regions[region] = (a or 0, length, refs)
        return r == 1

    @property
    def registered(self):
        """The regions registered so far: ``{region: (addr, length)}``."""
        return {r: (a, n) for r, (a, n, _k) in sorted(self._regions.items())}

    def meta(self):
        """This rank's metadata blob, ``bytes`` (``kvp_agent_get_meta()``):
        what the built-in handshake sends, for a consumer to carry
        (:meth:`add_engine` peers' ``meta``).  :class:`Error` -ENXIO until
        every region is registered; -EMSGSIZE above 16 MiB."""
        f = "kvp_agent_get_meta"
        need, n = c_size_t(), c_size_t()
        with self._lock:
            h = self._live()
            err = self._lib.kvp_agent_get_meta(h, None, 0, byref(need))
            if err not in (0, -errno.ENOSPC):
                raise Error(err, f)
            buf = ctypes.create_string_buffer(max(need.value, 1))
            err = self._lib.kvp_agent_get_meta(h, buf, need.value, byref(n))
            if err:
                raise Error(err, f)
        return buf.raw[:n.value]

    # ---- producer ----------------------------------------------------

    def listen(self, ip, port):
        """Producer: listen for consumer ranks on numeric IP address ``ip``
        (``None``: every address of the agent's device) and ``port``
        (``kvp_agent_listen()``); the handshakes then run inside
        :meth:`poll`.  :class:`Error` -EINVAL (a port past 65535, before the
        call; not a producer, a bad address); -EBUSY when already
        listening; -ENXIO when a region is not registered; -EADDRINUSE."""
        f = "kvp_agent_listen"
        b = None if ip is None else _cstr(ip, f, "ip")
        port = int(port)
        if not 0 <= port <= 0xFFFF:
            raise _einval(f, "port %d is not a uint16" % port)
        with self._lock:
            h = self._live()
            err = self._lib.kvp_agent_listen(h, b, port)
            if err:
                raise Error(err, f)

    def expect(self, consumer_engine, req_id, deadline_ns=None, *,
               timeout=None):
        """Producer: consumer engine ``consumer_engine`` (its layout's
        engine id) will pull request ``req_id``; its blocks must stay
        untouched until RELEASED or EXPIRED is reported
        (``kvp_agent_expect()``).  The deadline is ``deadline_ns``
        (CLOCK_MONOTONIC, as :func:`time.monotonic_ns`) or ``timeout``
        seconds from now; give one.  :class:`Error` -EINVAL (not a
        producer), -EEXIST (already expected), -EALREADY (reported within
        30 s), -EBUSY (max_inflight requests)."""
        f = "kvp_agent_expect"
        if (deadline_ns is None) == (timeout is None):
            raise TypeError("%s: give deadline_ns or timeout" % f)
        if timeout is not None:
            deadline_ns = time.monotonic_ns() + max(int(timeout * 1e9), 0)
        ce = check_u64(consumer_engine, f, "consumer_engine")
        rid = _check_req(req_id, f)
        dl = check_u64(deadline_ns, f, "deadline_ns")
        with self._lock:
            h = self._live()
            err = self._lib.kvp_agent_expect(h, ce, rid, dl)
            if err:
                raise Error(err, f)

    def publish(self, consumer_engine, req_id, progress):
        """Producer: publish how much of an expected request is written
        (``kvp_agent_publish()``), for consumers pulling it with
        :meth:`pull_stream`.  ``progress`` is a :class:`Progress` or a
        ``(tokens_all, tokens_cur[, layers_cur])`` tuple (tokens
        ``[0, tokens_all)`` in every layer, ``[tokens_all, tokens_cur)`` in
        layers ``[0, layers_cur)``; ``TOKENS_END``: to the end).
        :class:`Error` -EINVAL, -ENOENT (not expected), -ERANGE (less than
        a previous publish)."""
        f = "kvp_agent_publish"
        if progress is None:
            raise TypeError("%s: progress is None" % f)
        p = _progress(progress, f)
        ce = check_u64(consumer_engine, f, "consumer_engine")
        rid = _check_req(req_id, f)
        with self._lock:
            h = self._live()
            err = self._lib.kvp_agent_publish(h, ce, rid, byref(p))
            if err:
                raise Error(err, f)

    # ---- consumer: engines -------------------------------------------

    def _error(self, h, err, func):
        """The :class:`Error` of a call that records its refusal
        (``kvp_agent_last_error()``); called with the lock held."""
        reason = self._lib.kvp_agent_last_error(h, self._why, len(self._why))
        why = self._why.value.decode("utf-8", "replace") or None
        return Error(err, func, why, reason)

    def connect(self, peers, timeout_ms=10000):
        """Consumer: connect to the producer engine whose rank ``i`` listens
        at ``peers[i]`` (``kvp_agent_connect()``), blocking up to
        ``timeout_ms`` (the GIL is released meanwhile; the producers must be
        polled by someone else).  Each peer is ``(addr, port)`` or ``(addr,
        port, meta)`` (``meta``: that rank's carried blob, :meth:`meta`), a
        dict with those keys, or a :class:`Peer`.  The engine becomes the
        one of :meth:`pull` and :meth:`plan`.

        :class:`Error` with ``reason`` and ``why`` from
        ``kvp_agent_last_error()``: -EPROTO (metadata that does not match),
        -EPERM (secrets), -ETIMEDOUT, -ECONNREFUSED, -EISCONN, -ENXIO...;
        -EINVAL before the call for a port or timeout C cannot hold."""
        f = "kvp_agent_connect"
        arr, n, keep = _peers(peers, f)
        t = _timeout_ms(timeout_ms, f, signed=True)
        with self._lock:
            h = self._live()
            err = self._lib.kvp_agent_connect(h, arr, n, t)
            if err:
                raise self._error(h, err, f)
        del keep

    def add_engine(self, peers, timeout_ms=10000):
        """Consumer: add the producer engine whose rank ``i`` listens at
        ``peers[i]`` (as for :meth:`connect`) and start its handshake
        without blocking (``kvp_agent_add_engine()``); return its handle.
        :meth:`poll` reports ENGINE_UP (or ENGINE_DOWN and why) within
        ``timeout_ms``.  :class:`Error` (with reason) -EINVAL, -ENXIO,
        -EPROTO (a carried blob that fails its checks), -ENOSPC."""
        f = "kvp_agent_add_engine"
        arr, n, keep = _peers(peers, f)
        t = _timeout_ms(timeout_ms, f)
        out = c_uint32()
        with self._lock:
            h = self._live()
            err = self._lib.kvp_agent_add_engine(h, arr, n, t, byref(out))
            if err:
                raise self._error(h, err, f)
        del keep
        return out.value

    def reconnect_engine(self, engine, peers=None, timeout_ms=10000):
        """Consumer: re-handshake a DOWN engine, with new ``peers`` or
        (``None``) the addresses it had (``kvp_agent_reconnect_engine()``).
        Plans borrowed from it (:meth:`plan`) are closed.  :class:`Error`
        (with reason) -ENOENT, -EBUSY (up or connecting), and
        :meth:`add_engine`'s."""
        f = "kvp_agent_reconnect_engine"
        engine = _check_engine(engine, f)
        if peers is None:
            arr, n, keep = None, 0, None
        else:
            arr, n, keep = _peers(peers, f)
        t = _timeout_ms(timeout_ms, f)
        self._drop_plans(engine)
        with self._lock:
            h = self._live()
            err = self._lib.kvp_agent_reconnect_engine(h, engine, arr, n, t)
            if err:
                raise self._error(h, err, f)
        del keep

    def remove_engine(self, engine):
        """Consumer: remove an engine (``kvp_agent_remove_engine()``): its
        requests not yet DONE are reported FAILED with -ECANCELED, and no
        event of it follows but those.  Plans borrowed from it are closed.
        :class:`Error` -ENOENT for an unknown handle."""
        f = "kvp_agent_remove_engine"
        engine = _check_engine(engine, f)
        self._drop_plans(engine)
        with self._lock:
            h = self._live()
            err = self._lib.kvp_agent_remove_engine(h, engine)
            if err:
                raise self._error(h, err, f)

    def engine_info(self, engine):
        """Engine ``engine``'s :class:`EngineInfo`
        (``kvp_agent_engine_info()``: state, counters, why it is down).
        :class:`Error` -ENOENT for an unknown handle."""
        f = "kvp_agent_engine_info"
        engine = _check_engine(engine, f)
        info = S.EngineInfo()
        with self._lock:
            h = self._live()
            err = self._lib.kvp_agent_engine_info(h, engine, byref(info))
            if err:
                raise Error(err, f)
        return info

    def engine_layout(self, engine=0, rank=0):
        """Producer rank ``rank``'s :class:`Layout` as engine ``engine``
        described it at its last handshake, with its regions' addresses and
        keys (``kvp_agent_engine_layout()``; engine 0: :meth:`connect`'s).
        :class:`Error` -ENOENT, -ERANGE (rank), -EAGAIN (not up)."""
        f = "kvp_agent_engine_layout"
        engine = _check_engine(engine, f)
        rank = check_u32(rank, f, "rank")
        out = c_void_p()
        with self._lock:
            h = self._live()
            err = self._lib.kvp_agent_engine_layout(h, engine, rank,
                                                    byref(out))
            if err:
                raise Error(err, f)
        return Layout(out.value)

    def plan(self, engine=None):
        """The :class:`Plan` this consumer pulls from engine ``engine``
        with (``None``: :meth:`connect`'s, ``kvp_agent_plan()``; else
        :attr:`EngineInfo.plan`), or ``None`` before the engine is first
        up.  The plan is the agent's, borrowed: the binding closes the
        :class:`Plan` object when the engine is removed, reconnected, goes
        up or down (an ENGINE_UP or ENGINE_DOWN event), a pull starts its
        reconnect (-EAGAIN), or the agent closes; take what you need
        (:meth:`Plan.to_dict`, emissions) before.  Its ``local`` layout is
        the agent's, its ``remote`` producer rank 0's (for dumps)."""
        with self._lock:
            h = self._live()
            if engine is None:
                p = self._lib.kvp_agent_plan(h)
            else:
                f = "kvp_agent_engine_info"
                info = S.EngineInfo()
                err = self._lib.kvp_agent_engine_info(
                    h, _check_engine(engine, f), byref(info))
                if err:
                    raise Error(err, f)
                p = info.plan
        if not p:
            return None
        local = self.layout.clone()
        try:
            remote = self.engine_layout(0 if engine is None else engine, 0)
        except Error:
            remote = None
        plan = Plan(p, local, remote, owned=False, owner=self)
        self._borrowed = [(e, r) for e, r in self._borrowed
                          if r() is not None]
        self._borrowed.append((engine, weakref.ref(plan)))
        return plan

    def _drop_plans(self, engine, everything=False):
        """Close the borrowed plans of ``engine`` (and :meth:`connect`'s,
        whose handle the binding does not know)."""
        keep = []
        for e, ref in self._borrowed:
            p = ref()
            if p is None:
                continue
            if everything or e is None or e == engine:
                p.close()
            else:
                keep.append((e, ref))
        self._borrowed = keep

    # ---- consumer: pulls ---------------------------------------------

    def pull(self, req_id, ids, engine=None):
        """Consumer: start pulling request ``req_id`` from :meth:`connect`'s
        engine (``kvp_agent_pull()``), or from ``engine``
        (:meth:`pull_from`).

        ``ids`` holds one entry per group of the layout: ``(local, remote)``
        or ``(local, remote, tokens)`` (a :class:`GroupIds` or a dict with
        those keys), or is a prepared :class:`Request`.  Id lists that are
        1-D contiguous uint32/int32 numpy arrays (or uint32 buffers) go to C
        where they are, no copy and no Python loop (:func:`pack_ids`); the
        C call copies them, so they may be reused on return.

        Exactly one DONE or FAILED event follows.  :class:`Error` with the
        library's ``reason`` and ``why`` (``kvp_agent_last_error()``):
        -EINVAL (a list longer than max_ids, lists that do not fit a
        group), -ERANGE (an id out of range), -EALREADY, -EBUSY (poll, then
        retry), -ENOTCONN; and before the call -EINVAL for another number of
        groups than the layout's, a ``req_id`` past 64 bits, -ERANGE for an
        id past 32 bits in a converted list."""
        if engine is not None:
            return self.pull_from(engine, req_id, ids)
        # The same steps as _pull_engine(), written out: the hot path
        # spares itself a Python call (about 0.1 us of its 2 us budget).
        f = "kvp_agent_pull"
        if type(req_id) is not int or not 0 <= req_id <= _U64_MAX:
            req_id = check_u64(req_id, f, "req_id")
        with self._lock:
            h = self._handle
            if not h:
                raise ValueError("the agent is closed")
            addr, keep = _pack_ids(ids, self._ngroups, self._ids,
                                   self._ids_addr, f)
            err = self._lib.kvp_agent_pull(h, req_id, addr)
            if err:
                raise self._error(h, err, f)

    def pull_from(self, engine, req_id, ids):
        """Consumer: start pulling request ``req_id`` from engine
        ``engine`` (a handle of :meth:`add_engine`;
        ``kvp_agent_pull_from()``).  ``ids`` and errors as :meth:`pull`,
        and -ENOENT for an unknown handle, -EAGAIN while the engine is
        connecting or when it is down (a reconnect starts: retry after
        ENGINE_UP), -ENOSPC when it is down and the agent's ``max_qps``
        has no room, not even by closing an idle engine (one closed that
        way goes ENGINE_DOWN with :attr:`Reason.EVICTED`)."""
        self._pull_engine(self._lib.kvp_agent_pull_from,
                          "kvp_agent_pull_from", engine, req_id, ids)

    def _pull_engine(self, fn, f, engine, req_id, ids):
        """pull_from and pull_stream: C call fn (named f) on engine."""
        if type(engine) is not int or not 0 <= engine <= _U32_MAX:
            engine = check_u32(engine, f, "engine")
        if type(req_id) is not int or not 0 <= req_id <= _U64_MAX:
            req_id = check_u64(req_id, f, "req_id")
        with self._lock:
            h = self._handle
            if not h:
                raise ValueError("the agent is closed")
            addr, keep = _pack_ids(ids, self._ngroups, self._ids,
                                   self._ids_addr, f)
            err = fn(h, engine, req_id, addr)
            if not err:
                return
            exc = self._error(h, err, f)
        if err == -errno.EAGAIN:
            self._drop_plans(engine)
        raise exc

    def pull_stream(self, engine, req_id, ids):
        """Consumer: :meth:`pull_from` while the producer is still writing
        the request (``kvp_agent_pull_stream()``): the READs of each part
        go out as the producer ranks :meth:`publish` it; with the agent's
        ``stream_events``, ARRIVED events report the leading layers that
        landed.  Same arguments and errors as :meth:`pull_from`."""
        self._pull_engine(self._lib.kvp_agent_pull_stream,
                          "kvp_agent_pull_stream", engine, req_id, ids)

    # ---- events --------------------------------------------------------

    def poll(self, max_events=16, timeout=0):
        """Drive the agent and return its events, a list of :class:`Event`
        (``kvp_agent_poll()``: completions, queued work, connections,
        deadlines).

        ``timeout`` 0 (the default) polls once without blocking; a number
        of seconds, or ``None`` (no bound), sleeps on the agent's file
        descriptors (:meth:`arm`, then :meth:`fileno`, the GIL released)
        until at least one event comes or the time is up (then ``[]``).
        At most ``max_events`` events are returned; the rest wait for the
        next call.  :class:`Error` -EIO when polling a completion queue
        failed (close the agent)."""
        evs = self._poll(max_events)
        if evs or timeout == 0:
            return evs
        if timeout is None:
            deadline = None
        else:
            if timeout < 0:
                raise ValueError("poll: negative timeout")
            deadline = time.monotonic_ns() + int(timeout * 1e9)
        ep = self._epoll()
        while True:
            ready, wake = self.arm()
            if not ready:
                end = deadline if wake is None else \
                    wake if deadline is None else min(wake, deadline)
                if end is None:
                    ep.poll(-1)
                else:
                    left = end - time.monotonic_ns()
                    if left > 0:
                        ep.poll(left / 1e9)
            evs = self._poll(max_events)
            if evs or (deadline is not None and
                       time.monotonic_ns() >= deadline):
                return evs

    def _poll(self, max_events):
        f = "kvp_agent_poll"
        if type(max_events) is not int or not 0 <= max_events < 1 << 31:
            max_events = int(max_events)
            if not 0 <= max_events < 1 << 31:
                raise _einval(f, "max_events %d is not a positive int"
                              % max_events)
        if max_events > self._ev_cap:
            with self._lock:
                self._events(max_events)
        with self._lock:
            h = self._handle
            if not h:
                raise ValueError("the agent is closed")
            n = self._lib.kvp_agent_poll(h, self._ev_addr, max_events)
            if n <= 0:
                if n < 0:
                    raise Error(n, f)
                return []
            buf = self._ev_buf
            # FAILED ids are copied here, before the next poll frees them
            evs = [_event_at(buf, i * _EV_SIZE) for i in range(n)]
        if self._borrowed:
            for e in evs:
                if e.type in _ENGINE_EVENTS:
                    self._drop_plans(e.engine)
        return evs

    async def poll_async(self, max_events=16, timeout=None):
        """:meth:`poll` for asyncio: wait (without blocking the event loop)
        until at least one event comes, or ``timeout`` seconds passed
        (``None``: no bound; then ``[]``), and return the events.  Waits
        with ``loop.add_reader(agent.fileno())`` and the agent's own
        timers (:meth:`arm`)."""
        import asyncio
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else \
            time.monotonic_ns() + int(timeout * 1e9)
        fd = self.fileno()
        while True:
            evs = self._poll(max_events)
            if evs:
                return evs
            now = time.monotonic_ns()
            if deadline is not None and now >= deadline:
                return evs
            ready, wake = self.arm()
            if ready:
                continue
            end = deadline if wake is None else \
                wake if deadline is None else min(wake, deadline)
            fut = loop.create_future()

            def _readable(fut=fut):
                if not fut.done():
                    fut.set_result(None)

            loop.add_reader(fd, _readable)
            try:
                if end is None:
                    await fut
                else:
                    await asyncio.wait_for(fut, max(end - now, 0) / 1e9)
            except asyncio.TimeoutError:
                pass
            finally:
                loop.remove_reader(fd)

    def fds(self):
        """The agent's file descriptors (``kvp_agent_fds()``): the
        completion channel's, the rdma_cm channel's and the device's
        asynchronous events', all non-blocking and owned by the agent (do
        not read or close them).  :meth:`fileno` is one descriptor for
        all three."""
        f = "kvp_agent_fds"
        arr = (c_int * AGENT_FDS)()
        with self._lock:
            h = self._live()
            n = self._lib.kvp_agent_fds(h, arr, AGENT_FDS)
            if n < 0:
                raise Error(n, f)
            if n > AGENT_FDS:
                arr = (c_int * n)()
                n = self._lib.kvp_agent_fds(h, arr, n)
                if n < 0:
                    raise Error(n, f)
        return list(arr[:n])

    def _epoll(self):
        ep = self._ep
        if ep is None:
            fds = self.fds()
            ep = select.epoll()
            try:
                for fd in fds:
                    ep.register(fd, select.EPOLLIN)
            except BaseException:
                ep.close()
                raise
            with self._lock:
                self._live()
                if self._ep is None:
                    self._ep = ep
                else:                   # another thread made one meanwhile
                    ep.close()
                    ep = self._ep
        return ep

    def fileno(self):
        """One file descriptor that is readable when any of :meth:`fds` is:
        an epoll descriptor the agent owns (closed by :meth:`close`), for
        ``selectors``, ``select`` and asyncio's ``loop.add_reader()``.  To
        sleep on it: ``ready, wake_ns = agent.arm()``; if not ``ready``,
        wait until it is readable or ``wake_ns``; then :meth:`poll`."""
        return self._epoll().fileno()

    def arm(self):
        """Ask for a wakeup on the next completion and learn when the agent
        next needs a :meth:`poll` anyway (``kvp_agent_arm()``): returns
        ``(ready, wake_ns)``, ``ready`` True when events or completions are
        already waiting (poll now instead of sleeping), ``wake_ns`` the
        CLOCK_MONOTONIC time (:func:`time.monotonic_ns`) of its next
        deadline or timer, or ``None``.  Makes system calls: not for
        busy-polling loops."""
        f = "kvp_agent_arm"
        w = c_uint64()
        with self._lock:
            h = self._live()
            r = self._lib.kvp_agent_arm(h, byref(w))
        if r < 0:
            raise Error(r, f)
        return r > 0, (None if w.value == WAKE_NONE else w.value)

    # ---- facts ---------------------------------------------------------

    def stats(self):
        """The agent's counters since open, an :class:`AgentStats`
        (``kvp_agent_get_stats()``); ``mem_bytes``, ``peers`` (peer ranks
        connected) and ``qps`` (queue pairs open) are its state now."""
        st = S.AgentStats()
        with self._lock:
            h = self._live()
            self._lib.kvp_agent_get_stats(h, byref(st))
        return st

    def metrics(self, format="dict"):
        """The agent's metrics (``kvp_agent_metrics()``; docs/metrics.md
        lists every family).  ``"dict"`` (the default): ``{"counters":
        {name: [{"labels": {...}, "value": n}, ...]}, "gauges": {...},
        "histograms": {name: [{"labels": {...}, "count": n, "sum":
        seconds, "buckets": [[le_seconds, cumulative_count], ...]}]}}``;
        ``"text"``: the Prometheus text format (what ``/metrics`` serves:
        :func:`kvpull.metrics.serve`); ``"json"``: the JSON, unparsed."""
        from . import metrics as M
        from .enums import METRICS_JSON, METRICS_TEXT
        if format not in ("dict", "text", "json"):
            raise ValueError("metrics: format %r (want dict, text or "
                             "json)" % (format,))
        fmt = METRICS_TEXT if format == "text" else METRICS_JSON
        with self._lock:
            h = self._live()
            text = M._expose(self._lib, h, fmt)
        return M.json.loads(text) if format == "dict" else text

    def last_error(self):
        """``(reason, why)``: why the agent's most recent connect,
        add/reconnect/remove engine or pull call failed
        (``kvp_agent_last_error()``), a :class:`Reason` (``NONE`` when it
        succeeded) and the library's line (``""``).  The :class:`Error`
        those calls raise already carries both."""
        with self._lock:
            h = self._live()
            r = self._lib.kvp_agent_last_error(h, self._why, len(self._why))
            why = self._why.value.decode("utf-8", "replace")
        return _REASONS.get(r, r), why

    @property
    def ngroups(self):
        """The groups of the agent's layout (a pull's ids have one entry
        per group)."""
        return self._ngroups

