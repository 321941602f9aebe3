# SPDX-License-Identifier: MIT
"""ctypes mirrors of the C structs of kvpull.h, and numpy dtypes of the
emission records.

Every class here has the C struct's members, in order, with the same
types: ``ctypes.sizeof()`` and each member's offset equal the C compiler's
(``tests/python/test_abi.py`` compiles a C program and compares).  The
classes accept keyword arguments (``PlanAttr(max_sge=4)``), compare equal
member by member, print their members, and convert to dicts
(:meth:`Struct.to_dict`).
"""
import ctypes
from ctypes import (POINTER, c_char, c_char_p, c_int32, c_uint16, c_uint32,
                    c_uint64, c_void_p)

import numpy as np

MAX_DIMS = 6

__all__ = [
    "Struct", "Dim", "FieldDesc", "GroupDesc", "ViewDesc", "LayoutAttr",
    "LayoutInfo", "Model", "EngineDesc", "PlanAttr", "Ids", "Wr", "Sge",
    "EmitPos", "EmitMap", "EmitSge", "EmitSink", "Progress", "EmitRange",
    "PlanInfo", "PlanGroup", "PlanStream", "PlanPiece", "WR_DTYPE",
    "SGE_DTYPE", "EMIT_SGE_DTYPE", "STREAM_DTYPE", "PIECE_DTYPE", "STRUCTS",
    "AgentAttr", "Peer", "EngineInfo", "EventStruct", "AgentStats",
]


class Struct(ctypes.Structure):
    """Base of the C struct mirrors: keyword construction, equality,
    ``repr`` and :meth:`to_dict`."""

    def to_dict(self):
        """Return the members as a dict (nested structs and arrays as dicts
        and lists; ``char`` arrays as ``str``)."""
        out = {}
        for name, _type in type(self)._fields_:
            out[name] = _plain(getattr(self, name))
        return out

    def copy(self):
        """Return an independent copy of this struct."""
        new = type(self)()
        ctypes.pointer(new)[0] = self
        return new

    def _key(self):
        return _freeze(self.to_dict())

    def __eq__(self, other):
        """Member by member (padding bytes do not count)."""
        if type(other) is not type(self):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def __repr__(self):
        body = ", ".join("%s=%r" % (k, v) for k, v in self.to_dict().items())
        return "%s(%s)" % (type(self).__name__, body)


def _freeze(v):
    if isinstance(v, dict):
        return tuple((k, _freeze(x)) for k, x in v.items())
    if isinstance(v, list):
        return tuple(_freeze(x) for x in v)
    return v


def _plain(v):
    if isinstance(v, Struct):
        return v.to_dict()
    if isinstance(v, ctypes.Array):
        return [_plain(x) for x in v]
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return v


# ---- layout model ------------------------------------------------------


class Dim(Struct):
    """``struct kvp_dim``: one dim of a field (``stride`` bytes between
    consecutive indices, ``size`` indices held, ``axis`` an :class:`Axis`)."""
    _fields_ = [("stride", c_uint64), ("size", c_uint32), ("axis", c_uint32)]


class FieldDesc(Struct):
    """``struct kvp_field_desc``: a strided sub-tensor of a view's page."""
    _fields_ = [
        ("kind", c_uint32), ("elem_size", c_uint32), ("offset", c_uint64),
        ("ndim", c_uint32), ("shard_dim", c_uint32),
        ("shard_total", c_uint32), ("comp_mask", c_uint32),
        ("dim", Dim * MAX_DIMS),
    ]

    def to_dict(self):
        """Members as a dict; ``dim`` holds only the ``ndim`` dims in use."""
        d = Struct.to_dict(self)
        d["dim"] = d["dim"][:min(self.ndim, MAX_DIMS)]
        return d


class GroupDesc(Struct):
    """``struct kvp_group_desc``: a KV-cache group (kind, block size)."""
    _fields_ = [("kind", c_uint32), ("block_tokens", c_uint32),
                ("comp_mask", c_uint32)]


