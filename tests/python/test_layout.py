# SPDX-License-Identifier: MIT
"""Presets, layouts (built, parsed, made with the builders), metadata blobs,
region keys, and their errors, against kvpull-plan and the documented blob
format (plan/wire.c)."""
import array
import errno
import gc
import struct

import numpy as np
import pytest

from conftest import layouts, run_tool, tool_json

import kvpull
from kvpull import Error, Layout


def side(doc):
    """A side of kvpull-plan --json without what only the tool knows."""
    return {k: v for k, v in doc.items()
            if k not in ("spec", "model", "engine")}


# ---- presets and models -------------------------------------------------


def test_presets_are_the_tools_list():
    listed = [line.split()[0] for line in run_tool("--list")[1].splitlines()]
    assert kvpull.presets() == listed
    assert listed[:2] == ["llama-3.1-8b", "llama-3.1-70b"]
    assert len(listed) == 13


@pytest.mark.parametrize("name", ["llama-3.1-8b", "llama-3.1-70b",
                                  "deepseek-v3", "gemma-2-9b",
                                  "nemotron-h-8b", "qwen3-next-80b-a3b"])
def test_model_preset_matches_tool(name):
    want = tool_json("--model", name)["local"]["model"]
    m = kvpull.Model.preset(name)
    got = m.to_dict()
    assert got.pop("comp_mask") == 0
    got["state_kind"] = str(kvpull.StateKind(got["state_kind"]))
    assert got == want


def test_model_preset_values_and_replace():
    m = kvpull.Model.preset("LLAMA-3.1-70B")          # any case
    assert (m.name, m.layers, m.kv_heads, m.head_dim, m.dtype_bytes) == \
        ("llama-3.1-70b", 80, 8, 128, 2)
    m4 = m.replace(layers=4)
    assert (m.layers, m4.layers, m4.name) == (80, 4, "llama-3.1-70b")
    with pytest.raises(AttributeError):
        m.replace(heads=3)
    n = kvpull.Model.preset("nemotron-h-8b")
    assert (n.state_kind, n.state_layers, n.ssm_heads) == \
        (kvpull.StateKind.MAMBA2, 24, 128)


def test_unknown_preset():
    with pytest.raises(Error) as ei:
        kvpull.Model.preset("foo")
    e = ei.value
    assert (e.code, e.errno, e.func) == (-errno.ENOENT, errno.ENOENT,
                                         "kvp_model_preset")
    assert str(e) == ("kvp_model_preset: no such preset, device or entry: "
                      "unknown preset 'foo'")
    assert isinstance(e, OSError)


# ---- layouts against the tool --------------------------------------------

CONFIGS = [
    dict(model="llama-3.1-8b", remote_tp=2),
    dict(model="llama-3.1-70b", local_tp=2, rank=1, remote_tp=8),
    dict(model="llama-3.1-8b", local_tp=4, rank=3, remote_tp=2,
         local_layout="flash_nhd", remote_layout="flashinfer",
         local_block=32, remote_kernel=8),
    dict(model="qwen2.5-1.5b", local_tp=4, rank=2, remote_layout="packed"),
    dict(model="deepseek-v2-lite", remote_tp=2),
    dict(model="gemma-2-9b", local_tp=2, remote_tp=4),
    dict(model="nemotron-h-8b", local_tp=2, rank=1, remote_tp=1),
    dict(model="qwen3-next-80b-a3b", remote_tp=4, local_conv="sd",
         num_blocks=2048),
]


def _ids(c):
    return "%s-%s" % (c["model"], "-".join("%s%s" % (k[:3], v)
                                           for k, v in c.items()
                                           if k != "model"))


@pytest.mark.parametrize("cfg", CONFIGS, ids=_ids)
def test_layout_to_dict_matches_tool(cfg):
    loc, rem, args = layouts(**cfg)
    doc = tool_json(*args)
    assert loc.to_dict() == side(doc["local"])
    assert rem.to_dict() == side(doc["remote"])
    assert loc.compat_hash == int(doc["local"]["compat_hash"], 16)
    assert loc.compat_hash == rem.compat_hash      # TP and layout agnostic
    i = loc.info
    assert (i.tp_size, i.tp_rank, i.engine_id) == \
        (cfg.get("local_tp", 1), cfg.get("rank", 0), 0)
    assert (i.ngroups, i.nregions, i.nviews, i.nfields) == (
        len(doc["local"]["groups"]), len(doc["local"]["regions"]),
        len(doc["local"]["views"]), len(doc["local"]["fields"]))


