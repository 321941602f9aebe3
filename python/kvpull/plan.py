# SPDX-License-Identifier: MIT
"""Plans (``kvp_plan``): compile, inspect, dump, and emit READs into numpy
arrays."""
import ctypes
import errno
import json
import struct
from builtins import range as builtins_range
from ctypes import byref, c_uint32, c_uint64, c_void_p

import numpy as np

from . import _structs as S
from ._buf import check_u32, check_u64, u32_array, writable_records
from ._handle import Handle
from ._lib import lib
from .enums import (GroupKind, PLAN_ATTR_FLAGS, PLAN_ATTR_MAX_LEN,
                    PLAN_NO_COALESCE, TOKENS_END)
from .errors import Error, check
from .layout import MSG_LEN, Layout, _enum

__all__ = [
    "Plan", "Request", "GroupIds", "Emission", "EmitBuffers", "Window",
    "EmitSink", "RegionMap", "progress_ranges", "notify_expected",
    "emit_range",
]

_IDS = struct.Struct("@QQIIQ")      # struct kvp_ids, checked by the tests
assert _IDS.size == ctypes.sizeof(S.Ids)
_U32 = np.dtype(np.uint32)


def _einval(func, why):
    return Error(-errno.EINVAL, func, why)


# ---- requests ---------------------------------------------------------------


class GroupIds(tuple):
    """One group's ids of a request: ``(local, remote, tokens)``, the id
    arrays as given to the C calls (uint32 or int32 numpy arrays)."""
    __slots__ = ()

    def __new__(cls, local, remote, tokens=0):
        return tuple.__new__(cls, (local, remote, tokens))

    local = property(lambda self: self[0], doc="The consumer's block ids.")
    remote = property(lambda self: self[1], doc="The producer's block ids.")
    tokens = property(lambda self: self[2],
                      doc="The sequence length (0: the remote blocks are "
                          "full).")


class Request:
    """The block ids of one request, one entry per group of the plan, in
    the C layout (an array of ``struct kvp_ids``) that every emission call
    reads.

    Each entry is ``(local, remote)`` or ``(local, remote, tokens)`` (or a
    :class:`GroupIds`, or a dict with those keys): ``local`` the consumer's
    blocks to fill, ``remote`` the producer's blocks holding the sequence
    from its first token, ``tokens`` the sequence length (0: the remote
    blocks are full; ignored for state groups).  Id lists are any buffer or
    sequence of integers; numpy uint32/int32 arrays and ``array.array('I')``
    / ``('i')`` are used in place (no copy: the request keeps a reference
    and the C calls read that memory, so do not change them while a call
    runs).  Other integer arrays are converted once, here.

    Build a request once and pass it to several calls (:meth:`Plan.emit`,
    the windows); the plan methods also accept the list itself.
    """
    __slots__ = ("_ids", "_addr", "_groups", "max_ids")

    def __init__(self, groups):
        """Prepare the ids of ``groups`` (one entry per group)."""
        groups = list(groups)
        n = len(groups)
        ids = ctypes.create_string_buffer(max(n, 1) * _IDS.size)
        keep = []
        max_ids = 0
        pack = _IDS.pack_into
        for g, spec in enumerate(groups):
            if isinstance(spec, dict):
                local, remote = spec["local"], spec["remote"]
                tokens = spec.get("tokens", 0)
            elif len(spec) == 3:
                local, remote, tokens = spec
            else:
                local, remote = spec
                tokens = 0
            la = u32_array(local, "Request", "group %d local ids" % g)
            ra = u32_array(remote, "Request", "group %d remote ids" % g)
            if la.size > 0xFFFFFFFF or ra.size > 0xFFFFFFFF:
                raise _einval("Request", "group %d: more than 2^32 ids" % g)
            tokens = check_u64(tokens, "Request", "group %d tokens" % g)
            pack(ids, g * _IDS.size, la.ctypes.data, ra.ctypes.data,
                 la.size, ra.size, tokens)
            keep.append(GroupIds(la, ra, tokens))
            max_ids = max(max_ids, la.size, ra.size)
        self._ids = ids
        self._addr = ctypes.addressof(ids)
        self._groups = tuple(keep)
        #: The longest id list of any group (what emit_bound() takes).
        self.max_ids = max_ids

    def __len__(self):
        return len(self._groups)

    def __getitem__(self, g):
        """Group ``g``'s :class:`GroupIds`."""
        return self._groups[g]

    def __iter__(self):
        return iter(self._groups)

    @property
    def ngroups(self):
        """The number of groups."""
        return len(self._groups)

    @property
    def address(self):
        """The address of the ``struct kvp_ids`` array (valid while this
        object lives)."""
        return self._addr

    def __repr__(self):
        return "<kvpull.Request %s>" % ", ".join(
            "g%d: %d local, %d remote%s" % (
                g, x.local.size, x.remote.size,
                ", %d tokens" % x.tokens if x.tokens else "")
            for g, x in enumerate(self._groups))


# ---- emission results -------------------------------------------------------