class ViewDesc(Struct):
    """``struct kvp_view_desc``: how one group sees one region for one
    layer (page b at ``offset + b * stride``)."""
    _fields_ = [
        ("group", c_uint32), ("region", c_uint32), ("layer", c_uint32),
        ("num_blocks", c_uint32), ("offset", c_uint64), ("stride", c_uint64),
        ("comp_mask", c_uint32),
    ]


class LayoutAttr(Struct):
    """``struct kvp_layout_attr``: engine id, TP size and rank."""
    _fields_ = [("engine_id", c_uint64), ("tp_size", c_uint32),
                ("tp_rank", c_uint32), ("comp_mask", c_uint32)]


class LayoutInfo(Struct):
    """``struct kvp_layout_info``: a layout's engine facts and counts."""
    _fields_ = [
        ("engine_id", c_uint64), ("tp_size", c_uint32), ("tp_rank", c_uint32),
        ("ngroups", c_uint32), ("nregions", c_uint32), ("nviews", c_uint32),
        ("nfields", c_uint32),
    ]


class _ModelC(Struct):
    _fields_ = [
        ("name", c_char * 48),
        ("layers", c_uint32), ("kv_heads", c_uint32), ("head_dim", c_uint32),
        ("dtype_bytes", c_uint32), ("mla_latent", c_uint32),
        ("comp_mask", c_uint32), ("sliding_layers", c_uint32),
        ("state_kind", c_uint32), ("state_layers", c_uint32),
        ("conv_kernel", c_uint32), ("ssm_heads", c_uint32),
        ("ssm_head_dim", c_uint32), ("ssm_state", c_uint32),
        ("ssm_groups", c_uint32), ("state_dtype_bytes", c_uint32),
    ]


class Model(_ModelC):
    """``struct kvp_model``: a model's public configuration numbers.

    ``name`` reads and writes as ``str`` (at most 47 bytes of UTF-8).
    :meth:`preset` fills one from the library's presets; :meth:`replace`
    returns a copy with some numbers overridden::

        m = Model.preset("llama-3.1-8b").replace(layers=4)
    """

    def __init__(self, name="", **kw):
        """A model named ``name`` with the numbers in ``kw`` (others 0)."""
        super().__init__(**kw)
        self.name = name

    @property
    def name(self):
        """The model's name (``str``)."""
        return _ModelC.name.__get__(self, type(self)).decode("utf-8", "replace")

    @name.setter
    def name(self, value):
        raw = value.encode() if isinstance(value, str) else bytes(value)
        if len(raw) >= 48:
            raise ValueError("model name longer than 47 bytes: %r" % value)
        _ModelC.name.__set__(self, raw)

    @classmethod
    def preset(cls, name):
        """Return the preset ``name`` (case-insensitive; see
        :func:`kvpull.presets`).  Raises :class:`kvpull.Error` (-ENOENT)
        for an unknown name."""
        from ._lib import lib
        from .errors import check
        m = cls()
        check(lib.kvp_model_preset(_cstr(name), ctypes.byref(m)),
              "kvp_model_preset", "unknown preset %r" % (name,))
        return m

    def replace(self, **kw):
        """Return a copy with the members in ``kw`` changed."""
        new = self.copy()
        for k, v in kw.items():
            if k != "name" and k not in dict(_ModelC._fields_):
                raise AttributeError("struct kvp_model has no member %r"
                                     % (k,))
            setattr(new, k, v)
        return new

    def to_dict(self):
        """Members as a dict, ``name`` as ``str``."""
        d = Struct.to_dict(self)
        d["name"] = self.name
        return d


def _cstr(s):
    if isinstance(s, str):
        s = s.encode()
    if b"\0" in s:
        raise ValueError("NUL in a name: %r" % (s,))
    return s


class EngineDesc(Struct):
    """``struct kvp_engine_desc``: how one engine runs a model (engine id,
    TP size and rank, block sizes, blocks per region, KV and conv
    layouts)."""
    _fields_ = [
        ("engine_id", c_uint64), ("tp_size", c_uint32), ("tp_rank", c_uint32),
        ("block_tokens", c_uint32), ("kernel_block_tokens", c_uint32),
        ("num_blocks", c_uint32), ("kv_layout", c_uint32),
        ("comp_mask", c_uint32), ("conv_layout", c_uint32),
    ]