def test_layout_getters():
    with Layout.build("llama-3.1-8b", tp_size=2, tp_rank=1,
                      block_tokens=16, num_blocks=64,
                      kv_layout="flash_nhd", engine_id=7) as lay:
        assert (lay.engine_id, lay.tp_size, lay.tp_rank) == (7, 2, 1)
        assert lay.group(0) == kvpull.GroupDesc(kind=0, block_tokens=16)
        assert lay.region_size(0) == 64 * 16 * 4 * 128 * 2
        assert lay.view(1).to_dict() == dict(
            group=0, region=1, layer=0, num_blocks=64, offset=0,
            stride=16 * 4 * 128 * 2, comp_mask=0)
        view, fd = lay.field(1)
        assert (view, fd.kind, fd.elem_size, fd.ndim, fd.shard_dim,
                fd.shard_total) == (1, kvpull.FieldKind.V, 2, 3, 1, 8)
        assert [(d.axis, d.size, d.stride) for d in fd.dim[:3]] == \
            [(0, 16, 1024), (1, 4, 256), (2, 128, 2)]
        assert len(lay.groups) == 1 and len(lay.regions) == 64
        assert len(lay.views) == 64 and len(lay.fields) == 64
        for get in (lay.group, lay.region_size, lay.view, lay.field):
            with pytest.raises(Error) as ei:
                get(64 if get is not lay.group else 1)
            assert ei.value.code == -errno.EINVAL
            assert ei.value.strerror == "invalid argument"


# ---- errors of the builders ----------------------------------------------

BUILD_ERRORS = [
    (dict(tp_size=3), "--local-tp", 3,
     "TP 3 does not divide and is not divided by 8 KV heads; they allow "
     "TP 1, 2, 4, 8, 16, 24, ..."),
    (dict(tp_size=0), "--local-tp", 0, "TP size must be at least 1"),
    (dict(tp_size=1, kernel_block_tokens=5), None, 5,
     "kernel block 5 does not divide the block size 16"),
]


@pytest.mark.parametrize("kw,opt,val,why", BUILD_ERRORS)
def test_build_errors_exact(kw, opt, val, why):
    args = dict(block_tokens=16, num_blocks=1024, kv_layout="flash_hnd")
    args.update(kw)
    with pytest.raises(Error) as ei:
        Layout.build("llama-3.1-8b", **args)
    e = ei.value
    assert (e.code, e.why, e.func) == (-errno.EINVAL, why,
                                       "kvp_layout_build_msg")
    assert str(e) == "kvp_layout_build_msg: invalid argument: " + why
    assert e.reason == kvpull.Reason.NONE
    if opt is None:             # the tool checks this one itself
        return
    # the tool says the library's reason after naming its option
    status, _, err = run_tool("--model", "llama-3.1-8b", opt, val,
                              check=False)
    assert status in (1, 2)
    assert why in err.splitlines()[0]


def test_build_error_hybrid_pages():
    with pytest.raises(Error) as ei:
        Layout.build("nemotron-h-8b", tp_size=1, block_tokens=16,
                     num_blocks=4)
    assert ei.value.why == ("num_blocks 4 is below the 33 attention pages "
                            "one state page spans")
    _, _, err = run_tool("--model", "nemotron-h-8b", "--num-blocks", 4,
                         check=False)
    assert err.splitlines()[0] == ("kvpull-plan: local layout: " +
                                   ei.value.why + " (nemotron-h-8b)")


