# SPDX-License-Identifier: MIT
"""Loading libkvpull and declaring the C prototypes (internal).

The shared library is found, in order, at ``$KVPULL_LIB`` (a path), at
``build/libkvpull.so.0`` of the source tree this package sits in (when run
from ``python/`` of a kvpull checkout), and by
``ctypes.util.find_library('kvpull')`` (an installed library).  Calls go
through :class:`ctypes.CDLL`, which releases the GIL for the duration of
every C call.
"""
import ctypes
import ctypes.util
import os
from ctypes import (POINTER, c_char_p, c_int, c_size_t, c_uint16, c_uint32,
                    c_uint64, c_void_p)

from . import _structs as S

__all__ = ["lib", "lib_path", "find_library"]


def find_library():
    """Return the path of the libkvpull shared library this package loads.

    ``$KVPULL_LIB`` wins when set; then ``build/libkvpull.so.0`` of the
    repository this package is part of; then the system's library search
    (``ctypes.util.find_library('kvpull')``).  Raises :class:`OSError` when
    none is found.
    """
    env = os.environ.get("KVPULL_LIB")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(here))
    tree = os.path.join(repo, "build", "libkvpull.so.0")
    if os.path.isfile(os.path.join(repo, "include", "kvpull.h")) and \
            os.path.isfile(tree):
        return tree
    found = ctypes.util.find_library("kvpull")
    if found:
        return found
    raise OSError("libkvpull not found: set KVPULL_LIB, build the tree "
                  "(make), or install the library (make install)")


lib_path = find_library()
lib = ctypes.CDLL(lib_path)

_p = c_void_p          # opaque handles and untyped buffers
_u32 = c_uint32
_u64 = c_uint64
_pu32 = POINTER(c_uint32)
_pu64 = POINTER(c_uint64)


def _proto(name, restype, *argtypes):
    fn = getattr(lib, name)
    fn.restype = restype
    fn.argtypes = list(argtypes)
    return fn