# ---- plans ---------------------------------------------------------------


class PlanAttr(Struct):
    """``struct kvp_plan_attr``: ``max_sge`` (0 means 1), ``comp_mask``
    (which later members are set: ``PLAN_ATTR_MAX_LEN``,
    ``PLAN_ATTR_FLAGS``), ``max_len`` (bytes per READ; 0: 2^31) and
    ``flags`` (``PLAN_NO_COALESCE``)."""
    _fields_ = [("max_sge", c_uint32), ("comp_mask", c_uint32),
                ("max_len", c_uint32), ("flags", c_uint32)]


class Ids(Struct):
    """``struct kvp_ids``: one group's block ids of a request (pointers to
    ``uint32`` arrays).  Built by :class:`kvpull.Request`; not meant to be
    filled by hand."""
    _fields_ = [("local", POINTER(c_uint32)), ("remote", POINTER(c_uint32)),
                ("nlocal", c_uint32), ("nremote", c_uint32),
                ("tokens", c_uint64)]

    def to_dict(self):
        """Members as a dict (the pointers as integers, 0 for NULL)."""
        return {
            "local": ctypes.cast(self.local, c_void_p).value or 0,
            "remote": ctypes.cast(self.remote, c_void_p).value or 0,
            "nlocal": self.nlocal, "nremote": self.nremote,
            "tokens": self.tokens,
        }


class Wr(Struct):
    """``struct kvp_wr``: one RDMA READ (see :data:`WR_DTYPE`)."""
    _fields_ = [
        ("offset", c_uint64), ("len", c_uint32), ("region", c_uint32),
        ("src", c_uint32), ("sge_first", c_uint32), ("nsge", c_uint32),
        ("group", c_uint32),
    ]


class Sge(Struct):
    """``struct kvp_sge``: one local piece of a READ (see
    :data:`SGE_DTYPE`)."""
    _fields_ = [("offset", c_uint64), ("len", c_uint32), ("region", c_uint32)]


class EmitPos(Struct):
    """``struct kvp_emit_pos``: a position in one source's READs of one
    request (plain data: copy freely).  A zeroed position is finished."""
    _fields_ = [("stream", c_uint32), ("end", c_uint32), ("period", c_uint32),
                ("piece", c_uint32), ("src", c_uint32)]

    @property
    def done(self):
        """True when every READ of the position's source was written
        (``kvp_plan_emit_done()``)."""
        from ._lib import lib
        return lib.kvp_plan_emit_done(ctypes.byref(self)) == 1


class EmitMap(Struct):
    """``struct kvp_emit_map``: a region's address and key table (built by
    :class:`kvpull.EmitSink`)."""
    _fields_ = [("addr", c_uint64), ("key", POINTER(c_uint32)),
                ("shift", c_uint32), ("comp_mask", c_uint32)]

    def to_dict(self):
        """Members as a dict (the key pointer as an integer)."""
        return {"addr": self.addr,
                "key": ctypes.cast(self.key, c_void_p).value or 0,
                "shift": self.shift, "comp_mask": self.comp_mask}


class EmitSge(Struct):
    """``struct kvp_emit_sge``: ``struct ibv_sge``'s layout (see
    :data:`EMIT_SGE_DTYPE`)."""
    _fields_ = [("addr", c_uint64), ("length", c_uint32), ("key", c_uint32)]


class EmitSink(Struct):
    """``struct kvp_emit_sink``: where ``kvp_plan_emit_window_into()``
    writes (built by :class:`kvpull.EmitSink`)."""
    _fields_ = [
        ("wr", c_void_p), ("wr_stride", c_uint32), ("comp_mask", c_uint32),
        ("off_wr_id", c_uint32), ("off_sg_list", c_uint32),
        ("off_num_sge", c_uint32), ("off_remote_addr", c_uint32),
        ("off_rkey", c_uint32), ("wr_id", c_uint64),
        ("sge", POINTER(EmitSge)), ("local", POINTER(EmitMap)),
        ("remote", POINTER(EmitMap)),
    ]

    def to_dict(self):
        """Members as a dict (pointers as integers)."""
        d = {}
        for name, _t in self._fields_:
            v = getattr(self, name)
            if name in ("sge", "local", "remote"):
                v = ctypes.cast(v, c_void_p).value or 0
            elif name == "wr":
                v = v or 0
            d[name] = v
        return d


