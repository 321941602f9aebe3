# SPDX-License-Identifier: MIT
"""The ctypes mirrors against the C compiler: every struct's size and every
member's offset, every enum value and constant, compiled from
include/kvpull.h with cc; and every function of the header, plan-level and
agent, has a prototype that the package calls."""
import ctypes
import os
import re
import shutil
import struct
import subprocess

import numpy as np
import pytest

from conftest import REPO

import kvpull
from kvpull import _lib, _structs as S, enums as E
from kvpull.plan import _IDS
from kvpull import agent as A

HEADER = os.path.join(REPO, "include", "kvpull.h")

ENUM_PREFIX = {
    E.Axis: ("KVP_AXIS_", "KVP_AXIS_COUNT"),
    E.FieldKind: ("KVP_FIELD_", "KVP_FIELD_KIND_COUNT"),
    E.GroupKind: ("KVP_GROUP_", "KVP_GROUP_KIND_COUNT"),
    E.KvLayout: ("KVP_KV_", "KVP_KV_LAYOUT_COUNT"),
    E.StateKind: ("KVP_STATE_", "KVP_STATE_KIND_COUNT"),
    E.ConvLayout: ("KVP_CONV_", "KVP_CONV_LAYOUT_COUNT"),
    E.Reason: ("KVP_REASON_", "KVP_REASON_COUNT"),
    E.Role: ("KVP_ROLE_", "KVP_ROLE_COUNT"),
    # no _COUNT in the header for these
    E.EventType: ("KVP_EV_", None),
    E.EngineState: ("KVP_ENGINE_", None),
    E.LogLevel: ("KVP_LOG_", None),
    E.LogKind: ("KVP_LOG_", None),
}

CONSTANTS = {
    "KVP_MAX_DIMS": E.MAX_DIMS, "KVP_NO_SHARD": E.NO_SHARD,
    "KVP_MAX_TP_SIZE": E.MAX_TP_SIZE, "KVP_MR_SHIFT_MIN": E.MR_SHIFT_MIN,
    "KVP_MR_SHIFT_MAX": E.MR_SHIFT_MAX, "KVP_MR_MAX_KEYS": E.MR_MAX_KEYS,
    "KVP_META_VERSION": E.META_VERSION,
    "KVP_META_VERSION_KEYS": E.META_VERSION_KEYS,
    "KVP_META_MIN_LEN": E.META_MIN_LEN, "KVP_MAX_LAYERS": E.MAX_LAYERS,
    "KVP_PLAN_MAX_WORK": E.PLAN_MAX_WORK, "KVP_TOKENS_END": E.TOKENS_END,
    "KVP_WHY_LEN": E.WHY_LEN, "KVP_DEFAULT_MAX_SGE": E.DEFAULT_MAX_SGE,
    "KVP_DEFAULT_MAX_READ": E.DEFAULT_MAX_READ,
    "KVP_PLAN_ATTR_MAX_LEN": E.PLAN_ATTR_MAX_LEN,
    "KVP_PLAN_ATTR_FLAGS": E.PLAN_ATTR_FLAGS,
    "KVP_PLAN_NO_COALESCE": E.PLAN_NO_COALESCE,
    "KVP_VERSION_MAJOR": E.VERSION[0], "KVP_VERSION_MINOR": E.VERSION[1],
    "KVP_VERSION_PATCH": E.VERSION[2],
    "KVP_MR_WINDOW(20)": E.mr_window(20),
    "KVP_MR_MIN": E.MR_MIN, "KVP_SECRET_MIN": E.SECRET_MIN,
    "KVP_SECRET_MAX": E.SECRET_MAX, "KVP_AGENT_FDS": E.AGENT_FDS,
    "KVP_IDLE_NEVER": E.IDLE_NEVER,
    "KVP_AGENT_ATTR_LOG": E.AGENT_ATTR_LOG,
    "KVP_METRICS_TEXT": E.METRICS_TEXT, "KVP_METRICS_JSON": E.METRICS_JSON,
}


def _python_facts():
    """What the package says: name -> int, in the C program's terms."""
    facts = {}
    for cls, cname in S.STRUCTS.items():
        facts["sizeof(%s)" % cname] = ctypes.sizeof(cls)
        # the class that declares the members (Model wraps its name)
        decl = next(c for c in cls.__mro__ if "_fields_" in c.__dict__)
        for name, _t in cls._fields_:
            facts["offsetof(%s, %s)" % (cname, name)] = \
                decl.__dict__[name].offset
    for cls, (prefix, count) in ENUM_PREFIX.items():
        for m in cls:
            facts[prefix + m.name] = int(m)
        if count is not None:
            facts[count] = E.COUNTS[cls]
            assert len(cls) == E.COUNTS[cls]
        else:
            assert cls not in E.COUNTS
    facts.update(CONSTANTS)
    return facts