def test_python_range_checks():
    with pytest.raises(Error) as ei:
        Layout.build("llama-3.1-8b", tp_size=1 << 32, block_tokens=16,
                     num_blocks=8)
    assert ei.value.code == -errno.EINVAL
    assert ei.value.why == "tp_size: 4294967296 is not a uint32"
    with pytest.raises(TypeError):
        Layout.build("llama-3.1-8b", tp_sz=1)
    with pytest.raises(ValueError):
        Layout.build("llama-3.1-8b", tp_size=1, block_tokens=16,
                     num_blocks=8, kv_layout="nhd")
    with pytest.raises(TypeError):
        Layout.build(12, kvpull.EngineDesc())


def test_engine_desc_struct_form():
    e = kvpull.EngineDesc(tp_size=2, tp_rank=1, block_tokens=16,
                          num_blocks=32, kv_layout=kvpull.KvLayout.PACKED)
    a = Layout.build(kvpull.Model.preset("qwen2.5-7b"), e)
    b = Layout.build("qwen2.5-7b", tp_size=2, tp_rank=1, block_tokens=16,
                     num_blocks=32, kv_layout="packed")
    assert a.to_meta() == b.to_meta()


# ---- spec text -------------------------------------------------------------

MODEL_SPEC = """# llama on two GPUs
model = llama-3.1-8b
tp_size = 2
tp_rank = 1
block_tokens = 16
kernel_block_tokens = 8
num_blocks = 0x40
kv_layout = flash_hnd
engine_id = 0xdeadbeef
"""

EXPLICIT_SPEC = """engine tp_size=2 tp_rank=0 engine_id=7          # first
group kind=full block_tokens=16                 # group 0
group kind=state                                # group 1
region size=1M                                  # region 0
view group=0 region=0 layer=0 num_blocks=8 stride=64K        # view 0
view group=1 region=0 layer=1 num_blocks=8 stride=64K        # view 1
field view=0 kind=k elem=2 shard=1 total=4 dims=token:16:512,head:2:256,dim:128:2
field view=0 kind=v elem=2 offset=16K shard=1 total=4 dims=token:16:512,head:2:256,dim:128:2
field view=1 kind=conv_x elem=2 shard=1 total=1024 dims=state:3:1024,channel:512:2
field view=1 kind=ssm elem=4 offset=0x1000 shard=0 total=8 dims=head:4:8K,dim:64:128,state:32:4
"""


def test_parse_model_form_equals_build():
    a = Layout.parse(MODEL_SPEC)
    b = Layout.build("llama-3.1-8b", tp_size=2, tp_rank=1, block_tokens=16,
                     kernel_block_tokens=8, num_blocks=64,
                     kv_layout="flash_hnd", engine_id=0xdeadbeef)
    assert a.to_meta() == b.to_meta()
    assert Layout.parse(MODEL_SPEC.encode()).to_meta() == a.to_meta()


def test_explicit_form_equals_builders():
    parsed = Layout.parse(EXPLICIT_SPEC)
    lay = Layout.create(tp_size=2, tp_rank=0, engine_id=7)
    assert lay.add_group("full", 16) == 0
    assert lay.add_group(kvpull.GroupKind.STATE) == 1
    assert lay.add_region(1 << 20) == 0
    assert lay.add_view(0, 0, 0, 8, 64 << 10) == 0
    assert lay.add_view(1, 0, 1, num_blocks=8, stride=64 << 10) == 1
    kv = [("token", 16, 512), ("head", 2, 256), ("dim", 128, 2)]
    assert lay.add_field(0, "k", 2, kv, shard_dim=1, shard_total=4) == 0
    assert lay.add_field(0, "V", 2, kv, offset=16 << 10, shard_dim=1,
                         shard_total=4) == 1
    assert lay.add_field(1, kvpull.FieldKind.CONV_X, 2,
                         [(kvpull.Axis.STATE, 3, 1024),
                          kvpull.Dim(axis=kvpull.Axis.CHANNEL, size=512,
                                     stride=2)],
                         shard_dim=1, shard_total=1024) == 2
    assert lay.add_field(1, "ssm", 4, [("head", 4, 8192), ("dim", 64, 128),
                                       ("state", 32, 4)],
                         offset=0x1000, shard_dim=0, shard_total=8) == 3
    assert lay.to_meta() == parsed.to_meta()
    assert lay.to_dict() == parsed.to_dict()