class Progress(Struct):
    """``struct kvp_progress``: how much of a request a producer wrote:
    tokens ``[0, tokens_all)`` in every layer, ``[tokens_all, tokens_cur)``
    in layers ``[0, layers_cur)`` (``TOKENS_END``: to the end)."""
    _fields_ = [("tokens_all", c_uint64), ("tokens_cur", c_uint64),
                ("layers_cur", c_uint32), ("comp_mask", c_uint32)]


class EmitRange(Struct):
    """``struct kvp_emit_range``: a part of a request: model layers
    ``[layer0, layer1)``, tokens ``(tok0, tok1]``."""
    _fields_ = [("layer0", c_uint32), ("layer1", c_uint32),
                ("tok0", c_uint64), ("tok1", c_uint64),
                ("comp_mask", c_uint32), ("pad", c_uint32)]


class PlanInfo(Struct):
    """``struct kvp_plan_info``: a plan's counts and parameters."""
    _fields_ = [
        ("ngroups", c_uint32), ("nsrc", c_uint32), ("nnotify", c_uint32),
        ("nstreams", c_uint32), ("npieces", c_uint32), ("local_tp", c_uint32),
        ("local_rank", c_uint32), ("remote_tp", c_uint32),
        ("max_sge", c_uint32), ("max_len", c_uint32), ("bytes", c_uint64),
    ]


class PlanGroup(Struct):
    """``struct kvp_plan_group``: one group of a plan (block sizes, period,
    id bounds, the sources serving it as a bit mask)."""
    _fields_ = [
        ("kind", c_uint32), ("local_tokens", c_uint32),
        ("remote_tokens", c_uint32), ("period_tokens", c_uint32),
        ("local_per_period", c_uint32), ("remote_per_period", c_uint32),
        ("local_blocks", c_uint32), ("remote_blocks", c_uint32),
        ("src_mask", c_uint64),
    ]


class PlanStream(Struct):
    """``struct kvp_plan_stream``: what one source reads for one (local
    view, remote view) pair."""
    _fields_ = [
        ("src", c_uint32), ("group", c_uint32), ("local_view", c_uint32),
        ("remote_view", c_uint32), ("local_region", c_uint32),
        ("remote_region", c_uint32), ("piece_first", c_uint32),
        ("npieces", c_uint32), ("bytes_per_period", c_uint64),
        ("layer", c_uint32), ("pad", c_uint32),
    ]


class PlanPiece(Struct):
    """``struct kvp_plan_piece``: a piece template of a period."""
    _fields_ = [("remote_offset", c_uint64), ("local_offset", c_uint64),
                ("len", c_uint32), ("remote_block", c_uint32),
                ("local_block", c_uint32)]


# ---- transport (agents) -------------------------------------------------


class AgentAttr(Struct):
    """``struct kvp_agent_attr``: how to open an agent (built by
    :class:`kvpull.Agent` from its keyword arguments; 0 and NULL members
    take the C defaults)."""
    _fields_ = [
        ("role", c_uint32), ("comp_mask", c_uint32), ("device", c_char_p),
        ("addr", c_char_p), ("layout", c_void_p), ("max_ids", c_uint32),
        ("max_inflight", c_uint32), ("max_peers", c_uint32),
        ("sq_depth", c_uint32), ("max_sge", c_uint32), ("secret", c_void_p),
        ("secret_len", c_uint32), ("max_per_source", c_uint32),
        ("handshake_ms", c_uint32), ("stall_ms", c_uint32),
        ("rq_depth", c_uint32), ("max_read", c_uint32),
        ("qps_per_peer", c_uint32), ("tos", c_uint32),
        ("plan_flags", c_uint32), ("max_mr", c_uint64),
        ("stream_events", c_uint32), ("max_qps", c_uint32),
        ("idle_ms", c_uint32), ("srq", c_uint32),
        ("read_window", c_uint32), ("read_window_bytes", c_uint32),
        # read only with comp_mask KVP_AGENT_ATTR_LOG (agent_attr()'s
        # log_fn sets it)
        ("log_fn", c_void_p), ("log_user", c_void_p),
        ("log_level", c_uint32),
    ]


