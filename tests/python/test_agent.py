# SPDX-License-Identifier: MIT
"""Agents on a host without an RDMA device: what can be pinned here.

 - opening fails with the errno the C library returns (a C program compiled
   against the header says which), with and without a `with` block;
 - the attributes reach kvp_agent_open() as given (C defaults for the
   others), and values C cannot hold are refused before any C call;
 - every other call, through a stand-in library with the real prototypes
   (fakelib.FakeLib): what C receives (block id arrays by their own
   address, no copy; peers, blobs, progress), errors with the library's
   reason and line, events (FAILED ids copied before the next poll), the
   file descriptors, sleeping in poll(timeout), selectors and asyncio, the
   lock that serialises calls, memory kept referenced while registered.

The transport itself (a real handshake, READs, DONE) is tested in the
soft-RoCE VM: tests/python_rdma/.
"""
import array
import asyncio
import ctypes
import errno
import gc
import mmap
import os
import re
import selectors
import shutil
import subprocess
import sys
import threading
import time
import weakref

import numpy as np
import pytest

from conftest import REPO

import kvpull
from kvpull import _structs as S
from kvpull import agent as A
import fakelib


def _layout(ngroups=1, engine_id=2):
    m = kvpull.Model.preset("llama-3.1-8b").replace(layers=2)
    if ngroups == 2:
        m = m.replace(sliding_layers=1)
    return kvpull.Layout.build(m, tp_size=1, engine_id=engine_id,
                               block_tokens=16, num_blocks=32)


@pytest.fixture
def layout():
    lay = _layout()
    yield lay
    lay.close()


@pytest.fixture
def fake(monkeypatch):
    f = fakelib.FakeLib()
    monkeypatch.setattr(A, "lib", f)
    yield f
    assert f.errors == []


@pytest.fixture
def agent(fake, layout):
    a = kvpull.Agent(layout, "consumer", max_ids=64)
    fake.calls.clear()
    yield a
    a.close()


def _no_c_call(fake, fn, exc, code=None, match=None):
    """fn() raises exc (with C code `code`) and calls nothing in C."""
    before = len(fake.calls)
    with pytest.raises(exc, match=match) as ei:
        fn()
    assert fake.calls[before:] == []
    if code is not None:
        assert ei.value.code == code and ei.value.errno == -code
    return ei.value


# ---- opening on this host --------------------------------------------------

OPEN_C = r"""
#include <stdio.h>
#include <string.h>
#include "kvpull.h"
/* kvp_agent_open() for the layout the tests build, per case */
int main(void)
{
	struct kvp_model m;
	struct kvp_engine_desc e;
	struct kvp_agent_attr at;
	kvp_layout *l;
	kvp_agent *a;
	int r, err;

	if (kvp_model_preset("llama-3.1-8b", &m))
		return 2;
	m.layers = 2;
	memset(&e, 0, sizeof(e));
	e.engine_id = 2;
	e.tp_size = 1;
	e.block_tokens = 16;
	e.num_blocks = 32;
	if (kvp_layout_build(&m, &e, &l))
		return 3;
	for (r = 0; r < 3; r++) {
		memset(&at, 0, sizeof(at));
		at.role = r;
		at.layout = l;
		a = NULL;
		err = kvp_agent_open(&at, &a);
		printf("role%d=%d\n", r, err);
		kvp_agent_close(a);
	}
	memset(&at, 0, sizeof(at));
	at.role = KVP_ROLE_CONSUMER;
	at.layout = l;
	at.max_ids = 1u << 25;
	printf("max_ids=%d\n", kvp_agent_open(&at, &a));
	at.max_ids = 0;
	at.read_window = 65536;
	printf("read_window=%d\n", kvp_agent_open(&at, &a));
	at.read_window = 0;
	at.read_window_bytes = KVP_READ_WINDOW_BYTES_MIN - 1;
	printf("read_window_bytes=%d\n", kvp_agent_open(&at, &a));
	at.read_window_bytes = 0;
	at.device = "kvp-no-such-device";
	a = NULL;
	err = kvp_agent_open(&at, &a);
	printf("device=%d\n", err);
	kvp_agent_close(a);
	kvp_layout_destroy(l);
	return 0;
}
"""