def test_add_field_refusal_leaves_layout_unchanged():
    lay = Layout.create(tp_size=4)
    lay.add_group("full", 16)
    lay.add_region(64 << 10)
    lay.add_view(0, 0, 0, 4, 16 << 10)
    before = lay.info
    with pytest.raises(Error) as ei:       # size 4 is not the shard (2)
        lay.add_field(0, "k", 2, [("token", 16, 256), ("head", 4, 2)],
                      shard_dim=1, shard_total=8)
    assert ei.value.code == -errno.EINVAL
    assert ei.value.func == "kvp_layout_add_field"
    assert lay.info == before
    with pytest.raises(Error) as ei:
        lay.add_field(0, "k", 2, [("dim", 1, 2)] * 7)
    assert ei.value.why == "7 dims, at most 6"
    with pytest.raises(Error) as ei:
        lay.add_view(5, 0, 0, 4, 16)            # no group 5
    assert ei.value.code == -errno.EINVAL
    with pytest.raises(ValueError):
        lay.add_group("ful")


SPEC_ERRORS = [
    ("block_tokens = 16\nnum_blocks = 8\nmodel = foo\n", -errno.ENOENT,
     "line 3: unknown preset 'foo'", " (see kvpull-plan --list)"),
    ("model = llama-3.1-8b\ntp_size = 3\nblock_tokens = 16\n"
     "num_blocks = 8\n", -errno.EINVAL,
     "line 2: TP 3 does not divide and is not divided by 8 KV heads; "
     "they allow TP 1, 2, 4, 8, 16, 24, ...", ""),
    ("engine tp_size=4\ngroup kind=full block_tokens=16\nregion size=64K\n"
     "view group=0 region=0 layer=0 num_blocks=4 stride=16K\n"
     "field view=0 kind=k elem=2 shard=1 total=8 "
     "dims=token:16:256,head:4:2\n", -errno.EINVAL,
     "line 5: field rejected: the sharded dim's size 4 is not this rank's "
     "shard length 2 (total 8 over tp_size 4, rank 0)", ""),
]


@pytest.mark.parametrize("text,code,why,tool_tail", SPEC_ERRORS)
def test_spec_errors_exact(tmp_path, text, code, why, tool_tail):
    with pytest.raises(Error) as ei:
        Layout.parse(text)
    e = ei.value
    assert (e.code, e.why, e.func) == (code, why, "kvp_layout_parse")
    assert str(e) == "kvp_layout_parse: %s: %s" % (kvpull.strerror(code),
                                                    why)
    spec = tmp_path / "a.spec"
    spec.write_text(text)
    status, _, err = run_tool("--local-spec", spec, "--model",
                              "llama-3.1-8b", check=False)
    assert status == 1
    assert err == "kvpull-plan: %s: %s%s\n" % (spec, why, tool_tail)


# ---- metadata blobs --------------------------------------------------------


def expected_blob(lay):
    """The blob of a layout with one key per region, from the format
    documented in plan/wire.c, built from the getters."""
    d = lay.to_dict()
    i = lay.info
    groups = b"".join(struct.pack("<II", lay.group(g).kind,
                                  lay.group(g).block_tokens)
                      for g in range(i.ngroups))
    regions = b""
    for r in range(i.nregions):
        addr, rkey = lay.region_key(r)
        regions += struct.pack("<QQII", lay.region_size(r), addr, rkey, 0)
    views = b"".join(struct.pack("<IIIIQQ", v["group"], v["region"],
                                 v["layer"], v["num_blocks"], v["offset"],
                                 v["stride"]) for v in d["views"])
    fields = b""
    for view, fd in lay.fields:
        rec = struct.pack("<IIIIQII", view, fd.kind, fd.elem_size, fd.ndim,
                          fd.offset, fd.shard_dim, fd.shard_total)
        for k in range(6):
            dm = fd.dim[k]
            rec += struct.pack("<QII", dm.stride, dm.size, dm.axis) \
                if k < fd.ndim else bytes(16)
        fields += rec
    body = groups + regions + views + fields
    head = struct.pack("<4sHHIIQQIIIIII", b"KVPM", 1, 56, 56 + len(body), 0,
                       lay.compat_hash, i.engine_id, i.tp_size, i.tp_rank,
                       i.ngroups, i.nregions, i.nviews, i.nfields)
    return head + body