class Emission:
    """The READs of one request: ``wrs`` (a numpy array of
    :data:`WR_DTYPE`, one record per READ), ``sges`` (of
    :data:`SGE_DTYPE`: ``wrs[i]`` scatters into ``sges[sge_first :
    sge_first + nsge]``) and ``src_end`` (uint32, per source index: one past
    its last WR).  Unpacks as ``wrs, sges = plan.emit(req)``.

    The arrays are views of the buffers the C call wrote: with
    ``out=EmitBuffers`` the next emission into the same buffers overwrites
    them (``.copy()`` to keep them).
    """
    __slots__ = ("wrs", "sges", "src_end", "_src_rank")

    def __init__(self, wrs, sges, src_end, src_rank):
        """Wrap emitted arrays (made by the emission calls);
        ``src_rank`` maps source indices to producer ranks."""
        self.wrs = wrs
        self.sges = sges
        self.src_end = src_end
        self._src_rank = src_rank

    def __iter__(self):
        yield self.wrs
        yield self.sges

    def __len__(self):
        return len(self.wrs)

    @property
    def nbytes(self):
        """The bytes the READs move (the sum of ``wrs['len']``)."""
        return int(self.wrs["len"].sum(dtype=np.uint64))

    def __repr__(self):
        return "<kvpull.Emission %d READs, %d SGEs, %d bytes>" % (
            len(self.wrs), len(self.sges), self.nbytes)

    def to_list(self):
        """The READs as plain data, in the shape of ``request.wrs`` of
        ``kvpull-plan --json``: per WR ``group``, ``src``, ``src_rank``,
        ``remote_region``, ``remote_offset``, ``len`` and ``sges`` (each
        ``region``, ``offset``, ``len``)."""
        out = []
        sges = self.sges.tolist()
        for off, ln, region, src, first, nsge, group in self.wrs.tolist():
            out.append({
                "group": group, "src": src,
                "src_rank": self._src_rank[src], "remote_region": region,
                "remote_offset": off, "len": ln,
                "sges": [{"region": r, "offset": o, "len": n}
                         for o, n, r in sges[first:first + nsge]],
            })
        return out

    def dump(self):
        """The READs table of ``kvpull-plan``'s summary, one line per READ:
        ``index  gGROUP src RANK  rREGION+0xOFFSET  LEN  lREGION+0xOFF/LEN
        ...``."""
        lines = []
        sges = self.sges.tolist()
        for i, (off, ln, region, src, first, nsge, group) in enumerate(
                self.wrs.tolist()):
            s = " ".join("l%d+0x%x/%d" % (r, o, n)
                         for o, n, r in sges[first:first + nsge])
            lines.append("    %5d  g%d src %d  r%d+0x%x  %d  %s" % (
                i, group, self._src_rank[src], region, off, ln, s))
        return "\n".join(lines) + ("\n" if lines else "")


class Window(tuple):
    """One window of READs (:meth:`Plan.emit_window`): ``(wrs, sges,
    bytes)``, views of the arrays written and the bytes the READs move."""
    __slots__ = ()

    def __new__(cls, wrs, sges, nbytes):
        return tuple.__new__(cls, (wrs, sges, nbytes))

    wrs = property(lambda self: self[0], doc="The READs (WR_DTYPE).")
    sges = property(lambda self: self[1], doc="Their SGEs (SGE_DTYPE).")
    bytes = property(lambda self: self[2], doc="Bytes the READs move.")


def _nsge(wr, n):
    """SGEs used by the first n WRs of wr (they are laid out in order)."""
    if not n:
        return 0
    last = wr[n - 1]
    return int(last["sge_first"]) + int(last["nsge"])


class EmitBuffers:
    """Reusable output arrays for :meth:`Plan.emit`: ``wr`` (WR_DTYPE),
    ``sge`` (SGE_DTYPE) and ``src_end`` (uint32, one per source), sized by
    :meth:`Plan.emit_bound` for requests of at most ``max_ids`` ids per
    list.  Emitting into them allocates nothing."""
    __slots__ = ("wr", "sge", "src_end", "max_ids", "_wr_addr", "_sge_addr",
                 "_end_addr")

    def __init__(self, plan, max_ids):
        """Allocate the arrays for ``plan`` and ``max_ids`` ids per list."""
        maxw, maxs = plan.emit_bound(max_ids)
        self.max_ids = max_ids
        self.wr = np.empty(maxw, S.WR_DTYPE)
        self.sge = np.empty(maxs, S.SGE_DTYPE)
        self.src_end = np.zeros(max(plan.info.nsrc, 1), np.uint32)
        self._wr_addr = self.wr.ctypes.data
        self._sge_addr = self.sge.ctypes.data
        self._end_addr = self.src_end.ctypes.data

    def __repr__(self):
        return "<kvpull.EmitBuffers %d WRs, %d SGEs, max_ids %d>" % (
            len(self.wr), len(self.sge), self.max_ids)


# ---- sinks ------------------------------------------------------------------


class RegionMap(tuple):
    """A region's map for :class:`EmitSink`: ``(addr, keys, shift)``: its
    byte ``off`` is at ``addr + off`` under key ``keys[off >> shift]``.
    ``keys`` is one int (then ``shift`` is 63) or a uint32 buffer."""
    __slots__ = ()

    def __new__(cls, addr, keys, shift=63):
        return tuple.__new__(cls, (addr, keys, shift))

    addr = property(lambda self: self[0], doc="The region's address.")
    keys = property(lambda self: self[1], doc="Its key(s).")
    shift = property(lambda self: self[2], doc="log2 of a key's span.")


