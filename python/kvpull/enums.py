# SPDX-License-Identifier: MIT
"""The enums and constants of kvpull.h.

Each enum is an :class:`enum.IntEnum` whose members carry the C values
(``FieldKind.CONV_X == KVP_FIELD_CONV_X``); ``str()`` of a member is the
lower-case name the tools and spec files use (``"conv_x"``, ``"flash_hnd"``),
and :meth:`_Named.parse` accepts a member, an int or such a name in any
case.  ``tests/python/test_abi.py`` checks every value against the header.
"""
import enum

__all__ = [
    "Axis", "FieldKind", "GroupKind", "KvLayout", "StateKind", "ConvLayout",
    "Reason", "Role", "EventType", "EngineState", "PLAN_ATTR_MAX_LEN",
    "PLAN_ATTR_FLAGS", "PLAN_NO_COALESCE",
    "MAX_DIMS", "NO_SHARD", "MAX_TP_SIZE", "MR_SHIFT_MIN", "MR_SHIFT_MAX",
    "MR_MAX_KEYS", "META_VERSION", "META_VERSION_KEYS", "META_MIN_LEN",
    "MAX_LAYERS", "PLAN_MAX_WORK", "TOKENS_END", "WHY_LEN",
    "DEFAULT_MAX_SGE", "DEFAULT_MAX_READ", "VERSION", "mr_window",
    "MR_MIN", "SECRET_MIN", "SECRET_MAX", "AGENT_FDS", "IDLE_NEVER",
    "SRQ_OFF",
]


class _Named(enum.IntEnum):
    """An IntEnum whose ``str()`` is the tools' lower-case name."""

    def __str__(self):
        return self.name.lower()

    @classmethod
    def parse(cls, value):
        """Return the member for ``value``: a member, an int, or a name in
        any case (``"flash_hnd"``, ``"K"``).  Raises :class:`ValueError`
        for anything else."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            try:
                return cls[value.upper()]
            except KeyError:
                raise ValueError("unknown %s %r (want one of %s)" % (
                    cls.__name__, value,
                    ", ".join(str(m) for m in cls))) from None
        return cls(int(value))


def _name(cls, value):
    """The tools' name of ``value`` in enum ``cls``, ``"?"`` if none."""
    try:
        return str(cls(value))
    except ValueError:
        return "?"


class Axis(_Named):
    """``enum kvp_axis``: the named axis of a field's dim."""
    TOKEN = 0
    HEAD = 1
    DIM = 2
    CHANNEL = 3
    STATE = 4
    AUX = 5


class FieldKind(_Named):
    """``enum kvp_field_kind``: a field's name in a byte's identity."""
    K = 0
    V = 1
    LATENT = 2
    CONV_X = 3
    CONV_B = 4
    CONV_C = 5
    SSM = 6
    CONV_Q = 7
    CONV_K = 8
    CONV_V = 9


class GroupKind(_Named):
    """``enum kvp_group_kind``: full attention, sliding window, MLA, state."""
    FULL = 0
    SLIDING = 1
    MLA = 2
    STATE = 3


class KvLayout(_Named):
    """``enum kvp_kv_layout``: KV memory layouts engines use."""
    FLASH_NHD = 0
    FLASH_HND = 1
    FLASHINFER = 2
    PACKED = 3


class StateKind(_Named):
    """``enum kvp_state_kind``: state layers of hybrid models."""
    NONE = 0
    MAMBA2 = 1
    GDN = 2


class ConvLayout(_Named):
    """``enum kvp_conv_layout``: conv state order (``ds`` is vLLM's)."""
    DS = 0
    SD = 1


class Reason(_Named):
    """``enum kvp_reason``: why a call, a handshake or a transfer was
    refused (``kvp_reason_str()`` describes each: :meth:`describe`)."""
    NONE = 0
    MALFORMED = 1
    TP_SIZE = 2
    RANK = 3
    ENGINE_ID = 4
    MODEL = 5
    LAYOUT = 6
    PLAN_COST = 7
    CARRIED = 8
    AUTH = 9
    PEER_FULL = 10
    MR_WINDOW = 11
    UNREACHABLE = 12
    TIMEOUT = 13
    PEER_REFUSED = 14
    TRANSPORT = 15
    STALL = 16
    CLOSED = 17
    REMOVED = 18
    DEVICE = 19
    ARGS = 20
    IDS_UNEVEN = 21
    IDS_MAX = 22
    IDS_TOKENS = 23
    IDS_RANGE = 24
    NO_ENGINE = 25
    IN_FLIGHT = 26
    BUSY = 27
    NOT_UP = 28
    OTHER_ENGINE = 29
    EVICTED = 30
    LEASE = 31
    VERSION = 32

    def describe(self):
        """The library's description of this reason (``kvp_reason_str``)."""
        from ._lib import lib
        return lib.kvp_reason_str(int(self)).decode()


