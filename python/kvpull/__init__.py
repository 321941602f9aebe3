# SPDX-License-Identifier: MIT
"""kvpull: pull KV-cache blocks between LLM inference engines with RDMA
READs -- the Python binding (ctypes over libkvpull, no compiled code).

It covers the whole of ``kvpull.h``: the planning half (no RDMA device
needed) -- model presets and engine descriptions, layouts (built, parsed
from spec text, encoded to and decoded from metadata blobs), plan
compilation, inspection and dumps, emission of a request's READs into numpy
arrays -- and the transport, :class:`Agent` (open, register memory, listen,
add engines, expect, pull, publish, poll :class:`Event` objects, sleep on
``fileno()``)::

    import numpy as np, kvpull

    remote = kvpull.Layout.build("llama-3.1-70b", tp_size=8, block_tokens=16,
                                 num_blocks=100000, kv_layout="flash_hnd")
    local = kvpull.Layout.build("llama-3.1-70b", tp_size=2, block_tokens=16,
                                num_blocks=100000, kv_layout="flash_hnd")
    with kvpull.Plan.compile(local, remote, max_sge=16) as plan:
        ids = np.arange(128, dtype=np.uint32)
        wrs, sges = plan.emit([(ids, ids)])    # numpy structured arrays

    with kvpull.Agent(local, "consumer") as agent:   # an RDMA device
        agent.register_all(kv_regions)              # numpy arrays
        engine = agent.add_engine([(addr, port + r) for r in range(8)])
        ...                                         # ENGINE_UP, then
        agent.pull_from(engine, req_id, [(ids, ids)])
        events = agent.poll(timeout=1.0)            # DONE

Errors raise :class:`Error` (an :class:`OSError`) carrying the C code and
the library's reason.  See python/README.md.
"""
from ._lib import find_library, lib, lib_path
from ._structs import (EMIT_SGE_DTYPE, PIECE_DTYPE, SGE_DTYPE,
                       STREAM_DTYPE, WR_DTYPE, AgentAttr, AgentStats, Dim,
                       EmitMap, EmitPos, EmitRange, EmitSge, EngineDesc,
                       EngineInfo, EventStruct, FieldDesc, GroupDesc, Ids,
                       LayoutAttr, LayoutInfo, Model, Peer, PlanAttr,
                       PlanGroup, PlanInfo, PlanPiece, PlanStream, Progress,
                       Sge, Struct, ViewDesc, Wr)
from .enums import (AGENT_FDS, DEFAULT_MAX_READ, DEFAULT_MAX_SGE, MAX_DIMS,
                    MAX_LAYERS, MAX_TP_SIZE, META_MIN_LEN, META_VERSION,
                    META_VERSION_KEYS, MR_MAX_KEYS, MR_MIN, MR_SHIFT_MAX,
                    MR_SHIFT_MIN, NO_SHARD, PLAN_ATTR_FLAGS,
                    PLAN_ATTR_MAX_LEN, PLAN_MAX_WORK, PLAN_NO_COALESCE,
                    IDLE_NEVER, SECRET_MAX, SECRET_MIN, SRQ_OFF,
                    TOKENS_END,
                    WHY_LEN, Axis,
                    ConvLayout, EngineState, EventType, FieldKind,
                    GroupKind, KvLayout, Reason, Role, StateKind, mr_window)
from .errors import Error, reason_str, strerror
from .layout import Layout, presets, shard_range
from .plan import (EmitBuffers, Emission, EmitSink, GroupIds, Plan,
                   RegionMap, Request, Window, emit_range, notify_expected,
                   progress_ranges)
from .agent import (ATTR_DEFAULTS, WAKE_NONE, Agent, Event, agent_attr,
                    pack_ids)

#: This package's version (the library it wraps: :func:`version`).
__version__ = "0.2.0"


def version():
    """The loaded library's version, ``(major, minor, patch)``
    (``kvp_version()``)."""
    v = lib.kvp_version()
    return (v >> 16, (v >> 8) & 0xFF, v & 0xFF)


__all__ = [
    # library
    "lib", "lib_path", "find_library", "version", "__version__",
    # errors
    "Error", "strerror", "reason_str",
    # enums and constants
    "Axis", "FieldKind", "GroupKind", "KvLayout", "StateKind", "ConvLayout",
    "Reason", "MAX_DIMS", "NO_SHARD", "MAX_TP_SIZE", "MR_SHIFT_MIN",
    "MR_SHIFT_MAX", "MR_MAX_KEYS", "META_VERSION", "META_VERSION_KEYS",
    "META_MIN_LEN", "MAX_LAYERS", "PLAN_MAX_WORK", "TOKENS_END", "WHY_LEN",
    "DEFAULT_MAX_SGE", "DEFAULT_MAX_READ", "PLAN_ATTR_MAX_LEN",
    "PLAN_ATTR_FLAGS", "PLAN_NO_COALESCE", "mr_window", "Role", "EventType",
    "EngineState", "MR_MIN", "SECRET_MIN", "SECRET_MAX", "AGENT_FDS",
    "IDLE_NEVER", "SRQ_OFF",
    # structs and dtypes
    "Struct", "Dim", "FieldDesc", "GroupDesc", "ViewDesc", "LayoutAttr",
    "LayoutInfo", "Model", "EngineDesc", "PlanAttr", "Ids", "Wr", "Sge",
    "EmitPos", "EmitMap", "EmitSge", "Progress", "EmitRange", "PlanInfo",
    "PlanGroup", "PlanStream", "PlanPiece", "WR_DTYPE", "SGE_DTYPE",
    "EMIT_SGE_DTYPE", "STREAM_DTYPE", "PIECE_DTYPE", "AgentAttr", "Peer",
    "EngineInfo", "EventStruct", "AgentStats",
    # layouts
    "Layout", "presets", "shard_range",
    # plans
    "Plan", "Request", "GroupIds", "Emission", "EmitBuffers", "Window",
    "EmitSink", "RegionMap", "emit_range", "progress_ranges",
    "notify_expected",
    # agents
    "Agent", "Event", "agent_attr", "pack_ids", "ATTR_DEFAULTS",
    "WAKE_NONE",
]