class EmitSink:
    """Where :meth:`Plan.emit_window_into` writes: a transport's own work
    request records (``struct ibv_send_wr`` or any records with such
    fields) and scatter entries (:data:`EMIT_SGE_DTYPE`, ``struct
    ibv_sge``'s layout), with addresses and keys resolved through region
    maps (``struct kvp_emit_sink``).

    ``wr`` is a writable buffer of records ``wr_stride`` bytes apart
    (a numpy array, a bytearray); the ``off_*`` arguments are byte offsets
    in a record (``off_wr_id``: u64, ``off_sg_list``: a pointer to the
    record's first scatter entry, ``off_num_sge``: int, ``off_remote_addr``:
    u64, ``off_rkey``: u32); ``wr_id`` is stored in every record.  ``sge``
    is a numpy array of EMIT_SGE_DTYPE.  ``local`` and ``remote`` list one
    :class:`RegionMap` (or ``(addr, keys[, shift])`` tuple) per region of
    the plan's local layout and of the producer rank read.
    """

    def __init__(self, wr, wr_stride, *, off_wr_id, off_sg_list, off_num_sge,
                 off_remote_addr, off_rkey, sge, local, remote, wr_id=0,
                 comp_mask=0):
        """Describe the records, scatter entries and maps (see the class)."""
        f = "EmitSink"
        self.wr = wr
        view = memoryview(wr)
        if view.readonly:
            raise ValueError("EmitSink: the WR records are read-only")
        if not view.c_contiguous:
            raise ValueError("EmitSink: the WR records must be contiguous")
        self.sge = writable_records(sge, S.EMIT_SGE_DTYPE, f, "sge")
        self._wr_buf = (ctypes.c_char * view.nbytes).from_buffer(view) \
            if view.nbytes else None
        self.wr_stride = check_u32(wr_stride, f, "wr_stride")
        self.wr_cap = view.nbytes // self.wr_stride if self.wr_stride else 0
        self.sge_cap = len(self.sge)
        self._keep = []
        self.local_maps = self._maps(local, "local")
        self.remote_maps = self._maps(remote, "remote")
        c = S.EmitSink()
        c.wr = ctypes.addressof(self._wr_buf) if self._wr_buf is not None \
            else None
        c.wr_stride = self.wr_stride
        c.comp_mask = check_u32(comp_mask, f, "comp_mask")
        c.off_wr_id = check_u32(off_wr_id, f, "off_wr_id")
        c.off_sg_list = check_u32(off_sg_list, f, "off_sg_list")
        c.off_num_sge = check_u32(off_num_sge, f, "off_num_sge")
        c.off_remote_addr = check_u32(off_remote_addr, f, "off_remote_addr")
        c.off_rkey = check_u32(off_rkey, f, "off_rkey")
        c.wr_id = check_u64(wr_id, f, "wr_id")
        c.sge = ctypes.cast(self.sge.ctypes.data, ctypes.POINTER(S.EmitSge)) \
            if self.sge_cap else None
        c.local = ctypes.cast(self.local_maps, ctypes.POINTER(S.EmitMap))
        c.remote = ctypes.cast(self.remote_maps, ctypes.POINTER(S.EmitMap))
        #: The ``struct kvp_emit_sink`` handed to the C calls.
        self.c = c

    def _maps(self, maps, what):
        f = "EmitSink"
        maps = list(maps)
        arr = (S.EmitMap * max(len(maps), 1))()
        self._keep.append(arr)
        self._nkeys = getattr(self, "_nkeys", {})
        nkeys = []
        for i, m in enumerate(maps):
            if not isinstance(m, RegionMap):
                m = RegionMap(*m)
            addr, keys, shift = m
            if isinstance(keys, (int, np.integer)):
                keys = np.array([check_u32(keys, f, "%s key" % what)],
                                np.uint32)
            else:
                keys = u32_array(keys, f, "%s region %d keys" % (what, i))
            self._keep.append(keys)
            arr[i].addr = check_u64(addr, f, "%s region %d addr" % (what, i))
            arr[i].key = ctypes.cast(keys.ctypes.data,
                                     ctypes.POINTER(c_uint32)) \
                if keys.size else None
            arr[i].shift = check_u32(shift, f, "%s region %d shift"
                                     % (what, i))
            nkeys.append((keys.size, arr[i].shift))
        self._nkeys[what] = nkeys
        return arr

    def records(self, n):
        """The first ``n`` records as bytes views (numpy uint8, shape (n,
        wr_stride))."""
        b = np.frombuffer(self._wr_buf, np.uint8) if self._wr_buf is not None \
            else np.empty(0, np.uint8)
        return b[:n * self.wr_stride].reshape(n, self.wr_stride)


# ---- ranges -----------------------------------------------------------------


def emit_range(layer0, layer1, tok0=0, tok1=TOKENS_END):
    """An :class:`EmitRange`: model layers ``[layer0, layer1)``, tokens
    ``(tok0, tok1]`` (``tok1`` ``TOKENS_END``: to the end, which also holds
    the state groups)."""
    f = "emit_range"
    return S.EmitRange(layer0=check_u32(layer0, f, "layer0"),
                       layer1=check_u32(layer1, f, "layer1"),
                       tok0=check_u64(tok0, f, "tok0"),
                       tok1=check_u64(tok1, f, "tok1"))


def _progress(p, f):
    if p is None:
        return S.Progress()
    if isinstance(p, S.Progress):
        return p
    p = tuple(p)
    tokens_all, tokens_cur = p[0], p[1]
    layers_cur = p[2] if len(p) > 2 else 0
    return S.Progress(tokens_all=check_u64(tokens_all, f, "tokens_all"),
                      tokens_cur=check_u64(tokens_cur, f, "tokens_cur"),
                      layers_cur=check_u32(layers_cur, f, "layers_cur"))


def progress_ranges(prev, next):
    """What became readable between two progresses of a producer rank
    (``kvp_progress_ranges()``): a list of at most 3 :class:`EmitRange`.

    ``prev`` and ``next`` are :class:`Progress` structs, ``(tokens_all,
    tokens_cur[, layers_cur])`` tuples, or ``None`` (nothing written).
    :class:`Error` -EINVAL for a malformed progress, -ERANGE when ``next``
    covers less than ``prev`` somewhere."""
    f = "kvp_progress_ranges"
    a, b = _progress(prev, f), _progress(next, f)
    out = (S.EmitRange * 3)()
    n = check(lib.kvp_progress_ranges(byref(a), byref(b), out), f)
    return [out[i].copy() for i in range(n)]