class Peer(Struct):
    """``struct kvp_peer``: where producer rank i listens, and optionally
    its carried metadata blob (built by :class:`kvpull.Agent` from
    ``(addr, port[, meta])`` entries)."""
    _fields_ = [("addr", c_char_p), ("port", c_uint16), ("meta", c_void_p),
                ("meta_len", c_uint32)]


class _EngineInfoC(Struct):
    _fields_ = [
        ("state", c_uint32), ("status", c_int32), ("engine_id", c_uint64),
        ("tp_size", c_uint32), ("conns", c_uint32), ("qps", c_uint32),
        ("plan", c_void_p), ("plan_bytes", c_uint64),
        ("table_bytes", c_uint64), ("pulls", c_uint64), ("done", c_uint64),
        ("failed", c_uint64), ("reads", c_uint64), ("read_bytes", c_uint64),
        ("transport_failures", c_uint64), ("stalls", c_uint64),
        ("handshake_failures", c_uint64), ("reconnects", c_uint64),
        ("add_ns", c_uint64), ("plan_cached", c_uint32),
        ("reason", c_uint32), ("peer_reason", c_uint32),
        ("why", c_char * 128),
    ]


class EngineInfo(_EngineInfoC):
    """``struct kvp_engine_info``: a producer engine's state, counters and
    facts, as a consumer agent sees it (:meth:`kvpull.Agent.engine_info`).
    ``why`` reads as ``str``; ``state`` is an :class:`EngineState` value,
    ``reason`` and ``peer_reason`` :class:`Reason` values; ``plan`` is the
    borrowed ``kvp_plan *`` address (0: none yet; see
    :meth:`kvpull.Agent.plan`)."""

    @property
    def why(self):
        """The line for an operator of why the engine is DOWN (``str``)."""
        raw = _EngineInfoC.why.__get__(self, type(self))
        return raw.decode("utf-8", "replace")

    @why.setter
    def why(self, value):
        raw = value.encode() if isinstance(value, str) else bytes(value)
        if len(raw) >= 128:
            raise ValueError("why longer than 127 bytes")
        _EngineInfoC.why.__set__(self, raw)

    def to_dict(self):
        """Members as a dict (``why`` as ``str``, ``plan`` as an int)."""
        d = Struct.to_dict(self)
        d["why"] = self.why
        d["plan"] = self.plan or 0
        return d


class EventStruct(Struct):
    """``struct kvp_event``: one event of ``kvp_agent_poll()`` (the
    binding hands out :class:`kvpull.Event` objects made from these)."""
    _fields_ = [
        ("type", c_uint32), ("status", c_int32), ("req_id", c_uint64),
        ("engine_id", c_uint64), ("rank", c_uint32), ("ngroups", c_uint32),
        ("ids", POINTER(Ids)), ("engine", c_uint32), ("reads", c_uint32),
        ("bytes", c_uint64), ("elapsed_ns", c_uint64), ("reason", c_uint32),
        ("peer_reason", c_uint32), ("layers", c_uint32),
    ]

    def to_dict(self):
        """Members as a dict (the ids pointer as an integer)."""
        d = Struct.to_dict(self)
        d["ids"] = ctypes.cast(self.ids, c_void_p).value or 0
        return d