class Role(_Named):
    """``enum kvp_role``: what an agent does (``"producer"``,
    ``"consumer"``, ``"both"``)."""
    PRODUCER = 0
    CONSUMER = 1
    BOTH = 2


class EventType(_Named):
    """``enum kvp_event_type``: what :meth:`kvpull.Agent.poll` reports."""
    DONE = 1
    FAILED = 2
    RELEASED = 3
    EXPIRED = 4
    DISCONNECTED = 5
    ENGINE_UP = 6
    ENGINE_DOWN = 7
    ARRIVED = 8


class EngineState(_Named):
    """``enum kvp_engine_state``: a producer engine as a consumer agent
    sees it (:attr:`kvpull.EngineInfo.state`)."""
    CONNECTING = 1
    UP = 2
    FAILING = 3
    DOWN = 4


class LogLevel(_Named):
    """``enum kvp_log_level``: a log record's level (the C log callback's
    filter)."""
    ERROR = 1
    WARNING = 2
    INFO = 3
    DEBUG = 4


class LogKind(_Named):
    """``enum kvp_log_kind``: what a log record reports
    (``kvp_log_kind_str()`` names it)."""
    REFUSED = 1
    EVICTED = 2
    IDLE_CLOSED = 3
    PULL_STARTED = 4
    PULL_COMPLETED = 5
    PULL_FAILED = 6
    PULL_ARRIVED = 7
    ENGINE_UP = 8
    ENGINE_DOWN = 9
    DISCONNECTED = 10
    RELEASED = 11
    EXPIRED = 12


#: ``enum kvp_*_COUNT`` values, by enum class (checked against the header;
#: ``enum kvp_event_type`` and ``enum kvp_engine_state`` have none).
COUNTS = {Axis: 6, FieldKind: 10, GroupKind: 4, KvLayout: 4, StateKind: 3,
          ConvLayout: 2, Reason: 33, Role: 3}

#: ``kvp_plan_attr.comp_mask`` bits.
PLAN_ATTR_MAX_LEN = 1 << 0
PLAN_ATTR_FLAGS = 1 << 1
#: ``kvp_plan_attr.flags``: one READ of one SGE per piece (a benchmark aid).
PLAN_NO_COALESCE = 1 << 0

MAX_DIMS = 6
NO_SHARD = 0xFF
MAX_TP_SIZE = 1024
MR_SHIFT_MIN = 15
MR_SHIFT_MAX = 62
MR_MAX_KEYS = 1 << 20
META_VERSION = 1
META_VERSION_KEYS = 2
META_MIN_LEN = 248
MAX_LAYERS = 4096
PLAN_MAX_WORK = 1 << 16
TOKENS_END = (1 << 64) - 1
WHY_LEN = 128
DEFAULT_MAX_SGE = 16
DEFAULT_MAX_READ = 1 << 31
#: ``KVP_MR_MIN``: the smallest ``max_mr`` an agent takes (64 KiB).
MR_MIN = 1 << 16
#: ``KVP_SECRET_MIN``, ``KVP_SECRET_MAX``: a shared secret's length bounds.
SECRET_MIN = 16
SECRET_MAX = 256

#: ``KVP_IDLE_NEVER``: ``idle_ms`` of a producer that never drops idle
#: consumer ranks.
IDLE_NEVER = 0xFFFFFFFF
#: ``KVP_SRQ_OFF``: ``srq`` of a producer that gives each queue pair its
#: own receive queue rather than one shared receive queue.
SRQ_OFF = 1
#: ``KVP_AGENT_FDS``: the file descriptors an agent has to sleep on.
AGENT_FDS = 3
#: ``kvp_agent_attr.comp_mask``: the log fields are set.
AGENT_ATTR_LOG = 1 << 0
#: ``kvp_agent_metrics()``'s formats.
METRICS_TEXT = 0
METRICS_JSON = 1
#: The header's version (KVP_VERSION_MAJOR, _MINOR, _PATCH).
VERSION = (0, 2, 0)


def mr_window(shift):
    """``KVP_MR_WINDOW(shift)``: bytes by which the MRs of a region
    registered in pieces of 2^shift bytes overlap."""
    return 1 << (shift - 3)