@pytest.fixture(scope="module")
def c_open(tmp_path_factory):
    """What kvp_agent_open() returns on this host, from C."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.fail("no C compiler (cc)")
    d = tmp_path_factory.mktemp("open")
    (d / "open.c").write_text(OPEN_C)
    so = kvpull.lib_path
    subprocess.run([cc, "-std=gnu11", "-Wall", "-Werror",
                    "-I" + os.path.join(REPO, "include"), "-o",
                    str(d / "open"), str(d / "open.c"), so,
                    "-Wl,-rpath," + os.path.dirname(os.path.abspath(so))],
                   check=True)
    out = subprocess.run([str(d / "open")], check=True, capture_output=True,
                         text=True).stdout
    return {k: int(v) for k, v in
            (line.split("=") for line in out.split())}


def test_open_gives_the_c_errno(c_open, layout):
    for i, role in enumerate(("producer", "consumer", "both")):
        code = c_open["role%d" % i]
        # the bare C call through ctypes agrees
        attr = kvpull.agent_attr(layout, role)
        out = ctypes.c_void_p()
        assert kvpull.lib.kvp_agent_open(ctypes.byref(attr),
                                         ctypes.byref(out)) == code
        kvpull.lib.kvp_agent_close(out)
        if code == 0:               # a host with an RDMA device
            kvpull.Agent(layout, role).close()
            continue
        with pytest.raises(kvpull.Error) as ei:
            kvpull.Agent(layout, role)
        e = ei.value
        assert (e.code, e.errno, e.func) == (code, -code, "kvp_agent_open")
        assert e.strerror == kvpull.strerror(code)
        assert e.reason == kvpull.Reason.NONE
    # without a device, that is -ENODEV ("no RDMA device")
    if not os.path.exists("/dev/infiniband/uverbs0"):
        assert c_open["role1"] == -errno.ENODEV
        assert kvpull.strerror(-errno.ENODEV) == "no RDMA device"
    # a bad attribute is refused by C before the device is looked at
    assert c_open["max_ids"] == -errno.EINVAL
    # the READ window: at most 65535 READs, at least 4096 bytes
    assert c_open["read_window"] == -errno.EINVAL
    assert c_open["read_window_bytes"] == -errno.EINVAL
    with pytest.raises(kvpull.Error) as ei:
        kvpull.Agent(layout, "consumer", max_ids=1 << 25)
    assert ei.value.code == -errno.EINVAL
    with pytest.raises(kvpull.Error) as ei:
        kvpull.Agent(layout, "consumer", device="kvp-no-such-device")
    assert ei.value.code == c_open["device"] == -errno.ENODEV


def _track_clones(monkeypatch):
    """The layouts Layout.clone() makes from now on."""
    made = []
    real = kvpull.Layout.clone

    def clone(self):
        c = real(self)
        made.append(c)
        return c

    monkeypatch.setattr(kvpull.Layout, "clone", clone)
    return made


def test_failed_open_in_a_with_block(c_open, layout, monkeypatch):
    if c_open["role1"] == 0:
        pytest.skip("this host has an RDMA device")
    clones = _track_clones(monkeypatch)
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    body = []
    with pytest.raises(kvpull.Error) as ei:
        with kvpull.Agent(layout, "consumer") as a:
            body.append(a)
    assert body == []
    assert ei.value.code == c_open["role1"]
    # the agent's copy of the layout was freed, the caller's is intact
    assert len(clones) == 1 and clones[0].closed
    assert layout.info.nregions == 4
    gc.collect()
    assert unraisable == []


def test_failed_open_calls_nothing_else(fake, layout, monkeypatch):
    clones = _track_clones(monkeypatch)
    fake.ret["open"] = -errno.ENODEV
    with pytest.raises(kvpull.Error) as ei:
        with kvpull.Agent(layout, "producer"):
            pytest.fail("the body ran")
    assert ei.value.code == -errno.ENODEV
    assert fake.names() == ["open"]         # no close of a NULL agent
    assert len(clones) == 1 and clones[0].closed
    gc.collect()
    assert fake.names() == ["open"]


def test_with_block_closes_once(fake, layout):
    with pytest.raises(RuntimeError):
        with kvpull.Agent(layout, "consumer") as a:
            assert not a.closed and a.handle == fakelib.HANDLE
            raise RuntimeError("inside")
    assert a.closed and a.layout is None
    assert fake.names() == ["open", "close"]
    assert fake.calls[1][1] == (fakelib.HANDLE,)
    a.close()
    del a
    gc.collect()
    assert fake.names() == ["open", "close"]
    # garbage collection closes one that was not
    b = kvpull.Agent(layout, "producer")
    del b
    gc.collect()
    assert fake.names() == ["open", "close", "open", "close"]


def test_calls_after_close_raise_and_call_nothing(fake, agent):
    agent.close()
    n = len(fake.calls)
    ids = np.arange(4, dtype=np.uint32)
    for fn in (lambda: agent.pull(1, [(ids, ids)]),
               lambda: agent.pull_from(1, 1, [(ids, ids)]),
               lambda: agent.poll(), lambda: agent.fds(),
               lambda: agent.arm(), lambda: agent.stats(),
               lambda: agent.register(0, bytearray(16)),
               lambda: agent.listen(None, 1), lambda: agent.meta(),
               lambda: agent.last_error(), lambda: agent.handle):
        with pytest.raises(ValueError, match="closed"):
            fn()
    assert len(fake.calls) == n
    assert repr(agent) == "<kvpull.Agent closed>"


# ---- attributes -------------------------------------------------------------


def test_attr_defaults_are_zero(layout):
    a = kvpull.agent_attr(layout)
    d = a.to_dict()
    assert d.pop("role") == kvpull.Role.CONSUMER
    assert d.pop("layout") == layout.handle
    assert set(d.values()) <= {0, None, ""}, d
    assert a.device is None and a.addr is None and a.secret is None
    # log_user: the binding's own (its callback needs none)
    assert set(kvpull.ATTR_DEFAULTS) == \
        {n for n, _ in S.AgentAttr._fields_} - {"role", "layout",
                                               "secret_len", "log_user"}


def test_attr_defaults_match_the_c_source():
    src = open(os.path.join(REPO, "verbs", "agent.c")).read()
    defs = dict(re.findall(r"#define (DEF_\w+) (\w+)", src))
    want = {"max_ids": "DEF_MAX_IDS", "max_inflight": "DEF_INFLIGHT",
            "sq_depth": "DEF_SQ",
            "max_sge": "DEF_SGE", "handshake_ms": "DEF_HANDSHAKE_MS",
            "stall_ms": "DEF_STALL_MS", "qps_per_peer": "DEF_QPS",
            "idle_ms": "DEF_IDLE_MS"}
    for attr, name in want.items():
        v = defs[name]
        v = kvpull.DEFAULT_MAX_SGE if v == "KVP_DEFAULT_MAX_SGE" else int(v)
        assert kvpull.ATTR_DEFAULTS[attr] == v, attr
    # max_peers: a default per side, both named.
    peers = kvpull.ATTR_DEFAULTS["max_peers"]
    assert peers.startswith(defs["DEF_PEERS_PROD"] + " consumer ranks")
    assert defs["DEF_PEERS_CONS"] + " producer ranks" in peers


def test_attrs_reach_open(fake, layout):
    kw = dict(device="rxe0", addr="10.77.0.1", max_ids=300,
              max_inflight=9, max_peers=10, sq_depth=128, max_sge=4,
              secret=b"s" * 32, max_per_source=3, handshake_ms=500,
              stall_ms=700, rq_depth=99, max_read=1 << 20,
              qps_per_peer=3, tos=27, plan_flags=1, max_mr=1 << 30,
              stream_events=True, max_qps=20, idle_ms=5000)
    with kvpull.Agent(layout, "both", **kw) as a:
        assert a.role == kvpull.Role.BOTH
    seen = fake.seen["open"]
    assert seen["role"] == 2 and seen["comp_mask"] == 0
    assert seen["device"] == b"rxe0" and seen["addr"] == b"10.77.0.1"
    assert seen["secret"] == b"s" * 32 and seen["secret_len"] == 32
    assert seen["stream_events"] == 1
    for k in ("max_ids", "max_inflight", "max_peers", "sq_depth", "max_sge",
              "max_per_source", "handshake_ms", "stall_ms", "rq_depth",
              "max_read", "qps_per_peer", "tos", "plan_flags", "max_mr",
              "max_qps", "idle_ms"):
        assert seen[k] == kw[k], k
    # the layout handed over is the caller's (C copies it)
    assert seen["layout_info"] == layout.info.to_dict()


def test_attrs_refused_before_open(fake, layout):
    f = "kvp_agent_open"
    for kw in ({"max_ids": -1}, {"max_ids": 1 << 32}, {"tos": 1 << 40},
               {"max_mr": -5}, {"max_mr": 1 << 64}):
        e = _no_c_call(fake, lambda: kvpull.Agent(layout, **kw),
                       kvpull.Error, -errno.EINVAL)
        assert e.func == f and list(kw)[0] in e.why
    _no_c_call(fake, lambda: kvpull.Agent(layout, max_idz=3), TypeError,
               match="no member 'max_idz'")
    _no_c_call(fake, lambda: kvpull.Agent(layout, "prosumer"), ValueError,
               match="unknown Role")
    _no_c_call(fake, lambda: kvpull.Agent(layout, 7), ValueError)
    _no_c_call(fake, lambda: kvpull.Agent("llama", "consumer"), TypeError)
    _no_c_call(fake, lambda: kvpull.Agent(layout, addr="10.0.0.1\0x"),
               ValueError, match="NUL")
    _no_c_call(fake, lambda: kvpull.Agent(layout, device=5), TypeError)
    # values C itself refuses go to C (its errno is the answer)
    fake.ret["open"] = -errno.EINVAL
    with pytest.raises(kvpull.Error):
        kvpull.Agent(layout, secret=b"short")
    assert fake.seen["open"]["secret_len"] == 5
    kvpull.agent_attr(layout, role=kvpull.Role.PRODUCER, secret="x" * 16)


# ---- memory -----------------------------------------------------------------


def test_register_buffers_by_address(fake, agent):
    kv = np.zeros((2, 32, 8, 16, 128), np.uint16)
    agent.register(0, kv[0])
    assert fake.seen["register"] == (0, kv[0].ctypes.data, kv[0].nbytes)
    agent.register(1, kv[1], 4096)
    assert fake.seen["register"] == (1, kv[1].ctypes.data, 4096)
    ba = bytearray(1 << 20)
    agent.register(2, ba)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(ba))
    assert fake.seen["register"] == (2, addr, 1 << 20)
    with mmap.mmap(-1, 1 << 16) as m:
        agent.register(3, m)
        assert fake.seen["register"][2] == 1 << 16
        # an F-contiguous array is one contiguous range too
        fa = np.asfortranarray(np.zeros((64, 64), np.float32))
        agent.register(4, fa)
        assert fake.seen["register"] == (4, fa.ctypes.data, fa.nbytes)
        assert sorted(agent.registered) == [0, 1, 2, 3, 4]
        # the exports are held while registered: no resize, no close
        with pytest.raises(BufferError):
            ba.append(1)
        with pytest.raises(BufferError):
            m.close()
        agent.close()
        ba.append(1)
    assert m.closed


def test_register_integer_address_keeps_its_owner(fake, agent):
    owner = np.zeros(1 << 16, np.uint8)
    ref = weakref.ref(owner)
    agent.register(0, owner.ctypes.data, owner.nbytes, keep=owner)
    assert fake.seen["register"] == (0, owner.ctypes.data, 1 << 16)
    assert agent.registered == {0: (owner.ctypes.data, 1 << 16)}
    del owner
    gc.collect()
    assert ref() is not None            # referenced until close
    agent.close()
    gc.collect()
    assert ref() is None
    # an address needs a length
    with pytest.raises(TypeError, match="length"):
        kvpull.Agent.register(agent, 0, 0x1000)


def test_register_refusals_before_c(fake, agent, layout):
    f = "kvp_agent_register"
    ro = np.zeros(4096, np.uint8)
    ro.flags.writeable = False
    _no_c_call(fake, lambda: agent.register(0, ro), ValueError,
               match="read-only")
    _no_c_call(fake, lambda: agent.register(0, b"x" * 4096), ValueError,
               match="read-only")
    _no_c_call(fake, lambda: agent.register(0, np.zeros((8, 8))[:, ::2]),
               ValueError, match="not contiguous")
    e = _no_c_call(fake, lambda: agent.register(0, bytearray(100), 101),
                   kvpull.Error, -errno.EINVAL)
    assert e.func == f and "exceeds the buffer's 100 bytes" in e.why
    _no_c_call(fake, lambda: agent.register(-1, bytearray(8)), kvpull.Error,
               -errno.EINVAL)
    _no_c_call(fake, lambda: agent.register(0, 1 << 64, 8), kvpull.Error,
               -errno.EINVAL)
    _no_c_call(fake, lambda: agent.register(0, "text"), TypeError,
               match="buffer")
    # a C refusal keeps nothing
    fake.ret["register"] = -errno.EINVAL
    buf = np.zeros(16, np.uint8)
    ref = weakref.ref(buf)
    code = None
    try:
        agent.register(0, buf)
    except kvpull.Error as e:
        code = e.code
    assert code == -errno.EINVAL and agent.registered == {}
    del buf
    gc.collect()
    assert ref() is None
    # a producer's memory is only read remotely: read-only buffers do
    with kvpull.Agent(layout, "producer") as p:
        fake.ret.pop("register")
        p.register(0, b"y" * 4096)
        assert fake.seen["register"][2] == 4096


def test_register_dmabuf(fake, agent):
    fake.ret["register_dmabuf"] = 1
    buf = bytearray(1 << 16)
    assert agent.register_dmabuf(0, 7, 4096, 1 << 16, buf) is True
    region, fd, off, n, addr = fake.seen["register_dmabuf"]
    assert (region, fd, off, n) == (0, 7, 4096, 1 << 16)
    assert addr == ctypes.addressof(ctypes.c_char.from_buffer(buf))
    fake.ret["register_dmabuf"] = 0
    assert agent.register_dmabuf(1, 7, 0, 1 << 16) is False
    assert fake.seen["register_dmabuf"][4] is None
    fake.ret["register_dmabuf"] = -errno.ENOTSUP
    with pytest.raises(kvpull.Error) as ei:
        agent.register_dmabuf(2, 7, 0, 4096)
    assert ei.value.code == -errno.ENOTSUP
    _no_c_call(fake, lambda: agent.register_dmabuf(2, 1 << 31, 0, 8),
               kvpull.Error, -errno.EINVAL)
    _no_c_call(fake, lambda: agent.register_dmabuf(2, 3, 0, 1 << 17, buf),
               kvpull.Error, -errno.EINVAL)


# ---- ids --------------------------------------------------------------------


def test_pack_ids_points_at_the_arrays():
    local = np.arange(100, 228, dtype=np.uint32)
    remote = np.arange(5000, 5128, dtype=np.int32)
    structs, keep = kvpull.pack_ids([(local, remote, 2000)], 1)
    s = structs[0]
    assert ctypes.cast(s.local, ctypes.c_void_p).value == local.ctypes.data
    assert ctypes.cast(s.remote, ctypes.c_void_p).value == \
        remote.ctypes.data
    assert (s.nlocal, s.nremote, s.tokens) == (128, 128, 2000)
    assert keep[0] is local and keep[1] is remote
    # array.array('I') and memoryviews: in place too
    aa = array.array("I", range(10))
    structs, keep = kvpull.pack_ids([(aa, memoryview(aa))], 1)
    addr = aa.buffer_info()[0]
    assert ctypes.cast(structs[0].local, ctypes.c_void_p).value == addr
    assert ctypes.cast(structs[0].remote, ctypes.c_void_p).value == addr
    # int64 and lists: converted once, checked
    wide = np.arange(8, dtype=np.int64)
    structs, keep = kvpull.pack_ids([{"local": wide, "remote": [1, 2, 3]}],
                                    1)
    assert keep[0].dtype == np.uint32 and keep[0].tolist() == list(range(8))
    assert structs[0].nremote == 3
    with pytest.raises(kvpull.Error) as ei:
        kvpull.pack_ids([(np.array([1 << 32]), wide)], 1)
    assert ei.value.code == -errno.ERANGE
    # a non-contiguous view is copied (C needs contiguous ids)
    strided = np.arange(20, dtype=np.uint32)[::2]
    structs, keep = kvpull.pack_ids([(strided, strided)], 1)
    assert keep[0].tolist() == strided.tolist()
    assert ctypes.cast(structs[0].local, ctypes.c_void_p).value != \
        strided.ctypes.data


def test_pack_ids_group_count_and_shapes():
    ids = np.arange(4, dtype=np.uint32)
    for bad, ngroups in (([(ids, ids)], 2), ([(ids, ids)] * 2, 1), ([], 1)):
        with pytest.raises(kvpull.Error) as ei:
            kvpull.pack_ids(bad, ngroups)
        assert ei.value.code == -errno.EINVAL
        assert "the layout %d" % ngroups in ei.value.why
    with pytest.raises(TypeError):
        kvpull.pack_ids([(ids,)], 1)
    with pytest.raises(TypeError):
        kvpull.pack_ids(ids, 1)
    with pytest.raises(kvpull.Error) as ei:
        kvpull.pack_ids([(ids, ids, -1)], 1)
    assert ei.value.code == -errno.EINVAL and "tokens" in ei.value.why


def test_pull_hands_c_the_arrays_themselves(fake, agent):
    local = np.arange(10, 74, dtype=np.uint32)
    remote = np.arange(1000, 1064, dtype=np.uint32)
    agent.pull_from(7, 1 << 63, [(local, remote, 1000)])
    seen = fake.seen["pull_from"]
    assert (seen["engine"], seen["req_id"]) == (7, 1 << 63)
    g = seen["groups"][0]
    assert g["local_ptr"] == local.ctypes.data       # zero copy
    assert g["remote_ptr"] == remote.ctypes.data
    assert (g["nlocal"], g["nremote"], g["tokens"]) == (64, 64, 1000)
    assert g["local"].tolist() == local.tolist()
    assert g["remote"].tolist() == remote.tolist()
    # the struct array is the agent's own, reused by every pull
    addr = seen["addr"]
    agent.pull(3, [(remote, local)])
    assert fake.seen["pull"]["addr"] == addr
    assert fake.seen["pull"]["groups"][0]["local_ptr"] == remote.ctypes.data
    agent.pull_stream(2, 4, [(local, remote)])
    assert fake.seen["pull_stream"]["groups"][0]["remote_ptr"] == \
        remote.ctypes.data
    # pull(engine=...) is pull_from
    agent.pull(5, [(local, remote)], engine=9)
    assert fake.seen["pull_from"]["engine"] == 9
    # converted lists live until C has read them
    agent.pull_from(7, 8, [(local.astype(np.int64), list(range(64)))])
    g = fake.seen["pull_from"]["groups"][0]
    assert g["local"].tolist() == local.tolist()
    assert g["remote"].tolist() == list(range(64))
    assert g["local_ptr"] != local.ctypes.data
    # a prepared Request goes as it is
    req = kvpull.Request([(local, remote, 1000)])
    agent.pull_from(7, 6, req)
    assert fake.seen["pull_from"]["addr"] == req.address
    assert fake.seen["pull_from"]["groups"][0]["local_ptr"] == \
        local.ctypes.data


def test_pull_refusals_before_c(fake, agent):
    ids = np.arange(4, dtype=np.uint32)
    for fn, code in (
            (lambda: agent.pull(1, [(ids, ids)] * 2), -errno.EINVAL),
            (lambda: agent.pull_from(1, 1, []), -errno.EINVAL),
            (lambda: agent.pull_from(1, 1,
                                     kvpull.Request([(ids, ids)] * 2)),
             -errno.EINVAL),
            (lambda: agent.pull(-1, [(ids, ids)]), -errno.EINVAL),
            (lambda: agent.pull(1 << 64, [(ids, ids)]), -errno.EINVAL),
            (lambda: agent.pull_from(1 << 32, 1, [(ids, ids)]),
             -errno.EINVAL),
            (lambda: agent.pull_stream(-1, 1, [(ids, ids)]), -errno.EINVAL),
            (lambda: agent.pull(1, [(np.array([-1, 2]), ids)]),
             -errno.ERANGE),
            (lambda: agent.pull(1, [(ids, ids, 1 << 64)]), -errno.EINVAL)):
        _no_c_call(fake, fn, kvpull.Error, code)
    _no_c_call(fake, lambda: agent.pull(1, ids), TypeError)
    _no_c_call(fake, lambda: agent.pull(1, [(np.zeros(3), ids)]), TypeError)


def test_pull_errors_carry_the_reason(fake, agent):
    ids = np.arange(300, dtype=np.uint32)
    fake.ret["pull_from"] = -errno.EINVAL
    fake.reason = int(kvpull.Reason.IDS_MAX)
    fake.why = b"group 0: 300 local and 300 remote ids, max_ids 256"
    with pytest.raises(kvpull.Error) as ei:
        agent.pull_from(1, 5, [(ids, ids)])
    e = ei.value
    assert (e.code, e.func, e.reason) == (
        -errno.EINVAL, "kvp_agent_pull_from", kvpull.Reason.IDS_MAX)
    assert e.why == "group 0: 300 local and 300 remote ids, max_ids 256"
    assert str(e) == ("kvp_agent_pull_from: invalid argument: group 0: 300 "
                      "local and 300 remote ids, max_ids 256")
    assert fake.names()[-2:] == ["pull_from", "last_error"]
    assert agent.last_error() == (kvpull.Reason.IDS_MAX, fake.why.decode())
    # the calls that record no reason do not ask for one
    fake.ret["expect"] = -errno.EBUSY
    with pytest.raises(kvpull.Error) as ei:
        agent.expect(2, 5, timeout=1)
    assert ei.value.reason == kvpull.Reason.NONE and ei.value.why is None
    assert fake.names()[-1] == "expect"


# ---- engines, peers ---------------------------------------------------------


def test_peers_reach_c(fake, agent):
    blob0, blob1 = b"\x07" * 300, bytearray(b"\x08" * 310)
    e = agent.add_engine([("10.0.0.1", 18515, blob0),
                          {"addr": b"10.0.0.2", "port": 18516,
                           "meta": blob1}], timeout_ms=1234)
    assert e == fake.next_engine
    assert fake.seen["add_engine"] == ([
        (b"10.0.0.1", 18515, blob0, 300),
        (b"10.0.0.2", 18516, bytes(blob1), 310)], 2, 1234)
    agent.connect([("10.0.0.3", 1)], timeout_ms=50)
    assert fake.seen["connect"] == ([(b"10.0.0.3", 1, None, 0)], 1, 50)
    agent.reconnect_engine(e)
    assert fake.seen["reconnect_engine"] == (e, None, 0, 10000)
    agent.reconnect_engine(e, [("10.0.0.4", 2)], 99)
    assert fake.seen["reconnect_engine"] == (
        e, [(b"10.0.0.4", 2, None, 0)], 1, 99)
    agent.remove_engine(e)
    assert fake.calls[-1] == ("remove_engine", (fakelib.HANDLE, e))


def test_peer_refusals_before_c(fake, agent):
    f = "kvp_agent_add_engine"
    e = _no_c_call(fake, lambda: agent.add_engine([("10.0.0.1", 65536)]),
                   kvpull.Error, -errno.EINVAL)
    assert e.func == f and "port 65536" in e.why
    _no_c_call(fake, lambda: agent.add_engine([("10.0.0.1", 1)],
                                              timeout_ms=-1),
               kvpull.Error, -errno.EINVAL)
    _no_c_call(fake, lambda: agent.connect([("10.0.0.1", 1)],
                                           timeout_ms=1 << 31),
               kvpull.Error, -errno.EINVAL)
    _no_c_call(fake, lambda: agent.add_engine("10.0.0.1"), TypeError)
    _no_c_call(fake, lambda: agent.add_engine([("10.0.0.1",)]), TypeError)
    _no_c_call(fake, lambda: agent.listen("10.0.0.1", 1 << 16),
               kvpull.Error, -errno.EINVAL)
    _no_c_call(fake, lambda: agent.remove_engine(-2), kvpull.Error,
               -errno.EINVAL)
    # C's own refusal carries its reason
    fake.ret["connect"] = -errno.EPROTO
    fake.reason = int(kvpull.Reason.LAYOUT)
    fake.why = b"producer rank 1: group 0 layer 0 K: head extent differs"
    with pytest.raises(kvpull.Error) as ei:
        agent.connect([("10.0.0.1", 1), ("10.0.0.1", 2)])
    assert ei.value.reason == kvpull.Reason.LAYOUT
    assert ei.value.why.startswith("producer rank 1:")


def test_listen_meta_expect_publish(fake, layout):
    with kvpull.Agent(layout, "producer") as p:
        p.listen(None, 18515)
        assert fake.seen["listen"] == (None, 18515)
        p.listen("10.77.0.1", 0)
        assert fake.seen["listen"] == (b"10.77.0.1", 0)
        assert p.meta() == fake.meta_blob
        assert fake.names()[-2:] == ["get_meta", "get_meta"]
        t0 = time.monotonic_ns()
        p.expect(2, 77, timeout=5)
        ce, rid, dl = fake.seen["expect"]
        assert (ce, rid) == (2, 77)
        assert t0 + 5 * 10**9 <= dl <= time.monotonic_ns() + 5 * 10**9
        p.expect(2, 78, 123456789)
        assert fake.seen["expect"] == (2, 78, 123456789)
        with pytest.raises(TypeError):
            p.expect(2, 79)
        with pytest.raises(TypeError):
            p.expect(2, 79, 5, timeout=5)
        p.publish(2, 77, (0, 64, 3))
        assert fake.seen["publish"] == (2, 77, {
            "tokens_all": 0, "tokens_cur": 64, "layers_cur": 3,
            "comp_mask": 0})
        p.publish(2, 77, kvpull.Progress(tokens_all=kvpull.TOKENS_END))
        assert fake.seen["publish"][2]["tokens_all"] == kvpull.TOKENS_END
        with pytest.raises(TypeError):
            p.publish(2, 77, None)
        fake.ret["get_meta"] = -errno.ENXIO
        with pytest.raises(kvpull.Error) as ei:
            p.meta()
        assert ei.value.code == -errno.ENXIO


def test_engine_info_layout_and_borrowed_plan(fake, agent, layout):
    fake.info = {"state": int(kvpull.EngineState.DOWN), "status": -110,
                 "engine_id": 1, "tp_size": 2,
                 "reason": int(kvpull.Reason.STALL),
                 "why": b"no progress from the producer within stall_ms"}
    info = agent.engine_info(3)
    assert isinstance(info, kvpull.EngineInfo)
    assert info.state == kvpull.EngineState.DOWN and info.status == -110
    assert info.why == "no progress from the producer within stall_ms"
    assert info.to_dict()["why"] == info.why and info.to_dict()["plan"] == 0
    assert agent.plan(3) is None
    remote = _layout(engine_id=1)
    fake.layout_ptr = remote.handle
    lay = agent.engine_layout(3, 0)
    assert lay.engine_id == 1 and lay.handle != remote.handle
    lay.close()
    own = kvpull.Plan.compile(layout, remote, max_sge=16)
    fake.info["plan"] = own.handle
    fake.plan_ptr = own.handle
    p3, p0 = agent.plan(3), agent.plan()
    for p in (p3, p0):
        assert p.handle == own.handle and p.info == own.info
        assert p.dump() == own.dump()
    agent.remove_engine(3)              # the borrowed plans are closed ...
    assert p3.closed and p0.closed
    assert own.info.nstreams > 0        # ... not the agent's plan itself
    p3 = agent.plan(3)
    fake.events.append([S.EventStruct(type=7, engine=3, status=-104)])
    agent.poll()
    assert p3.closed
    p3 = agent.plan(3)
    fake.ret["pull_from"] = -errno.EAGAIN
    with pytest.raises(kvpull.Error):
        agent.pull_from(3, 1, [(np.zeros(1, np.uint32),) * 2])
    assert p3.closed
    p3 = agent.plan(3)
    agent.close()
    assert p3.closed
    own.close()
    remote.close()


def test_stats(fake, agent):
    fake.stats = {"pulls": 3, "mem_bytes": 1 << 20, "arrivals": 9}
    st = agent.stats()
    assert isinstance(st, kvpull.AgentStats)
    assert (st.pulls, st.mem_bytes, st.arrivals, st.done) == (3, 1 << 20, 9,
                                                             0)
    assert len(st.to_dict()) == 45


# ---- events -----------------------------------------------------------------


def test_event_from_struct():
    a = np.array([5, 6, 7], np.uint32)
    b = np.array([9], np.uint32)
    ids = (S.Ids * 2)()
    for i, x in enumerate((a, b)):
        ids[i].local = ctypes.cast(x.ctypes.data,
                                   ctypes.POINTER(ctypes.c_uint32))
        ids[i].nlocal = len(x)
    ev = S.EventStruct(type=2, status=-errno.ECONNRESET, req_id=42,
                       engine_id=0, rank=0, ngroups=2, engine=3, reason=15)
    ev.ids = ctypes.cast(ids, ctypes.POINTER(S.Ids))
    e = kvpull.Event.from_struct(ev)
    assert e.type is kvpull.EventType.FAILED and not e.ok
    assert (e.status, e.req_id, e.engine) == (-errno.ECONNRESET, 42, 3)
    assert e.reason is kvpull.Reason.TRANSPORT
    assert [x.tolist() for x in e.ids] == [[5, 6, 7], [9]]
    a[:] = 0                            # copies, not views
    assert e.ids[0].tolist() == [5, 6, 7]
    assert e.ids[0].dtype == np.uint32
    err = e.error
    assert isinstance(err, kvpull.Error) and err.code == -errno.ECONNRESET
    assert err.reason is kvpull.Reason.TRANSPORT
    assert "FAILED request 42 engine 3" in str(err)
    assert repr(e) == ("<kvpull.Event FAILED, req 42, engine 3, status "
                       "ECONNRESET, reason TRANSPORT, ids [3, 1]>")
    d = kvpull.Event.from_struct(S.EventStruct(
        type=1, req_id=7, engine=1, reads=12, bytes=1 << 20,
        elapsed_ns=1500000))
    assert d.ok and d.error is None and d.ids is None
    assert (d.reads, d.bytes, d.elapsed_ns) == (12, 1 << 20, 1500000)
    assert d == kvpull.Event("done", req_id=7, engine=1, reads=12,
                             bytes=1 << 20, elapsed_ns=1500000)
    assert d.to_dict()["type"] == "done"
    assert repr(d) == ("<kvpull.Event DONE, req 7, engine 1, 12 reads, "
                       "1048576 bytes, 1.500 ms>")
    # an ids pointer on another type is not followed
    other = S.EventStruct(type=3, req_id=1, engine_id=2)
    other.ids = ctypes.cast(ids, ctypes.POINTER(S.Ids))
    assert kvpull.Event.from_struct(other).ids is None
    # unknown values stay ints
    u = kvpull.Event.from_struct(S.EventStruct(type=99, reason=1000))
    assert u.type == 99 and u.reason == 1000
    with pytest.raises(ValueError):
        kvpull.Event.from_struct(b"short")


def test_poll_returns_events_and_copies_failed_ids(fake, agent):
    done = S.EventStruct(type=1, req_id=1, engine=1, reads=4, bytes=4096)
    up = S.EventStruct(type=6, engine=1, engine_id=11)
    fake.events.append([done, fake.failed_event(2, [[20, 21], [30]]), up])
    evs = agent.poll()
    assert [e.type for e in evs] == [kvpull.EventType.DONE,
                                     kvpull.EventType.FAILED,
                                     kvpull.EventType.ENGINE_UP]
    assert fake.calls[-1][1][2] == 16                 # max_events
    failed = evs[1]
    assert [a.tolist() for a in failed.ids] == [[20, 21], [30]]
    assert agent.poll() == []           # C reuses the ids' memory now ...
    assert all((a == 0xDEAD).all() for a in fake._failed_mem[:2])
    assert [a.tolist() for a in failed.ids] == [[20, 21], [30]]  # ... kept
    assert evs[2].engine_id == 11
    # max_events: what C may write; the rest waits for the next poll
    fake.events.append([done] * 5)
    assert len(agent.poll(2)) == 2 and len(agent.poll(200)) == 3
    assert fake.calls[-1][1][2] == 200
    fake.ret["poll"] = -errno.EIO
    with pytest.raises(kvpull.Error) as ei:
        agent.poll()
    assert ei.value.code == -errno.EIO and ei.value.func == "kvp_agent_poll"
    with pytest.raises(kvpull.Error):
        agent.poll(-1)


# ---- sleeping ---------------------------------------------------------------


@pytest.fixture
def pipes(fake):
    """Three pipes standing for the agent's fds; returns their write
    ends."""
    rs, ws = [], []
    for _ in range(3):
        r, w = os.pipe()
        os.set_blocking(r, False)
        rs.append(r)
        ws.append(w)
    fake.fd_list = rs
    yield ws
    for fd in rs + ws:
        os.close(fd)


def _later(delay, fn):
    t = threading.Timer(delay, fn)
    t.start()
    return t


def test_fds_fileno_arm(fake, agent, pipes):
    assert agent.fds() == fake.fd_list
    fake.wake = fakelib.UINT64_MAX
    assert agent.arm() == (False, None)
    fake.wake, fake.ready = 12345, 1
    assert agent.arm() == (True, 12345)
    fd = agent.fileno()
    assert fd == agent.fileno() and fd not in fake.fd_list
    # readable when any of the agent's fds is
    sel = selectors.DefaultSelector()
    sel.register(agent, selectors.EVENT_READ)
    assert sel.select(0) == []
    os.write(pipes[1], b"x")
    assert [k.fileobj for k, _ in sel.select(1)] == [agent]
    sel.close()
    agent.close()
    with pytest.raises(OSError):
        os.fstat(fd)                    # closed with the agent
    fake.ret["fds"] = -errno.EINVAL
    with pytest.raises(ValueError):
        agent.fds()


def test_poll_timeout_sleeps_until_an_fd_is_readable(fake, agent, pipes):
    done = S.EventStruct(type=1, req_id=9, engine=1)
    fake.ready, fake.wake = 0, fakelib.UINT64_MAX

    def complete():
        fake.events.append([done])
        os.write(pipes[0], b"x")

    t0 = time.monotonic()
    t = _later(0.2, complete)
    evs = agent.poll(timeout=5)
    t.join()
    assert [e.req_id for e in evs] == [9]
    assert 0.15 < time.monotonic() - t0 < 4
    # nothing comes: [] after the timeout
    os.read(fake.fd_list[0], 16)
    t0 = time.monotonic()
    assert agent.poll(timeout=0.2) == []
    assert 0.15 < time.monotonic() - t0 < 2
    # arm says events wait: no sleep at all
    fake.ready = 1
    fake.ret["poll"] = lambda h, ev, n: 0
    t0 = time.monotonic()
    assert agent.poll(timeout=0.05) == []
    assert time.monotonic() - t0 < 1
    # the agent's own timer (wake_ns) bounds the sleep
    fake.ret.pop("poll")
    fake.ready = 0
    fake.wake = time.monotonic_ns() + 100 * 10**6
    calls = len(fake.calls)
    t0 = time.monotonic()
    assert agent.poll(timeout=0.5) == []
    assert [n for n, _ in fake.calls[calls:]].count("poll") >= 3
    with pytest.raises(ValueError):
        agent.poll(timeout=-1)


def test_poll_releases_the_gil_while_it_sleeps(fake, agent, pipes):
    fake.ready, fake.wake = 0, fakelib.UINT64_MAX
    count = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            count[0] += 1

    t = threading.Thread(target=spin)
    t.start()
    try:
        agent.poll(timeout=0.3)
    finally:
        stop.set()
        t.join()
    assert count[0] > 1000


def test_poll_async(fake, agent, pipes):
    done = S.EventStruct(type=1, req_id=5, engine=1)
    fake.ready, fake.wake = 0, fakelib.UINT64_MAX

    async def main():
        loop = asyncio.get_running_loop()

        def complete():
            fake.events.append([done])
            os.write(pipes[2], b"x")

        loop.call_later(0.1, complete)
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        tk = asyncio.ensure_future(ticker())
        evs = await agent.poll_async(timeout=5)
        empty = await agent.poll_async(timeout=0.1)
        tk.cancel()
        return evs, empty, ticks

    evs, empty, ticks = asyncio.run(main())
    assert [e.req_id for e in evs] == [5] and empty == []
    assert ticks >= 5                   # the loop ran while it waited


def test_calls_are_serialised(fake, agent):
    inside = [0]
    overlap = []

    def slow_poll(h, ev, n):
        inside[0] += 1
        if inside[0] > 1:
            overlap.append(True)
        time.sleep(0.02)                # releases the GIL
        inside[0] -= 1
        return 0

    fake.ret["poll"] = slow_poll
    ts = [threading.Thread(target=lambda: [agent.poll() for _ in range(5)])
          for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert overlap == [] and fake.names().count("poll") == 20


def test_calls_go_through_cdll():
    # ctypes.CDLL (not PyDLL) functions release the GIL during the call
    assert type(kvpull.lib) is ctypes.CDLL
    for name, *_ in kvpull._lib._PROTOS:
        fn = getattr(kvpull.lib, name)
        assert not fn._flags_ & ctypes._FUNCFLAG_PYTHONAPI, name


def test_repr(fake, layout):
    with kvpull.Agent(layout, "producer") as a:
        a.register(0, bytearray(1 << 20))
        assert repr(a) == ("<kvpull.Agent producer, engine 2 TP 1 rank 0, "
                           "1 of 4 regions registered>")
        assert a.ngroups == 1
    with kvpull.Agent(_layout(ngroups=2), "consumer") as a:
        assert a.ngroups == 2
        ids = np.zeros(1, np.uint32)
        a.pull(1, [(ids, ids)] * 2)
        assert len(fake.seen["pull"]["groups"]) == 2