class AgentStats(Struct):
    """``struct kvp_agent_stats``: an agent's counters since open
    (:meth:`kvpull.Agent.stats`)."""
    _fields_ = [(name, c_uint64) for name in (
        "pulls", "done", "failed", "reads", "read_bytes", "doorbells",
        "queued", "notes_sent", "notes_recv", "notes_dropped", "released",
        "expired", "connects", "disconnects", "refused",
        "transport_failures", "stalls", "handshake_failures", "reconnects",
        "credit_waits", "plan_compiles", "plan_hits", "probes",
        "rnr_timer_unset", "striped", "dmabuf_fallbacks", "async_errors",
        "publishes", "follows", "progress_writes", "progress_seen",
        "arrivals", "mem_bytes", "peers", "qps", "evictions",
        "idle_closes", "srq_bufs", "credit_abuses", "credit_gives", "srq_last_wqe",
        "lease_reads", "lease_fails", "unheld", "lease_full")]


def _dtype(cls):
    """A numpy dtype with the struct's member names, offsets and size."""
    names, formats, offsets = [], [], []
    for name, ctype in cls._fields_:
        names.append(name)
        formats.append(np.dtype(ctype))
        offsets.append(getattr(cls, name).offset)
    return np.dtype({"names": names, "formats": formats, "offsets": offsets,
                     "itemsize": ctypes.sizeof(cls)})


#: numpy dtype of ``struct kvp_wr`` (32 bytes): ``offset`` (u8),
#: ``len``, ``region``, ``src``, ``sge_first``, ``nsge``, ``group`` (u4).
WR_DTYPE = _dtype(Wr)
#: numpy dtype of ``struct kvp_sge`` (16 bytes): ``offset`` (u8), ``len``,
#: ``region`` (u4).
SGE_DTYPE = _dtype(Sge)
#: numpy dtype of ``struct kvp_emit_sge`` (``struct ibv_sge``, 16 bytes):
#: ``addr`` (u8), ``length``, ``key`` (u4).
EMIT_SGE_DTYPE = _dtype(EmitSge)

#: numpy dtype of ``struct kvp_plan_stream`` (:meth:`Plan.streams_array`).
STREAM_DTYPE = _dtype(PlanStream)
#: numpy dtype of ``struct kvp_plan_piece`` (:meth:`Plan.pieces_array`).
PIECE_DTYPE = _dtype(PlanPiece)

#: The C name of each mirrored struct.
class LogRecord(Struct):
    """``struct kvp_log_record``: what the C log callback
    (``kvp_agent_attr.log_fn``) is handed; mirrored for the ABI check."""
    _fields_ = [
        ("kind", c_uint32), ("level", c_uint32), ("time_ns", c_uint64),
        ("status", c_int32), ("reason", c_uint32),
        ("peer_reason", c_uint32), ("rank", c_uint32),
        ("req_id", c_uint64), ("engine_id", c_uint64),
        ("engine", c_uint32), ("stream", c_uint32), ("bytes", c_uint64),
        ("reads", c_uint32), ("pad", c_uint32), ("elapsed_ns", c_uint64),
        ("peer_addr", c_char_p), ("line", c_char_p),
    ]


STRUCTS = {
    Dim: "struct kvp_dim", FieldDesc: "struct kvp_field_desc",
    GroupDesc: "struct kvp_group_desc", ViewDesc: "struct kvp_view_desc",
    LayoutAttr: "struct kvp_layout_attr",
    LayoutInfo: "struct kvp_layout_info", Model: "struct kvp_model",
    EngineDesc: "struct kvp_engine_desc", PlanAttr: "struct kvp_plan_attr",
    Ids: "struct kvp_ids", Wr: "struct kvp_wr", Sge: "struct kvp_sge",
    EmitPos: "struct kvp_emit_pos", EmitMap: "struct kvp_emit_map",
    EmitSge: "struct kvp_emit_sge", EmitSink: "struct kvp_emit_sink",
    Progress: "struct kvp_progress", EmitRange: "struct kvp_emit_range",
    PlanInfo: "struct kvp_plan_info", PlanGroup: "struct kvp_plan_group",
    PlanStream: "struct kvp_plan_stream", PlanPiece: "struct kvp_plan_piece",
    AgentAttr: "struct kvp_agent_attr", Peer: "struct kvp_peer",
    EngineInfo: "struct kvp_engine_info", EventStruct: "struct kvp_event",
    AgentStats: "struct kvp_agent_stats",
    LogRecord: "struct kvp_log_record",
}