@pytest.mark.parametrize("cfg", CONFIGS[:2] + CONFIGS[6:7], ids=_ids)
def test_blob_bytes_and_round_trip(cfg):
    loc, _rem, _ = layouts(**cfg)
    for r in range(loc.info.nregions):
        loc.set_region_key(r, 0x7f0000000000 + r * 4096, 0x1000 + r)
    blob = loc.to_meta()
    assert blob == expected_blob(loc)
    assert len(blob) == 56 + 8 * loc.info.ngroups + \
        24 * loc.info.nregions + 32 * loc.info.nviews + \
        128 * loc.info.nfields
    for form in (blob, bytearray(blob), memoryview(blob),
                 np.frombuffer(blob, np.uint8).copy()):
        back = Layout.from_meta(form)
        assert back.to_meta() == blob
        assert back.to_dict() == loc.to_dict()
        assert back.region_key(3) == (0x7f0000000000 + 3 * 4096, 0x1003)
    buf = bytearray(len(blob) + 10)
    assert loc.meta_into(buf) == len(blob)
    assert bytes(buf[:len(blob)]) == blob
    with pytest.raises(Error) as ei:
        loc.meta_into(bytearray(len(blob) - 1))
    assert ei.value.code == -errno.EMSGSIZE


def test_blob_decode_errors():
    lay = Layout.build("llama-3.1-8b", tp_size=1, block_tokens=16,
                       num_blocks=8)
    blob = lay.to_meta()
    cases = [
        (blob[:-1], -errno.EMSGSIZE),                   # truncated
        (blob[:kvpull.META_MIN_LEN - 1], -errno.EMSGSIZE),
        (b"", -errno.EMSGSIZE),
        (b"KVPN" + blob[4:], -errno.EPROTO),            # magic
        (blob[:4] + b"\x03\x00" + blob[6:], -errno.EPROTO),   # version
        (blob[:16] + bytes([blob[16] ^ 1]) + blob[17:], -errno.EPROTO),
    ]
    for data, code in cases:
        with pytest.raises(Error) as ei:
            Layout.from_meta(data)
        assert (ei.value.code, ei.value.func) == (code, "kvp_meta_decode")
        assert ei.value.strerror == kvpull.strerror(code)
    assert kvpull.strerror(-errno.EPROTO) == \
        "malformed or incompatible peer data"
    assert kvpull.strerror(-errno.EMSGSIZE) == \
        "message too long or truncated"