_PROTOS = [
    ("kvp_version", _u32),
    ("kvp_strerror", c_char_p, c_int),
    ("kvp_reason_str", c_char_p, _u32),
    ("kvp_shard_range", c_int, _u32, _u32, _u32, _pu32, _pu32),
    # layouts
    ("kvp_layout_create", c_int, POINTER(S.LayoutAttr), POINTER(_p)),
    ("kvp_layout_destroy", None, _p),
    ("kvp_layout_clone", c_int, _p, POINTER(_p)),
    ("kvp_layout_add_group", c_int, _p, POINTER(S.GroupDesc), _pu32),
    ("kvp_layout_add_region", c_int, _p, _u64, _pu32),
    ("kvp_layout_add_view", c_int, _p, POINTER(S.ViewDesc), _pu32),
    ("kvp_layout_add_field", c_int, _p, _u32, POINTER(S.FieldDesc)),
    ("kvp_layout_get_info", None, _p, POINTER(S.LayoutInfo)),
    ("kvp_layout_get_group", c_int, _p, _u32, POINTER(S.GroupDesc)),
    ("kvp_layout_get_region", c_int, _p, _u32, _pu64),
    ("kvp_layout_get_view", c_int, _p, _u32, POINTER(S.ViewDesc)),
    ("kvp_layout_get_field", c_int, _p, _u32, _pu32, POINTER(S.FieldDesc)),
    ("kvp_layout_compat_hash", _u64, _p),
    ("kvp_layout_set_region_key", c_int, _p, _u32, _u64, _u32),
    ("kvp_layout_get_region_key", c_int, _p, _u32, _pu64, _pu32),
    ("kvp_layout_set_region_keys", c_int, _p, _u32, _u64, _u32, _p, _u32),
    ("kvp_layout_get_region_keys", c_int, _p, _u32, _pu64, _pu32, _p, _u32),
    ("kvp_meta_encode", c_int, _p, _p, c_size_t, POINTER(c_size_t)),
    ("kvp_meta_decode", c_int, _p, c_size_t, POINTER(_p)),
    ("kvp_model_preset", c_int, c_char_p, POINTER(S.Model)),
    ("kvp_model_preset_name", c_char_p, _u32),
    ("kvp_layout_build", c_int, POINTER(S.Model), POINTER(S.EngineDesc),
     POINTER(_p)),
    ("kvp_layout_build_msg", c_int, POINTER(S.Model), POINTER(S.EngineDesc),
     POINTER(_p), _p, c_size_t),
    ("kvp_layout_parse", c_int, _p, c_size_t, POINTER(_p), _p, c_size_t),
    # plans
    ("kvp_plan_compile", c_int, _p, _p, POINTER(S.PlanAttr), POINTER(_p),
     _p, c_size_t),
    ("kvp_plan_destroy", None, _p),
    ("kvp_plan_emit_bound", None, _p, _u32, _pu32, _pu32),
    ("kvp_plan_emit", c_int, _p, _p, _p, _u32, _p, _u32, _p),
    ("kvp_plan_emit_check", c_int, _p, _p),
    ("kvp_plan_emit_start", c_int, _p, _p, _u32, POINTER(S.EmitPos)),
    ("kvp_plan_emit_window", c_int, _p, _p, POINTER(S.EmitPos), _p, _u32,
     _p, _u32, _pu64),
    ("kvp_plan_emit_window_into", c_int, _p, _p, POINTER(S.EmitPos),
     POINTER(S.EmitSink), _u32, _u32, _pu32, _pu64),
    ("kvp_progress_ranges", c_int, POINTER(S.Progress), POINTER(S.Progress),
     POINTER(S.EmitRange)),
    ("kvp_plan_emit_range_start", c_int, _p, _p, _u32, POINTER(S.EmitRange),
     POINTER(S.EmitPos)),
    ("kvp_plan_emit_range_window", c_int, _p, _p, POINTER(S.EmitRange),
     POINTER(S.EmitPos), _p, _u32, _p, _u32, _pu64),
    ("kvp_plan_emit_range_window_into", c_int, _p, _p, POINTER(S.EmitRange),
     POINTER(S.EmitPos), POINTER(S.EmitSink), _u32, _u32, _pu32, _pu64),
    ("kvp_plan_emit_done", c_int, POINTER(S.EmitPos)),
    ("kvp_plan_get_info", None, _p, POINTER(S.PlanInfo)),
    ("kvp_plan_source", c_int, _p, _u32),
    ("kvp_plan_notify", c_int, _p, _u32),
    ("kvp_plan_get_group", c_int, _p, _u32, _p),       # PlanGroup *
    ("kvp_plan_get_stream", c_int, _p, _u32, _p),      # PlanStream *
    ("kvp_plan_stream_gather", c_int, _p, _u32),
    ("kvp_plan_get_piece", c_int, _p, _u32, _p),       # PlanPiece *
    ("kvp_notify_expected", c_int, _p, _p, _u32),
    # agents (the transport); events, ids and buffers go as addresses
    ("kvp_agent_open", c_int, POINTER(S.AgentAttr), POINTER(_p)),
    ("kvp_agent_close", None, _p),
    ("kvp_agent_register", c_int, _p, _u32, _p, _u64),
    ("kvp_agent_register_dmabuf", c_int, _p, _u32, c_int, _u64, _u64, _p),
    ("kvp_agent_listen", c_int, _p, c_char_p, c_uint16),
    ("kvp_agent_get_meta", c_int, _p, _p, c_size_t, POINTER(c_size_t)),
    ("kvp_agent_connect", c_int, _p, POINTER(S.Peer), _u32, c_int),
    ("kvp_agent_last_error", _u32, _p, _p, c_size_t),
    ("kvp_agent_plan", _p, _p),
    ("kvp_agent_pull", c_int, _p, _u64, _p),              # struct kvp_ids *
    ("kvp_agent_add_engine", c_int, _p, POINTER(S.Peer), _u32, _u32, _pu32),
    ("kvp_agent_reconnect_engine", c_int, _p, _u32, POINTER(S.Peer), _u32,
     _u32),
    ("kvp_agent_remove_engine", c_int, _p, _u32),
    ("kvp_agent_pull_from", c_int, _p, _u32, _u64, _p),
    ("kvp_agent_pull_stream", c_int, _p, _u32, _u64, _p),
    ("kvp_agent_engine_info", c_int, _p, _u32, POINTER(S.EngineInfo)),
    ("kvp_agent_engine_layout", c_int, _p, _u32, _u32, POINTER(_p)),
    ("kvp_agent_expect", c_int, _p, _u64, _u64, _u64),
    ("kvp_agent_publish", c_int, _p, _u64, _u64, POINTER(S.Progress)),
    ("kvp_agent_poll", c_int, _p, _p, c_int),             # struct kvp_event *
    ("kvp_agent_fds", c_int, _p, POINTER(c_int), c_int),
    ("kvp_agent_arm", c_int, _p, _pu64),
    ("kvp_agent_get_stats", None, _p, POINTER(S.AgentStats)),
    ("kvp_agent_metrics", c_int, _p, _u32, _p, c_size_t),  # char *buf
    ("kvp_log_kind_str", c_char_p, _u32),
]

for _entry in _PROTOS:
    _proto(*_entry)
del _entry

#: The library release (major, minor) whose structs _structs.py mirrors.
#: Before 1.0 a minor release may change them (docs/versions.md): a
#: library of another one is refused here rather than misread.
ABI = (0, 2)


def check_abi(version):
    """Raise ImportError unless ``version`` (``kvp_version()``'s value)
    is of the release :data:`ABI` names."""
    got = (version >> 16, (version >> 8) & 0xff)
    if got != ABI:
        raise ImportError(
            "%s is kvpull %d.%d.%d; this binding mirrors kvpull %d.%d's "
            "structs: load a library of that release (KVPULL_LIB)"
            % (lib_path, got[0], got[1], version & 0xff, ABI[0], ABI[1]))


check_abi(lib.kvp_version())
