# SPDX-License-Identifier: MIT
"""Layouts: one engine rank's KV-cache geometry (``kvp_layout``)."""
import ctypes
import errno
from ctypes import byref, c_size_t, c_uint32, c_uint64, c_void_p

import numpy as np

from . import _structs as S
from ._buf import byte_view, check_u32, check_u64, u32_array
from ._handle import Handle
from ._lib import lib
from .enums import (Axis, ConvLayout, FieldKind, GroupKind, KvLayout,
                    NO_SHARD, MAX_DIMS)
from .errors import Error, check

__all__ = ["Layout", "presets", "shard_range", "MSG_LEN"]

#: Bytes of the message buffer handed to the calls that explain a refusal.
MSG_LEN = 512


def presets():
    """Return the names of the library's model presets, in its order
    (``kvp_model_preset_name()``)."""
    names = []
    i = 0
    while True:
        n = lib.kvp_model_preset_name(i)
        if n is None:
            return names
        names.append(n.decode())
        i += 1


def shard_range(total, tp_size, rank):
    """Return ``(start, length)``: the global range of an axis of extent
    ``total`` that TP rank ``rank`` of ``tp_size`` holds
    (``kvp_shard_range()``).  :class:`Error` -EINVAL when neither of
    ``total`` and ``tp_size`` divides the other, or ``rank >= tp_size``."""
    f = "kvp_shard_range"
    start, length = c_uint32(), c_uint32()
    check(lib.kvp_shard_range(check_u32(total, f, "total"),
                              check_u32(tp_size, f, "tp_size"),
                              check_u32(rank, f, "rank"),
                              byref(start), byref(length)), f)
    return start.value, length.value


def _msg_buf():
    return ctypes.create_string_buffer(MSG_LEN)


def _msg(buf):
    return buf.value.decode("utf-8", "replace") or None


def _model(model):
    if isinstance(model, S.Model):
        return model
    if isinstance(model, str):
        return S.Model.preset(model)
    raise TypeError("model must be a kvpull.Model or a preset name, not %s"
                    % type(model).__name__)


_ENGINE_ENUMS = {"kv_layout": KvLayout, "conv_layout": ConvLayout}


def _engine(engine, kw):
    f = "kvp_layout_build"
    if engine is not None and kw:
        raise TypeError("give an EngineDesc or keyword members, not both")
    if engine is None:
        engine = S.EngineDesc()
        names = dict(S.EngineDesc._fields_)
        for k, v in kw.items():
            if k not in names:
                raise TypeError("struct kvp_engine_desc has no member %r"
                                % (k,))
            if k in _ENGINE_ENUMS:
                v = _ENGINE_ENUMS[k].parse(v)
            if k == "engine_id":
                v = check_u64(v, f, k)
            else:
                v = check_u32(v, f, k)
            setattr(engine, k, v)
    elif not isinstance(engine, S.EngineDesc):
        raise TypeError("engine must be a kvpull.EngineDesc")
    return engine