def test_region_keys_and_version_2_blob():
    lay = Layout.build("llama-3.1-8b", tp_size=1, block_tokens=16,
                       num_blocks=1024)
    size = lay.region_size(0)                            # 32 MiB
    assert lay.region_keys(0)[0:2] == (0, 0)
    shift = 20
    n = -(-size // (1 << shift))
    keys = np.arange(100, 100 + n, dtype=np.uint32)
    lay.set_region_keys(0, 0x10000, shift, keys)
    addr, sh, got = lay.region_keys(0)
    assert (addr, sh, got.tolist()) == (0x10000, shift, keys.tolist())
    assert lay.region_key(0) == (0x10000, 100)
    blob = lay.to_meta()
    assert struct.unpack_from("<H", blob, 4)[0] == kvpull.META_VERSION_KEYS
    assert len(blob) == len(expected_blob(Layout.build(
        "llama-3.1-8b", tp_size=1, block_tokens=16, num_blocks=1024))) + \
        4 * (n - 1)
    back = Layout.from_meta(blob)
    assert back.region_keys(0)[2].tolist() == keys.tolist()
    assert back.to_meta() == blob
    lay.set_region_keys(1, 0, shift, array.array("I", range(n)))
    with pytest.raises(Error) as ei:                     # one key short
        lay.set_region_keys(2, 0, shift, keys[:-1])
    assert ei.value.code == -errno.EINVAL
    with pytest.raises(Error) as ei:
        lay.set_region_key(64, 0, 0)
    assert ei.value.code == -errno.EINVAL
    assert kvpull.mr_window(shift) == 1 << 17


# ---- shard ranges, enums, strings ------------------------------------------


def test_shard_range():
    assert kvpull.shard_range(8, 2, 1) == (4, 4)
    assert kvpull.shard_range(8, 8, 7) == (7, 1)
    assert kvpull.shard_range(2, 8, 5) == (1, 1)       # replicated
    for args in ((8, 3, 0), (8, 2, 2)):
        with pytest.raises(Error) as ei:
            kvpull.shard_range(*args)
        assert ei.value.code == -errno.EINVAL
        assert str(ei.value) == "kvp_shard_range: invalid argument"


def test_enums_and_strings():
    assert str(kvpull.FieldKind.CONV_X) == "conv_x"
    assert kvpull.KvLayout.parse("FLASH_HND") is kvpull.KvLayout.FLASH_HND
    assert kvpull.KvLayout.parse(2) is kvpull.KvLayout.FLASHINFER
    with pytest.raises(ValueError):
        kvpull.Axis.parse("row")
    assert kvpull.Reason.IDS_RANGE.describe() == "block id out of range"
    assert kvpull.reason_str(kvpull.Reason.LAYOUT) == \
        "layouts cannot be matched"
    assert kvpull.reason_str(999) == "unknown reason"
    assert kvpull.strerror(0) == "success"
    assert kvpull.strerror(errno.ERANGE) == "block id out of range"
    assert kvpull.strerror(-12345) == "unknown error"


# ---- lifetime ---------------------------------------------------------------


class _CountingLib:
    """Wraps the ctypes library, counting destroy calls."""

    def __init__(self, lib):
        self._lib = lib
        self.destroyed = []

    def __getattr__(self, name):
        fn = getattr(self._lib, name)
        if name.endswith("_destroy"):
            def wrapped(h):
                self.destroyed.append((name, h))
                return fn(h)
            return wrapped
        return fn


def test_close_context_manager_and_gc(monkeypatch):
    import kvpull.layout as L
    gc.collect()
    counting = _CountingLib(L.lib)
    monkeypatch.setattr(L, "lib", counting)
    lay = Layout.create()
    h = lay.handle
    with lay as same:
        assert same is lay
    assert lay.closed and counting.destroyed == [("kvp_layout_destroy", h)]
    lay.close()                                     # idempotent
    assert len(counting.destroyed) == 1
    with pytest.raises(ValueError):
        lay.info
    assert repr(lay) == "<kvpull.Layout closed>"
    lay2 = Layout.create()
    h2 = lay2.handle
    del lay2                                        # no cycle: freed now
    assert counting.destroyed[1:] == [("kvp_layout_destroy", h2)]
    tmp = Layout.create(tp_size=2)
    ht = tmp.handle
    c = tmp.clone()
    del tmp
    assert counting.destroyed[2:] == [("kvp_layout_destroy", ht)]
    c.add_group("full", 16)
    assert c.info.ngroups == 1 and c.tp_size == 2
    hc = c.handle
    c.close()
    c.close()
    del c
    gc.collect()
    assert counting.destroyed[3:] == [("kvp_layout_destroy", hc)]


def test_clone_is_independent():
    a = Layout.create(tp_size=2, engine_id=3)
    a.add_group("full", 16)
    b = a.clone()
    b.add_region(4096)
    assert (a.info.nregions, b.info.nregions) == (0, 1)
    assert b.engine_id == 3


def _rss_kib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4


def test_no_leak_building_and_dropping_layouts():
    def cycle():
        lay = Layout.build("llama-3.1-70b", tp_size=2, block_tokens=16,
                           num_blocks=1024)
        blob = lay.to_meta()
        Layout.from_meta(blob).close()
        lay.clone()                   # dropped: freed by __del__
    for _ in range(50):
        cycle()
    gc.collect()
    before = _rss_kib()
    for _ in range(1000):
        cycle()
    gc.collect()
    grown = _rss_kib() - before
    # each cycle makes three layouts of 160 regions and a 34 KiB blob: a
    # leak of any of them would grow RSS by tens of MiB here
    assert grown < 4096, "RSS grew by %d KiB" % grown