@pytest.fixture(scope="module")
def c_facts(tmp_path_factory):
    """The same facts printed by a C program compiled against the header."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.fail("no C compiler (cc) to check the ABI with")
    d = tmp_path_factory.mktemp("abi")
    names = list(_python_facts())
    src = ["#include <stddef.h>", "#include <stdio.h>",
           '#include "kvpull.h"', "int main(void)", "{"]
    for n in names:
        src.append('\tprintf("%%s=%%llu\\n", "%s", '
                   "(unsigned long long)(%s));" % (n, n))
    src += ["\treturn 0;", "}"]
    (d / "abi.c").write_text("\n".join(src) + "\n")
    exe = d / "abi"
    subprocess.run([cc, "-std=gnu11", "-Wall", "-Werror",
                    "-I" + os.path.join(REPO, "include"), "-o", str(exe),
                    str(d / "abi.c")], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True,
                         text=True).stdout
    facts = {}
    for line in out.splitlines():
        k, v = line.rsplit("=", 1)
        facts[k] = int(v)
    assert len(facts) == len(names)
    return facts


def test_structs_enums_constants_match_c(c_facts):
    py = _python_facts()
    diff = {k: (py[k], c_facts[k]) for k in py if py[k] != c_facts[k]}
    assert diff == {}
    # a few pinned sizes, so a wrong header cannot agree with itself
    assert c_facts["sizeof(struct kvp_wr)"] == 32
    assert c_facts["sizeof(struct kvp_sge)"] == 16
    assert c_facts["sizeof(struct kvp_ids)"] == 32
    assert c_facts["sizeof(struct kvp_emit_pos)"] == 20
    assert c_facts["sizeof(struct kvp_field_desc)"] == 128
    assert c_facts["sizeof(struct kvp_model)"] == 108
    assert c_facts["sizeof(struct kvp_event)"] == 80
    assert c_facts["sizeof(struct kvp_engine_info)"] == 280
    assert c_facts["sizeof(struct kvp_agent_stats)"] == 45 * 8
    assert c_facts["sizeof(struct kvp_peer)"] == 32


def test_every_struct_is_mirrored():
    text = open(HEADER).read()
    declared = set(re.findall(r"^struct (kvp_\w+) \{", text, re.M))
    mirrored = {c.split()[1] for c in S.STRUCTS.values()}
    assert declared == mirrored
    transport = text[text.index("---- Transport (verbs/) ----"):]
    assert {"kvp_agent_attr", "kvp_peer", "kvp_engine_info", "kvp_event",
            "kvp_agent_stats", "kvp_log_record"} == set(re.findall(r"^struct (kvp_\w+) \{",
                                                 transport, re.M))


def test_every_enum_of_the_header_is_mirrored():
    text = open(HEADER).read()
    named = set(re.findall(r"^enum (kvp_\w+) \{", text, re.M))
    assert named == {"kvp_reason", "kvp_axis", "kvp_field_kind",
                     "kvp_group_kind", "kvp_kv_layout", "kvp_state_kind",
                     "kvp_conv_layout", "kvp_role", "kvp_engine_state",
                     "kvp_event_type", "kvp_log_level", "kvp_log_kind"}
    assert len(ENUM_PREFIX) == len(named)


def test_event_and_ids_records_match_structs():
    # the binding unpacks struct kvp_event with struct.Struct (one call per
    # event) and packs struct kvp_ids the same way: same offsets as ctypes
    ev = S.EventStruct(type=2, status=-5, req_id=1 << 40, engine_id=7,
                       rank=3, ngroups=2, engine=9, reads=11, bytes=13,
                       elapsed_ns=17, reason=19, peer_reason=23, layers=29)
    ev.ids = ctypes.cast(ctypes.c_void_p(0x1230), ctypes.POINTER(S.Ids))
    assert A._EVENT.unpack_from(bytes(ev)) == (
        2, -5, 1 << 40, 7, 3, 2, 0x1230, 9, 11, 13, 17, 19, 23, 29)
    assert A._EV_SIZE == ctypes.sizeof(S.EventStruct)
    assert A._EVENT.size <= A._EV_SIZE
    assert A._IDS.size == ctypes.sizeof(S.Ids)


def test_dtypes_match_structs():
    for dt, cls in ((kvpull.WR_DTYPE, S.Wr), (kvpull.SGE_DTYPE, S.Sge),
                    (kvpull.EMIT_SGE_DTYPE, S.EmitSge)):
        assert dt.itemsize == ctypes.sizeof(cls)
        assert dt.names == tuple(n for n, _ in cls._fields_)
        for name, ctype in cls._fields_:
            assert dt.fields[name][1] == getattr(cls, name).offset
            assert dt.fields[name][0].itemsize == ctypes.sizeof(ctype)
            assert dt.fields[name][0].kind == "u"
    assert kvpull.WR_DTYPE.itemsize == 32 and kvpull.SGE_DTYPE.itemsize == 16


def test_ids_packing_matches_struct():
    buf = (S.Ids * 2)()
    _IDS.pack_into(buf, 32, 0x1111, 0x2222, 3, 4, 5)
    assert ctypes.cast(buf[1].local, ctypes.c_void_p).value == 0x1111
    assert ctypes.cast(buf[1].remote, ctypes.c_void_p).value == 0x2222
    assert (buf[1].nlocal, buf[1].nremote, buf[1].tokens) == (3, 4, 5)
    assert bytes(buf[0]) == bytes(32)
    assert _IDS.size == struct.calcsize("@QQIIQ") == 32


def _header_functions():
    text = open(HEADER).read()
    return set(re.findall(r"\b(kvp_\w+)\s*\(", " ".join(
        m for m in re.findall(r"KVP_API[^;]*;", text, re.S))))


def test_every_function_is_declared_and_used():
    funcs = _header_functions()
    assert "kvp_plan_emit" in funcs and "kvp_agent_open" in funcs
    agent_calls = {f for f in funcs if f.startswith("kvp_agent_")}
    assert len(agent_calls) == 24
    declared = {p[0] for p in _lib._PROTOS}
    assert funcs == declared
    pkg = os.path.dirname(kvpull.__file__)
    src = "".join(open(os.path.join(pkg, f)).read()
                  for f in os.listdir(pkg)
                  if f.endswith(".py") and f != "_lib.py")
    # called, or handed to a helper that calls it (Agent._pull)
    unused = {f for f in declared
              if not re.search(r"lib\.%s\b" % f, src)}
    # kvp_layout_build() is kvp_layout_build_msg() without the reason, which
    # Layout.build() always asks for
    assert unused == {"kvp_layout_build"}


def _header_prototypes():
    """name -> (returns void, number of parameters) from the header."""
    text = open(HEADER).read()
    out = {}
    for decl in re.findall(r"KVP_API[^;]*;", text, re.S):
        m = re.search(r"\b(kvp_\w+)\s*\((.*)\)\s*;$", " ".join(decl.split()))
        if not m:
            continue
        head = decl[:decl.index(m.group(1))]
        params = m.group(2).strip()
        n = 0 if params in ("", "void") else params.count(",") + 1
        void = re.search(r"\bvoid\s*$", head.replace("KVP_MUST_CHECK", ""))
        out[m.group(1)] = (bool(void), n)
    return out


def test_prototypes_match_the_header():
    protos = _header_prototypes()
    assert len(protos) == len(_lib._PROTOS)
    for name, restype, *argtypes in _lib._PROTOS:
        void, nparams = protos[name]
        assert (restype is None) == void, name
        assert len(argtypes) == nparams, name
        fn = getattr(_lib.lib, name)
        assert fn.argtypes == argtypes and fn.restype is restype, name


def test_library_exports_what_is_declared():
    for name, *_ in _lib._PROTOS:
        assert hasattr(_lib.lib, name)
    assert kvpull.version() == E.VERSION
    assert kvpull.lib_path.endswith("libkvpull.so.0") or \
        "KVPULL_LIB" in os.environ


def test_struct_helpers():
    a = kvpull.PlanAttr(max_sge=4)
    b = a.copy()
    b.max_sge = 5
    assert a.max_sge == 4 and a != b and a == kvpull.PlanAttr(max_sge=4)
    assert repr(a) == ("PlanAttr(max_sge=4, comp_mask=0, max_len=0, "
                       "flags=0)")
    f = kvpull.FieldDesc(ndim=2)
    assert len(f.to_dict()["dim"]) == 2
    m = kvpull.Model("x", layers=3)
    assert m.name == "x" and m.to_dict()["name"] == "x"
    with pytest.raises(ValueError):
        m.name = "y" * 48
    assert np.dtype(kvpull.WR_DTYPE).names[0] == "offset"