class Layout(Handle):
    """One engine rank's KV-cache layout (an owned ``kvp_layout *``).

    Make one with :meth:`build` (a model and an engine description),
    :meth:`parse` (a spec text), :meth:`from_meta` (a metadata blob) or
    :meth:`create` and the ``add_*`` builders.  The layout is freed by
    :meth:`close`, by leaving a ``with`` block, or when the object is
    garbage-collected.  A layout can be passed wherever ctypes expects a
    ``kvp_layout *`` (``_as_parameter_``); :attr:`handle` is its address.
    """

    __slots__ = ("_handle", "__weakref__")

    def __init__(self, handle):
        """Wrap and own ``handle`` (a ``kvp_layout *`` as an int); use the
        class methods instead."""
        if not handle:
            raise ValueError("NULL kvp_layout")
        self._handle = handle

    # ---- lifetime ----------------------------------------------------

    _what = "layout"

    def _free(self, h):
        """``kvp_layout_destroy()``, by :meth:`close`."""
        if h:
            lib.kvp_layout_destroy(h)

    def __repr__(self):
        if self.closed:
            return "<kvpull.Layout closed>"
        i = self.info
        return ("<kvpull.Layout engine %d TP %d rank %d: %d groups, %d "
                "regions, %d views, %d fields>" % (
                    i.engine_id, i.tp_size, i.tp_rank, i.ngroups,
                    i.nregions, i.nviews, i.nfields))

    # ---- constructors --------------------------------------------------

    @classmethod
    def create(cls, tp_size=1, tp_rank=0, engine_id=0, comp_mask=0):
        """An empty layout for rank ``tp_rank`` of an engine of TP
        ``tp_size`` (``kvp_layout_create()``); fill it with
        :meth:`add_group`, :meth:`add_region`, :meth:`add_view` and
        :meth:`add_field`.  :class:`Error` -EINVAL when ``tp_rank >=
        tp_size``, ``tp_size`` is 0 or above ``MAX_TP_SIZE``."""
        f = "kvp_layout_create"
        attr = S.LayoutAttr(engine_id=check_u64(engine_id, f, "engine_id"),
                            tp_size=check_u32(tp_size, f, "tp_size"),
                            tp_rank=check_u32(tp_rank, f, "tp_rank"),
                            comp_mask=check_u32(comp_mask, f, "comp_mask"))
        out = c_void_p()
        check(lib.kvp_layout_create(byref(attr), byref(out)), f)
        return cls(out.value)

    @classmethod
    def build(cls, model, engine=None, **members):
        """The layout of one rank of an engine running ``model``
        (``kvp_layout_build_msg()``).

        ``model`` is a :class:`Model` or a preset name; the engine is an
        :class:`EngineDesc` or its members as keywords (``tp_size``,
        ``tp_rank``, ``block_tokens``, ``kernel_block_tokens``,
        ``num_blocks``, ``kv_layout``, ``conv_layout``, ``engine_id``; the
        layouts by enum or name: ``kv_layout="flash_hnd"``), unset members
        being 0 as in C.  On a refusal :class:`Error` carries the library's
        reason in ``why`` ("TP 3 does not divide and is not divided by 8 KV
        heads; ...")."""
        m = _model(model)
        e = _engine(engine, members)
        out, msg = c_void_p(), _msg_buf()
        err = lib.kvp_layout_build_msg(byref(m), byref(e), byref(out), msg,
                                       MSG_LEN)
        if err:
            raise Error(err, "kvp_layout_build_msg", _msg(msg))
        return cls(out.value)

    @classmethod
    def parse(cls, text):
        """A layout from a spec text (``kvp_layout_parse()``; the forms are
        in tools/README.md, "Spec files").  ``text`` is ``str`` or bytes.
        On a refusal :class:`Error` (-EINVAL, -ENOENT for an unknown preset)
        carries the library's reason, ``"line N: ..."``, in ``why``."""
        raw = text.encode() if isinstance(text, str) else bytes(text)
        out, msg = c_void_p(), _msg_buf()
        err = lib.kvp_layout_parse(raw, len(raw), byref(out), msg, MSG_LEN)
        if err:
            raise Error(err, "kvp_layout_parse", _msg(msg))
        return cls(out.value)

    @classmethod
    def from_meta(cls, blob):
        """A layout from a metadata blob (``kvp_meta_decode()``): any
        bytes-like object.  :class:`Error` -EPROTO for a malformed blob,
        -EMSGSIZE for a truncated one or one below ``META_MIN_LEN``."""
        buf = byte_view(blob)
        out = c_void_p()
        check(lib.kvp_meta_decode(buf.ctypes.data, buf.size, byref(out)),
              "kvp_meta_decode")
        return cls(out.value)

    decode = from_meta

    def clone(self):
        """An independent copy (``kvp_layout_clone()``)."""
        out = c_void_p()
        check(lib.kvp_layout_clone(self.handle, byref(out)),
              "kvp_layout_clone")
        return type(self)(out.value)

    def to_meta(self):
        """The metadata blob of this layout, ``bytes``
        (``kvp_meta_encode()``): the layout with its region keys, for a peer
        or for :meth:`from_meta`."""
        need = c_size_t()
        err = lib.kvp_meta_encode(self.handle, None, 0, byref(need))
        if err != -errno.EMSGSIZE:
            check(err, "kvp_meta_encode")
        buf = ctypes.create_string_buffer(need.value)
        n = c_size_t()
        check(lib.kvp_meta_encode(self.handle, buf, need.value, byref(n)),
              "kvp_meta_encode")
        return buf.raw[:n.value]

    encode = to_meta

    def meta_into(self, buf):
        """Encode the metadata blob into a writable buffer; return its
        length.  :class:`Error` -EMSGSIZE when ``buf`` is too small
        (nothing written)."""
        view = byte_view(buf)
        if not view.flags.writeable:
            raise ValueError("meta_into: the buffer is read-only")
        n = c_size_t()
        check(lib.kvp_meta_encode(self.handle, view.ctypes.data, view.size,
                                  byref(n)), "kvp_meta_encode")
        return n.value

    # ---- builders --------------------------------------------------------

    def add_group(self, kind, block_tokens=0, comp_mask=0):
        """Add a group (``kvp_layout_add_group()``) of ``kind`` (a
        :class:`GroupKind` or its name) with ``block_tokens`` tokens per
        block (0 for state groups); return its index."""
        f = "kvp_layout_add_group"
        g = S.GroupDesc(kind=GroupKind.parse(kind),
                        block_tokens=check_u32(block_tokens, f,
                                               "block_tokens"),
                        comp_mask=check_u32(comp_mask, f, "comp_mask"))
        out = c_uint32()
        check(lib.kvp_layout_add_group(self.handle, byref(g), byref(out)), f)
        return out.value

    def add_region(self, size):
        """Add a region of ``size`` bytes (``kvp_layout_add_region()``);
        return its index."""
        out = c_uint32()
        check(lib.kvp_layout_add_region(
            self.handle, check_u64(size, "kvp_layout_add_region", "size"),
            byref(out)), "kvp_layout_add_region")
        return out.value

    def add_view(self, group, region, layer, num_blocks, stride, offset=0,
                 comp_mask=0):
        """Add a view (``kvp_layout_add_view()``): group ``group`` sees
        region ``region`` for model layer ``layer``, page b at ``offset + b
        * stride``, ``num_blocks`` pages; return its index."""
        f = "kvp_layout_add_view"
        v = S.ViewDesc(group=check_u32(group, f, "group"),
                       region=check_u32(region, f, "region"),
                       layer=check_u32(layer, f, "layer"),
                       num_blocks=check_u32(num_blocks, f, "num_blocks"),
                       offset=check_u64(offset, f, "offset"),
                       stride=check_u64(stride, f, "stride"),
                       comp_mask=check_u32(comp_mask, f, "comp_mask"))
        out = c_uint32()
        check(lib.kvp_layout_add_view(self.handle, byref(v), byref(out)), f)
        return out.value

    def add_field(self, view, kind, elem_size, dims, offset=0,
                  shard_dim=None, shard_total=0, comp_mask=0):
        """Add a field to view ``view`` (``kvp_layout_add_field()``) and
        return its index (fields count across views).

        ``dims`` lists the dims outermost first, each a :class:`Dim` or an
        ``(axis, size, stride)`` tuple (the spec files' ``axis:size:stride``
        order; ``axis`` an :class:`Axis` or its name).  ``shard_dim`` is the
        index of the dim split across TP ranks (``None``: replicated) and
        ``shard_total`` that axis' global extent.  :class:`Error` -EINVAL
        for a malformed field (the layout is unchanged)."""
        f = "kvp_layout_add_field"
        fd = S.FieldDesc(kind=FieldKind.parse(kind),
                         elem_size=check_u32(elem_size, f, "elem_size"),
                         offset=check_u64(offset, f, "offset"),
                         shard_dim=NO_SHARD if shard_dim is None else
                         check_u32(shard_dim, f, "shard_dim"),
                         shard_total=check_u32(shard_total, f,
                                               "shard_total"),
                         comp_mask=check_u32(comp_mask, f, "comp_mask"))
        dims = list(dims)
        if len(dims) > MAX_DIMS:
            raise Error(-errno.EINVAL, f, "%d dims, at most %d"
                        % (len(dims), MAX_DIMS))
        fd.ndim = len(dims)
        for i, d in enumerate(dims):
            if isinstance(d, S.Dim):
                fd.dim[i] = d
            else:
                axis, size, stride = d
                fd.dim[i] = S.Dim(axis=Axis.parse(axis),
                                  size=check_u32(size, f, "size"),
                                  stride=check_u64(stride, f, "stride"))
        check(lib.kvp_layout_add_field(self.handle,
                                       check_u32(view, f, "view"),
                                       byref(fd)), f)
        return self.info.nfields - 1

    # ---- inspection ------------------------------------------------------

    @property
    def info(self):
        """A :class:`LayoutInfo` (``kvp_layout_get_info()``)."""
        i = S.LayoutInfo()
        lib.kvp_layout_get_info(self.handle, byref(i))
        return i

    @property
    def engine_id(self):
        """The engine's id."""
        return self.info.engine_id

    @property
    def tp_size(self):
        """The engine's TP size."""
        return self.info.tp_size

    @property
    def tp_rank(self):
        """This layout's TP rank."""
        return self.info.tp_rank

    def group(self, i):
        """Group ``i``, a :class:`GroupDesc` (:class:`Error` -EINVAL past
        the last)."""
        g = S.GroupDesc()
        check(lib.kvp_layout_get_group(
            self.handle, check_u32(i, "kvp_layout_get_group", "i"),
            byref(g)), "kvp_layout_get_group")
        return g

    def region_size(self, i):
        """Region ``i``'s size in bytes."""
        size = c_uint64()
        check(lib.kvp_layout_get_region(
            self.handle, check_u32(i, "kvp_layout_get_region", "i"),
            byref(size)), "kvp_layout_get_region")
        return size.value

    def view(self, i):
        """View ``i``, a :class:`ViewDesc`."""
        v = S.ViewDesc()
        check(lib.kvp_layout_get_view(
            self.handle, check_u32(i, "kvp_layout_get_view", "i"), byref(v)),
            "kvp_layout_get_view")
        return v

    def field(self, i):
        """Field ``i``: ``(view, FieldDesc)``, the view holding it and the
        field."""
        fd, view = S.FieldDesc(), c_uint32()
        check(lib.kvp_layout_get_field(
            self.handle, check_u32(i, "kvp_layout_get_field", "i"),
            byref(view), byref(fd)), "kvp_layout_get_field")
        return view.value, fd

    @property
    def groups(self):
        """Every group, a list of :class:`GroupDesc`."""
        return [self.group(i) for i in range(self.info.ngroups)]

    @property
    def regions(self):
        """Every region's size, a list of ints."""
        return [self.region_size(i) for i in range(self.info.nregions)]

    @property
    def views(self):
        """Every view, a list of :class:`ViewDesc`."""
        return [self.view(i) for i in range(self.info.nviews)]

    @property
    def fields(self):
        """Every field, a list of ``(view, FieldDesc)``."""
        return [self.field(i) for i in range(self.info.nfields)]

    @property
    def compat_hash(self):
        """The 64-bit compatibility hash (``kvp_layout_compat_hash()``):
        equal for engines a plan can match."""
        return lib.kvp_layout_compat_hash(self.handle)

    # ---- region keys -----------------------------------------------------

    def set_region_key(self, region, addr, rkey):
        """Set region ``region``'s remote address and key
        (``kvp_layout_set_region_key()``), carried by the blob."""
        f = "kvp_layout_set_region_key"
        check(lib.kvp_layout_set_region_key(
            self.handle, check_u32(region, f, "region"),
            check_u64(addr, f, "addr"), check_u32(rkey, f, "rkey")), f)

    def region_key(self, region):
        """Region ``region``'s ``(addr, rkey)``
        (``kvp_layout_get_region_key()``)."""
        f = "kvp_layout_get_region_key"
        addr, rkey = c_uint64(), c_uint32()
        check(lib.kvp_layout_get_region_key(
            self.handle, check_u32(region, f, "region"), byref(addr),
            byref(rkey)), f)
        return addr.value, rkey.value

    def set_region_keys(self, region, addr, shift, keys):
        """Set region ``region``'s address and one key per 2^``shift``
        bytes (``kvp_layout_set_region_keys()``; a region registered as
        several MRs).  ``keys`` is any uint32 buffer or sequence."""
        f = "kvp_layout_set_region_keys"
        k = u32_array(keys, f, "keys")
        check(lib.kvp_layout_set_region_keys(
            self.handle, check_u32(region, f, "region"),
            check_u64(addr, f, "addr"), check_u32(shift, f, "shift"),
            k.ctypes.data, k.size), f)

    def region_keys(self, region):
        """Region ``region``'s ``(addr, shift, keys)``: shift 0 with one
        key, keys a uint32 numpy array (``kvp_layout_get_region_keys()``)."""
        f = "kvp_layout_get_region_keys"
        region = check_u32(region, f, "region")
        addr, shift = c_uint64(), c_uint32()
        n = check(lib.kvp_layout_get_region_keys(
            self.handle, region, byref(addr), byref(shift), None, 0), f)
        keys = np.zeros(n, np.uint32)
        check(lib.kvp_layout_get_region_keys(
            self.handle, region, byref(addr), byref(shift),
            keys.ctypes.data, n), f)
        return addr.value, shift.value, keys

    # ---- dumps -----------------------------------------------------------

    def to_dict(self):
        """The layout as plain data, in the shape of a side of
        ``kvpull-plan --json`` (without its ``spec``, ``model`` and
        ``engine`` members, which describe how the tool made it):
        ``engine_id``, ``tp_size``, ``tp_rank``, ``compat_hash``
        (``"0x%016x"``), ``groups``, ``regions``, ``views``, ``fields``."""
        i = self.info
        out = {
            "engine_id": i.engine_id, "tp_size": i.tp_size,
            "tp_rank": i.tp_rank,
            "compat_hash": "0x%016x" % self.compat_hash,
            "groups": [{"kind": str(_enum(GroupKind, g.kind)),
                        "block_tokens": g.block_tokens}
                       for g in self.groups],
            "regions": [{"size": s} for s in self.regions],
            "views": [{"group": v.group, "region": v.region,
                       "layer": v.layer, "num_blocks": v.num_blocks,
                       "offset": v.offset, "stride": v.stride}
                      for v in self.views],
            "fields": [],
        }
        for view, fd in self.fields:
            d = {"view": view, "kind": str(_enum(FieldKind, fd.kind)),
                 "elem_size": fd.elem_size, "offset": fd.offset}
            shard = None
            if fd.shard_dim != NO_SHARD:
                try:
                    shard = shard_range(fd.shard_total, i.tp_size, i.tp_rank)
                except Error:
                    shard = None
            if shard is None:
                d.update(shard_dim=None, shard_total=None, shard_start=None,
                         shard_len=None)
            else:
                d.update(shard_dim=fd.shard_dim, shard_total=fd.shard_total,
                         shard_start=shard[0], shard_len=shard[1])
            d["dims"] = [{"axis": str(_enum(Axis, dm.axis)), "size": dm.size,
                          "stride": dm.stride}
                         for dm in fd.dim[:fd.ndim]]
            out["fields"].append(d)
        return out

    def view_kinds(self):
        """Per view, the set of :class:`FieldKind` its fields hold."""
        kinds = [set() for _ in range(self.info.nviews)]
        for view, fd in self.fields:
            kinds[view].add(_enum(FieldKind, fd.kind))
        return kinds


class _Unknown(int):
    def __str__(self):
        return "?"


def _enum(cls, v):
    try:
        return cls(v)
    except ValueError:
        return _Unknown(v)