def notify_expected(producer, consumer, rank):
    """How many consumer notifications producer rank ``rank`` of engine
    ``producer`` (a :class:`Layout` of any of its ranks) waits for per
    request from consumer engine ``consumer`` (``kvp_notify_expected()``).
    :class:`Error` -EPROTO or -EFBIG as :meth:`Plan.compile` would refuse,
    -EINVAL."""
    f = "kvp_notify_expected"
    return check(lib.kvp_notify_expected(producer.handle, consumer.handle,
                                         check_u32(rank, f, "rank")), f)


# ---- plans ------------------------------------------------------------------


def _human(b):
    v, u = float(b), 0
    while v >= 1024 and u < 4:
        v /= 1024
        u += 1
    if u:
        return "%.2f %s" % (v, ("B", "KiB", "MiB", "GiB", "TiB")[u])
    return "%d B" % b


class Plan(Handle):
    """A compiled transfer plan (an owned ``kvp_plan *``): what one consumer
    rank reads from a producer engine.  Immutable; thread-safe in C.

    Make one with :meth:`compile`.  Inspect it (:attr:`info`,
    :attr:`sources`, :attr:`notify_ranks`, :meth:`group`, :meth:`stream`,
    :meth:`piece`, :meth:`to_dict`, :meth:`dump`) and emit requests'
    READs (:meth:`emit`, :meth:`windows`).  Freed by :meth:`close`, a
    ``with`` block, or garbage collection.
    """

    def __init__(self, handle, local=None, remote=None, owned=True,
                 owner=None):
        """Wrap ``handle`` (a ``kvp_plan *``); use :meth:`compile`.

        ``local`` and ``remote`` are the layouts it was compiled from (kept
        for :meth:`dump`, :meth:`to_dict` and the sink checks); ``owned``
        False borrows a plan that ``owner`` keeps alive."""
        if not handle:
            raise ValueError("NULL kvp_plan")
        self._handle = handle
        self._owned = owned
        self._owner = owner
        self.local = local
        self.remote = remote
        info = S.PlanInfo()
        lib.kvp_plan_get_info(handle, byref(info))
        self._info = info
        self._ngroups = info.ngroups
        self._sources = [lib.kvp_plan_source(handle, i)
                         for i in range(info.nsrc)]
        self._notify = [lib.kvp_plan_notify(handle, i)
                        for i in range(info.nnotify)]
        self._streams = self._pieces = None

    # ---- lifetime ----------------------------------------------------

    @classmethod
    def compile(cls, local, remote, attr=None, *, max_sge=None,
                max_len=None, no_coalesce=None):
        """Compile the plan of consumer rank ``local`` (a :class:`Layout`)
        pulling from the producer engine of ``remote`` (a layout of any of
        its ranks) (``kvp_plan_compile()``).

        Options: ``max_sge`` local SGEs per READ (0 or unset: 1, as in C;
        an agent uses ``DEFAULT_MAX_SGE``), ``max_len`` bytes per READ (1 to
        2^31; 0: 2^31; sets ``PLAN_ATTR_MAX_LEN``), ``no_coalesce`` one READ
        per piece (sets ``PLAN_ATTR_FLAGS``).  Or ``attr``, a
        :class:`PlanAttr` passed as it is (``comp_mask`` yours).

        :class:`Error` -EPROTO when the layouts cannot be matched and
        -EFBIG when the plan would be too costly, both with the library's
        line in ``why``; -EINVAL for bad options.  The layouts are cloned:
        later changes to them do not reach the plan's dumps."""
        f = "kvp_plan_compile"
        if not isinstance(local, Layout) or not isinstance(remote, Layout):
            raise TypeError("Plan.compile takes two kvpull.Layout")
        if attr is None:
            attr = S.PlanAttr()
            if max_sge is not None:
                attr.max_sge = check_u32(max_sge, f, "max_sge")
            if max_len is not None:
                attr.comp_mask |= PLAN_ATTR_MAX_LEN
                attr.max_len = check_u32(max_len, f, "max_len")
            if no_coalesce is not None:
                attr.comp_mask |= PLAN_ATTR_FLAGS
                attr.flags = PLAN_NO_COALESCE if no_coalesce else 0
        elif max_sge is not None or max_len is not None or \
                no_coalesce is not None:
            raise TypeError("give attr or the keyword options, not both")
        elif not isinstance(attr, S.PlanAttr):
            raise TypeError("attr must be a kvpull.PlanAttr")
        out = c_void_p()
        msg = ctypes.create_string_buffer(MSG_LEN)
        err = lib.kvp_plan_compile(local.handle, remote.handle, byref(attr),
                                   byref(out), msg, MSG_LEN)
        if err:
            raise Error(err, f, msg.value.decode("utf-8", "replace") or None)
        try:
            return cls(out.value, local.clone(), remote.clone())
        except BaseException:
            lib.kvp_plan_destroy(out.value)
            raise

    _what = "plan"

    def _free(self, h):
        """``kvp_plan_destroy()`` and the layouts kept for dumps, by
        :meth:`close`; arrays already emitted stay valid."""
        if h and self._owned:
            lib.kvp_plan_destroy(h)
        for lay in (self.local, self.remote):
            if lay is not None:
                lay.close()
        self._owner = None

    def __repr__(self):
        if self.closed:
            return "<kvpull.Plan closed>"
        i = self._info
        return ("<kvpull.Plan consumer rank %d of TP %d <- TP %d: %d groups, "
                "%d sources, %d streams, %d pieces>" % (
                    i.local_rank, i.local_tp, i.remote_tp, i.ngroups,
                    i.nsrc, i.nstreams, i.npieces))

    # ---- inspection ------------------------------------------------------

    @property
    def info(self):
        """A copy of the plan's :class:`PlanInfo` (``kvp_plan_get_info()``)."""
        self.handle
        return self._info.copy()

    @property
    def ngroups(self):
        """The plan's groups (a request has one id entry per group)."""
        return self._ngroups

    @property
    def sources(self):
        """The producer ranks read from, by source index
        (``kvp_plan_source()``)."""
        self.handle
        return list(self._sources)

    @property
    def notify_ranks(self):
        """The producer ranks this consumer notifies
        (``kvp_plan_notify()``)."""
        self.handle
        return list(self._notify)

    def source(self, i):
        """Producer rank of source index ``i`` (``kvp_plan_source()``;
        :class:`Error` -EINVAL past the last)."""
        return check(lib.kvp_plan_source(
            self.handle, check_u32(i, "kvp_plan_source", "i")),
            "kvp_plan_source")

    def notify(self, i):
        """Producer rank of notify index ``i`` (``kvp_plan_notify()``)."""
        return check(lib.kvp_plan_notify(
            self.handle, check_u32(i, "kvp_plan_notify", "i")),
            "kvp_plan_notify")

    def group(self, g):
        """Group ``g``, a :class:`PlanGroup` (``kvp_plan_get_group()``)."""
        out = S.PlanGroup()
        check(lib.kvp_plan_get_group(
            self.handle, check_u32(g, "kvp_plan_get_group", "g"), byref(out)),
            "kvp_plan_get_group")
        return out

    def stream(self, i):
        """Stream ``i``, a :class:`PlanStream` (``kvp_plan_get_stream()``)."""
        out = S.PlanStream()
        check(lib.kvp_plan_get_stream(
            self.handle, check_u32(i, "kvp_plan_get_stream", "i"),
            byref(out)), "kvp_plan_get_stream")
        return out

    def stream_gather(self, i):
        """How emission reads stream ``i``: 1 alone, n >= 2 when streams i
        .. i + n - 1 form a gather, 0 inside an earlier stream's gather
        (``kvp_plan_stream_gather()``)."""
        return check(lib.kvp_plan_stream_gather(
            self.handle, check_u32(i, "kvp_plan_stream_gather", "i")),
            "kvp_plan_stream_gather")

    def piece(self, i):
        """Piece template ``i``, a :class:`PlanPiece`
        (``kvp_plan_get_piece()``)."""
        out = S.PlanPiece()
        check(lib.kvp_plan_get_piece(
            self.handle, check_u32(i, "kvp_plan_get_piece", "i"),
            byref(out)), "kvp_plan_get_piece")
        return out

    @property
    def groups(self):
        """Every group, a list of :class:`PlanGroup`."""
        return [self.group(g) for g in range(self._info.ngroups)]

    @property
    def streams(self):
        """Every stream, a list of :class:`PlanStream`."""
        return [self.stream(i) for i in range(self._info.nstreams)]

    @property
    def pieces(self):
        """Every piece template, a list of :class:`PlanPiece`."""
        return [self.piece(i) for i in range(self._info.npieces)]

    def _table(self, get, n, dtype, f):
        a = np.zeros(n, dtype)
        h, base, size = self.handle, a.ctypes.data, dtype.itemsize
        for i in range(n):
            check(get(h, i, base + i * size), f)
        a.flags.writeable = False
        return a

    def streams_array(self):
        """Every stream as one read-only numpy array of
        :data:`STREAM_DTYPE` (filled by ``kvp_plan_get_stream()`` once, then
        cached)."""
        if self._streams is None:
            self._streams = self._table(lib.kvp_plan_get_stream,
                                        self._info.nstreams, S.STREAM_DTYPE,
                                        "kvp_plan_get_stream")
        return self._streams

    def pieces_array(self):
        """Every piece template as one read-only numpy array of
        :data:`PIECE_DTYPE` (filled by ``kvp_plan_get_piece()`` once, then
        cached)."""
        if self._pieces is None:
            self._pieces = self._table(lib.kvp_plan_get_piece,
                                       self._info.npieces, S.PIECE_DTYPE,
                                       "kvp_plan_get_piece")
        return self._pieces

    def serves(self, g, s):
        """Whether source index ``s`` serves group ``g`` (the group's
        ``src_mask``; past 64 sources, from the streams)."""
        if self._info.nsrc <= 64:
            return bool((self.group(g).src_mask >> s) & 1)
        st = self.streams_array()
        return bool(((st["src"] == s) & (st["group"] == g)).any())

    def notify_expected(self):
        """Per producer rank, the consumer notifications it expects per
        request from the consumer engine (:func:`notify_expected` on the
        layouts the plan was compiled from)."""
        self._layouts("notify_expected")
        return [notify_expected(self.remote, self.local, r)
                for r in range(self.remote.tp_size)]

    def _layouts(self, what):
        if self.local is None or self.remote is None:
            raise ValueError("%s needs the layouts the plan was compiled "
                             "from" % what)

    # ---- dumps -----------------------------------------------------------

    def to_dict(self):
        """The plan as plain data, in the shape of ``plan`` of
        ``kvpull-plan --json``: ``info``, ``sources`` and ``notify`` (ranks),
        ``groups`` (with the source indices serving each), ``streams``
        (with ``src_rank`` and ``layer``) and ``pieces``."""
        i = self._info
        info = i.to_dict()
        groups = []
        for g, pg in enumerate(self.groups):
            d = pg.to_dict()
            del d["src_mask"]
            d["kind"] = str(_enum(GroupKind, pg.kind))
            d["sources"] = [s for s in range(i.nsrc) if self.serves(g, s)]
            groups.append(d)
        streams = []
        for (src, group, lview, rview, lreg, rreg, first, npieces, bpp,
             layer, _pad) in self.streams_array().tolist():
            streams.append({
                "src": src, "src_rank": self._sources[src], "group": group,
                "layer": layer, "local_view": lview, "local_region": lreg,
                "remote_view": rview, "remote_region": rreg,
                "piece_first": first, "npieces": npieces,
                "bytes_per_period": bpp})
        pieces = [{"remote_block": rb, "remote_offset": ro,
                   "local_block": lb, "local_offset": lo, "len": ln}
                  for ro, lo, ln, rb, lb in self.pieces_array().tolist()]
        return {"info": info, "sources": self.sources,
                "notify": self.notify_ranks, "groups": groups,
                "streams": streams, "pieces": pieces}

    def to_json(self, **kw):
        """:meth:`to_dict` as a JSON string (``kw`` go to
        :func:`json.dumps`)."""
        return json.dumps(self.to_dict(), **kw)

    def dump(self, brief=False):
        """The plan's summary, as ``kvpull-plan`` prints it from its
        ``plan:`` line to the end of the group tables (same bytes, with the
        compile time left out as by ``--no-timing``); ``brief`` leaves the
        per-stream tables out as ``--brief`` does."""
        self._layouts("dump")
        i = self._info
        src = self._sources
        out = []
        w = out.append
        w("plan: consumer rank %d of TP %d pulling from TP %d, max_sge %d\n"
          % (i.local_rank, i.local_tp, i.remote_tp, i.max_sge))
        w("  %d group%s, %d source%s, %d notified, %d streams, %d piece "
          "templates\n" % (i.ngroups, "" if i.ngroups == 1 else "s", i.nsrc,
                           "" if i.nsrc == 1 else "s", i.nnotify, i.nstreams,
                           i.npieces))
        w("  plan size %d bytes (%s)\n" % (i.bytes, _human(i.bytes)))
        w("  source ranks (read from):%s\n" % _ranks(src))
        w("  notify ranks:%s\n" % _ranks(self._notify))
        w("  notifications each producer rank expects per request:%s\n" %
          "".join(" %d:%d" % (r, e)
                  for r, e in enumerate(self.notify_expected())))
        lk, rk = self.local.view_kinds(), self.remote.view_kinds()
        streams = self.streams_array().tolist()
        plen = self.pieces_array()["len"]
        layers = [v.layer for v in self.local.views]
        for g, p in enumerate(self.groups):
            w("\ngroup %d: %s\n" % (g, _enum(GroupKind, p.kind)))
            if p.kind == GroupKind.STATE:
                w("  whole states, one local block from one remote block\n")
            else:
                w("  blocks: local %d tokens, remote %d tokens; period %d "
                  "tokens = %d local : %d remote\n" % (
                      p.local_tokens, p.remote_tokens, p.period_tokens,
                      p.local_per_period, p.remote_per_period))
            w("  ids: local < %d, remote < %d\n" % (p.local_blocks,
                                                     p.remote_blocks))
            w("  source ranks:%s\n" % "".join(
                " %d" % src[s] for s in range(i.nsrc) if self.serves(g, s)))
            self._dump_streams(w, g, p, streams, plen, layers, lk, rk, brief)
        return "".join(out)

    def _dump_streams(self, w, g, p, streams, plen, layers, lk, rk, brief):
        nsrc = self._info.nsrc
        per_src, nstreams, total = [0] * nsrc, [0] * nsrc, 0
        if not brief:
            w("  streams:\n    %4s %5s %-24s %12s %12s %7s %13s  %s\n" % (
                "src", "layer", "fields", "local v/r", "remote v/r",
                "pieces", "bytes/period", "piece lengths"))
        for (src, group, lview, rview, lreg, rreg, first, npieces, bpp,
             _layer, _pad) in streams:
            if group != g:
                continue
            per_src[src] += bpp
            nstreams[src] += 1
            total += bpp
            if brief:
                continue
            lens = plen[first:first + npieces]
            lmin = int(lens.min()) if npieces else 0xFFFFFFFF
            lmax = int(lens.max()) if npieces else 0
            kinds = "+".join(str(k) for k in sorted(lk[lview] & rk[rview]))
            w("    %4d %5d %-24s %12s %12s %7d %13d  %s\n" % (
                self._sources[src], layers[lview], kinds,
                "%d/%d" % (lview, lreg), "%d/%d" % (rview, rreg), npieces,
                bpp, "%d" % lmin if lmin == lmax else "%d..%d" % (lmin, lmax)))
        w("  bytes per local block, by source rank:\n")
        lpp = p.local_per_period
        for s in range(nsrc):
            if not nstreams[s]:
                continue
            w("    rank %d: %d streams, %d bytes per period, %d per local "
              "block (%s)\n" % (self._sources[s], nstreams[s], per_src[s],
                                per_src[s] // lpp, _human(per_src[s] // lpp)))
        w("    total: %d bytes per local block (%s)\n" % (
            total // lpp, _human(total // lpp)))

    # ---- emission ----------------------------------------------------------

    def _req(self, request, f):
        req = request if isinstance(request, Request) else Request(request)
        if len(req._groups) != self._ngroups:
            raise _einval(f, "the request has %d group%s, the plan %d" % (
                len(req._groups), "" if len(req._groups) == 1 else "s",
                self._ngroups))
        return req

    def request(self, groups):
        """A :class:`Request` for this plan (its group count checked)."""
        return self._req(Request(groups), "Request")

    def emit_bound(self, max_ids):
        """``(max_wrs, max_sges)``: upper bounds on what :meth:`emit` writes
        for a request whose id lists hold at most ``max_ids`` ids each
        (``kvp_plan_emit_bound()``)."""
        w, s = c_uint32(), c_uint32()
        lib.kvp_plan_emit_bound(self.handle,
                                check_u32(max_ids, "kvp_plan_emit_bound",
                                          "max_ids"), byref(w), byref(s))
        return w.value, s.value

    def buffers(self, max_ids):
        """Reusable :class:`EmitBuffers` for requests of at most
        ``max_ids`` ids per list (``emit(req, out=buffers)`` allocates
        nothing)."""
        return EmitBuffers(self, max_ids)

    def emit_check(self, request):
        """Check a request's ids as :meth:`emit` does, writing nothing
        (``kvp_plan_emit_check()``): :class:`Error` -ERANGE for an id out of
        range, -EINVAL for lists that do not fit a group."""
        req = self._req(request, "kvp_plan_emit_check")
        check(lib.kvp_plan_emit_check(self.handle, req._addr),
              "kvp_plan_emit_check")

    def emit(self, request, out=None):
        """The READs of one request (``kvp_plan_emit()``), written by the C
        call straight into numpy arrays: an :class:`Emission` (``wrs``,
        ``sges``, ``src_end``).

        ``request`` is a :class:`Request` or its per-group list.  ``out``
        is an :class:`EmitBuffers` (:meth:`buffers`), or a ``(wr, sge)`` or
        ``(wr, sge, src_end)`` tuple of numpy arrays of WR_DTYPE, SGE_DTYPE
        and uint32; without it, arrays of :meth:`emit_bound`'s size are
        allocated (pages are touched only where written).

        :class:`Error` -ERANGE for a block id out of range, -EINVAL for id
        lists that do not fit a group (or a request with another number of
        groups than the plan), -ENOSPC when ``out`` is too small for this
        request, -EOVERFLOW for a request too large to count.  Nothing is
        written on error.  The GIL is released during the C call."""
        req = self._req(request, "kvp_plan_emit")
        if out is None:
            out = EmitBuffers(self, req.max_ids)
        if isinstance(out, EmitBuffers):
            wr, sge, end = out.wr, out.sge, out.src_end
            wa, sa, ea = out._wr_addr, out._sge_addr, out._end_addr
        else:
            wr, sge, end = _out_arrays(out, self._info.nsrc)
            wa, sa = wr.ctypes.data, sge.ctypes.data
            ea = end.ctypes.data if end is not None else None
        n = lib.kvp_plan_emit(self.handle, req._addr, wa, len(wr), sa,
                              len(sge), ea)
        if n < 0:
            raise Error(n, "kvp_plan_emit")
        return Emission(wr[:n], sge[:_nsge(wr, n)],
                        end[:self._info.nsrc] if end is not None else None,
                        self._sources)

    def emit_range(self, request, range, out=None):
        """The READs of the part ``range`` (an :class:`EmitRange`, e.g.
        from :func:`emit_range` or :func:`progress_ranges`) of a request,
        every source in turn, as one :class:`Emission` laid out as
        :meth:`emit`'s (``sge_first`` counts from ``sges[0]``, ``src_end``
        per source): what ``kvpull-plan --range`` lists.  Each source is
        written by ``kvp_plan_emit_range_start()`` and
        ``kvp_plan_emit_range_window()`` with all the room left, so its
        READs coalesce as :meth:`emit`'s do.  ``out`` as for :meth:`emit`."""
        f = "kvp_plan_emit_range_window"
        req = self._req(request, f)
        self.emit_check(req)
        if not isinstance(range, S.EmitRange):
            raise TypeError("range must be a kvpull.EmitRange")
        if out is None:
            out = EmitBuffers(self, req.max_ids)
        if isinstance(out, EmitBuffers):
            wr, sge, end = out.wr, out.sge, out.src_end
        else:
            wr, sge, end = _out_arrays(out, self._info.nsrc)
        nsrc = self._info.nsrc
        ends = np.zeros(nsrc, np.uint32) if end is None else end
        nwr = nsge = 0
        for s in builtins_range(nsrc):
            pos = self.emit_start(req, s, range)
            while not pos.done:
                if nwr == len(wr) or nsge == len(sge):
                    raise Error(-errno.ENOSPC, f)
                win = self.emit_window(req, pos, wr[nwr:], sge[nsge:], range)
                k = len(win.wrs)
                if not k:
                    break
                win.wrs["sge_first"] += nsge
                nwr += k
                nsge += len(win.sges)
            ends[s] = nwr
        return Emission(wr[:nwr], sge[:nsge],
                        end[:nsrc] if end is not None else None,
                        self._sources)

    def emit_start(self, request, src, range=None):
        """The position of the first READ of source index ``src`` for
        ``request`` (``kvp_plan_emit_start()``, or
        ``kvp_plan_emit_range_start()`` with ``range``, an
        :class:`EmitRange`): an :class:`EmitPos`.  The request must pass
        :meth:`emit_check`."""
        req = self._req(request, "kvp_plan_emit_start")
        pos = S.EmitPos()
        src = check_u32(src, "kvp_plan_emit_start", "src")
        if range is None:
            check(lib.kvp_plan_emit_start(self.handle, req._addr, src,
                                          byref(pos)), "kvp_plan_emit_start")
        else:
            check(lib.kvp_plan_emit_range_start(
                self.handle, req._addr, src, byref(range), byref(pos)),
                "kvp_plan_emit_range_start")
        return pos

    def emit_window(self, request, pos, wr, sge, range=None):
        """Write up to ``len(wr)`` READs using at most ``len(sge)`` SGEs of
        ``pos``'s source, from where ``pos`` stands, into ``wr`` and ``sge``
        (numpy arrays of WR_DTYPE and SGE_DTYPE, from index 0), and advance
        ``pos`` (``kvp_plan_emit_window()``, or ``_range_window()`` with
        ``range``, which must be the one the position started with).
        Returns a :class:`Window` of views of what was written; no READs
        when the source is finished."""
        f = "kvp_plan_emit_window"
        req = self._req(request, f)
        writable_records(wr, S.WR_DTYPE, f, "wr")
        writable_records(sge, S.SGE_DTYPE, f, "sge")
        nbytes = c_uint64()
        if range is None:
            n = lib.kvp_plan_emit_window(self.handle, req._addr, byref(pos),
                                         wr.ctypes.data, len(wr),
                                         sge.ctypes.data, len(sge),
                                         byref(nbytes))
        else:
            n = lib.kvp_plan_emit_range_window(
                self.handle, req._addr, byref(range), byref(pos),
                wr.ctypes.data, len(wr), sge.ctypes.data, len(sge),
                byref(nbytes))
        if n < 0:
            raise Error(n, f if range is None else
                        "kvp_plan_emit_range_window")
        return Window(wr[:n], sge[:_nsge(wr, n)], nbytes.value)

    def windows(self, request, src, wr_cap=256, sge_cap=None, range=None):
        """Iterate over the READs of source index ``src`` for ``request`` in
        windows of at most ``wr_cap`` READs and ``sge_cap`` SGEs (default
        ``wr_cap * max_sge``), as a transport fills a send queue: yields
        :class:`Window` objects whose arrays are reused by the next window
        (``.copy()`` to keep them).  Checks the request first
        (:meth:`emit_check`)."""
        req = self._req(request, "kvp_plan_emit_window")
        self.emit_check(req)
        if sge_cap is None:
            sge_cap = wr_cap * max(self._info.max_sge, 1)
        wr_cap = check_u32(wr_cap, "windows", "wr_cap")
        sge_cap = check_u32(sge_cap, "windows", "sge_cap")
        if not wr_cap or not sge_cap:
            raise _einval("windows", "wr_cap and sge_cap must be at least 1")
        wr = np.empty(wr_cap, S.WR_DTYPE)
        sge = np.empty(sge_cap, S.SGE_DTYPE)
        pos = self.emit_start(req, src, range)
        return self._windows(req, pos, wr, sge, range)

    def _windows(self, req, pos, wr, sge, range):
        while True:
            win = self.emit_window(req, pos, wr, sge, range)
            if not len(win.wrs):
                return
            yield win

    def emit_window_into(self, request, pos, sink, wr_cap=None,
                         sge_cap=None, range=None):
        """:meth:`emit_window` into an :class:`EmitSink`: the same READs,
        with each WR's remote address and key and each SGE's address and key
        resolved through the sink's maps
        (``kvp_plan_emit_window_into()``, or ``_range_window_into()``).
        Caps default to, and may not exceed, the sink's capacity.  Returns
        ``(nwr, nsge, bytes)``.  The key tables are checked against the
        regions' sizes (of the layouts the plan was compiled from) before
        the call: the C call cannot check their lengths."""
        f = "kvp_plan_emit_window_into"
        req = self._req(request, f)
        if not isinstance(sink, EmitSink):
            raise TypeError("sink must be a kvpull.EmitSink")
        wr_cap = sink.wr_cap if wr_cap is None else \
            check_u32(wr_cap, f, "wr_cap")
        sge_cap = sink.sge_cap if sge_cap is None else \
            check_u32(sge_cap, f, "sge_cap")
        if wr_cap > sink.wr_cap or sge_cap > sink.sge_cap:
            raise _einval(f, "caps %d WRs, %d SGEs above the sink's %d, %d"
                          % (wr_cap, sge_cap, sink.wr_cap, sink.sge_cap))
        self._check_maps(sink, f)
        nsge, nbytes = c_uint32(), c_uint64()
        if range is None:
            n = lib.kvp_plan_emit_window_into(
                self.handle, req._addr, byref(pos), byref(sink.c), wr_cap,
                sge_cap, byref(nsge), byref(nbytes))
        else:
            f = "kvp_plan_emit_range_window_into"
            n = lib.kvp_plan_emit_range_window_into(
                self.handle, req._addr, byref(range), byref(pos),
                byref(sink.c), wr_cap, sge_cap, byref(nsge), byref(nbytes))
        check(n, f)
        return n, nsge.value, nbytes.value

    def _check_maps(self, sink, f):
        if self.local is None or self.remote is None:
            return
        for what, lay in (("local", self.local), ("remote", self.remote)):
            maps = sink._nkeys[what]
            sizes = lay.regions
            if len(maps) < len(sizes):
                raise _einval(f, "%d %s region maps for %d regions" % (
                    len(maps), what, len(sizes)))
            for r, size in enumerate(sizes):
                nkeys, shift = maps[r]
                if shift >= 64:
                    continue            # the C call refuses it
                need = 1 if shift >= 63 else -(-size // (1 << shift))
                if nkeys < max(need, 1):
                    raise _einval(f, "%s region %d: %d keys, its %d bytes "
                                  "need %d" % (what, r, nkeys, size, need))


def _ranks(ranks):
    return "".join(" %d" % r for r in ranks) if ranks else " none"


def _out_arrays(out, nsrc):
    f = "kvp_plan_emit"
    out = tuple(out)
    if len(out) not in (2, 3):
        raise TypeError("out must be EmitBuffers or (wr, sge[, src_end])")
    wr = writable_records(out[0], S.WR_DTYPE, f, "wr")
    sge = writable_records(out[1], S.SGE_DTYPE, f, "sge")
    end = None
    if len(out) == 3 and out[2] is not None:
        end = writable_records(out[2], _U32, f, "src_end")
        if len(end) < nsrc:
            raise _einval(f, "src_end holds %d entries, the plan has %d "
                          "sources" % (len(end), nsrc))
    return wr, sge, end
