# SPDX-License-Identifier: MIT
"""torch tensors wherever the binding takes numpy arrays (issue 36, item 1):
block ids (int32 CPU tensors go to C where they are, int64 converted once,
values checked), KV memory (a tensor's storage: pointer and size of its
elements, which must fill one span; its shape, strides and element size
checked against the layout's region, a mismatch named), blobs and keys.
torch is never imported by the binding: a process that passes no tensor
never loads it.  Agents run on the stand-in library (fakelib.py), which
sees the addresses C would get (test_agent.py's fixtures)."""
import errno
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO

import kvpull
# the stand-in library and an agent on it (with this file's layout)
from test_agent import agent, fake  # noqa: F401

import torch  # noqa: E402 (python3-torch, scripts/install-deps.sh)


@pytest.fixture
def layout():
    m = kvpull.Model.preset("llama-3.1-8b").replace(layers=2)
    lay = kvpull.Layout.build(m, tp_size=2, tp_rank=1, engine_id=2,
                              block_tokens=16, num_blocks=32,
                              kv_layout="flash_hnd")
    yield lay
    lay.close()


def test_no_torch_import_without_a_tensor():
    code = ("import sys, numpy as np, kvpull\n"
            "ids = np.arange(8, dtype=np.uint32)\n"
            "l = kvpull.Layout.build('llama-3.1-8b', tp_size=1, "
            "block_tokens=16, num_blocks=64)\n"
            "p = kvpull.Plan.compile(l, l)\n"
            "p.emit([(ids, ids)]); kvpull.Request([(ids, [1, 2])])\n"
            "kvpull.Layout.from_meta(l.to_meta())\n"
            "print('torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], check=True,
                         capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=os.path.join(
                             REPO, "python"))).stdout
    assert out == "False\n"


# ---- block ids --------------------------------------------------------------


def test_int32_ids_zero_copy(fake, agent):
    local = torch.arange(100, 110, dtype=torch.int32)
    remote = torch.arange(7, 17, dtype=torch.int32)
    agent.pull_from(3, 5, [(local, remote, 160)])
    g = fake.seen["pull_from"]["groups"][0]
    assert g["local_ptr"] == local.data_ptr()          # zero copy
    assert g["remote_ptr"] == remote.data_ptr()
    assert g["local"].tolist() == list(range(100, 110))
    assert g["remote"].tolist() == list(range(7, 17))
    assert (g["nlocal"], g["tokens"]) == (10, 160)
    # a prepared Request over them: the same memory
    req = kvpull.Request([(local, remote, 160)])
    agent.pull_stream(3, 6, req)
    g = fake.seen["pull_stream"]["groups"][0]
    assert (g["local_ptr"], g["remote_ptr"]) == (local.data_ptr(),
                                                 remote.data_ptr())


def test_int64_and_strided_ids_converted_once(fake, agent):
    local = torch.tensor([5, 1, 1 << 31], dtype=torch.int64)
    remote = torch.arange(0, 12, dtype=torch.int32)[::4]   # not contiguous
    agent.pull(9, [(local, remote)])
    g = fake.seen["pull"]["groups"][0]
    assert g["local"].tolist() == [5, 1, 1 << 31]
    assert g["remote"].tolist() == [0, 4, 8]
    assert g["local_ptr"] != local.data_ptr()          # C takes uint32
    # values checked as for numpy: -ERANGE, nothing called
    before = len(fake.calls)
    for bad in (torch.tensor([3, -1]), torch.tensor([1 << 32])):
        with pytest.raises(kvpull.Error) as ei:
            agent.pull(9, [(bad, remote[:2])])
        assert ei.value.code == -errno.ERANGE
    with pytest.raises(TypeError, match="must hold integers"):
        agent.pull(9, [(torch.zeros(2), remote[:2])])
    assert fake.calls[before:] == []


def test_ids_not_on_the_cpu_refused():
    meta = torch.empty(3, dtype=torch.int32, device="meta")
    with pytest.raises(kvpull.Error) as ei:
        kvpull.Request([(meta, meta)])
    assert ei.value.code == -errno.EINVAL
    assert "group 0 local ids: a tensor on meta" in str(ei.value)


def test_plan_emit_from_tensors_equals_numpy():
    lay = kvpull.Layout.build("llama-3.1-8b", tp_size=1, block_tokens=16,
                              num_blocks=256, kv_layout="flash_hnd")
    rem = kvpull.Layout.build("llama-3.1-8b", tp_size=2, block_tokens=16,
                              num_blocks=256, kv_layout="flash_hnd")
    plan = kvpull.Plan.compile(lay, rem, max_sge=16)
    rng = np.random.default_rng(36)
    lo = rng.permutation(256)[:40].astype(np.int32)
    ro = rng.permutation(256)[:40].astype(np.int32)
    a = plan.emit([(lo, ro)])
    b = plan.emit([(torch.from_numpy(lo), torch.from_numpy(ro).long())])
    assert a.wrs.tobytes() == b.wrs.tobytes()
    assert a.sges.tobytes() == b.sges.tobytes()
    # a prepared Request over int32 tensors keeps them, no copy
    t = torch.from_numpy(lo)
    req = kvpull.Request([(t, t)])
    assert plan.emit(req).wrs.size > 0
    plan.close()
    lay.close()
    rem.close()


def test_blob_and_keys_from_tensors(layout):
    blob = layout.to_meta()
    t = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
    back = kvpull.Layout.from_meta(t)
    assert back.to_meta() == blob
    back.close()
    layout.set_region_keys(0, 0x1000, 0, torch.tensor([77],
                                                      dtype=torch.int32))
    assert layout.region_key(0) == (0x1000, 77)


# ---- KV memory --------------------------------------------------------------


def _hnd(heads=4, dtype=torch.bfloat16):
    """One layer's K and V as vLLM allocates them for disaggregated
    serving: memory (2, blocks, heads, block, dim), the logical tensor
    (2, blocks, block, heads, dim) a transposed view."""
    mem = torch.zeros(2, 32, heads, 16, 128, dtype=dtype)
    return mem, mem.permute(0, 1, 3, 2, 4)


def test_register_tensor_storage(fake, agent):
    mem, kv = _hnd()
    assert not kv.is_contiguous()
    k = kv[0]                         # vLLM's view: K of layer 0
    agent.register(0, k)
    assert fake.seen["register"] == (0, mem.data_ptr(), mem[0].numel() * 2)
    agent.register(1, mem[1])         # the memory order itself
    assert fake.seen["register"] == (1, mem[1].data_ptr(),
                                     mem[1].numel() * 2)
    # the agent keeps the tensor referenced until close
    assert any(x is k for x in agent._regions[0][2])
    assert agent.registered[0] == (mem.data_ptr(), 32 * 4 * 16 * 128 * 2)


def test_register_tensor_refusals_name_the_mismatch(fake, agent):
    mem, kv = _hnd()
    before = len(fake.calls)
    # a slice of heads is not one span
    with pytest.raises(kvpull.Error) as ei:
        agent.register(0, kv[0][:, :, :2])
    e = ei.value
    assert e.code == -errno.EINVAL
    assert e.why == "the tensor (shape (32, 16, 2, 128), strides (8192, " \
        "128, 2048, 1)) is not dense: dim 0 has stride 8192 where a tensor " \
        "filling its memory has 4096 (a view of part of a larger tensor?); " \
        "register the whole tensor"
    # NHD memory where the layout says HND
    nhd = torch.zeros(32, 16, 4, 128, dtype=torch.bfloat16)
    with pytest.raises(kvpull.Error) as ei:
        agent.register(0, nhd)
    assert "region 0: the tensor's dim 1 (16 x 1024 bytes) is none of the " \
        "layout's (4 x 4096, 16 x 256, 32 x 16384, 128 x 2)" in ei.value.why
    # four-byte elements where the layout has two
    f32 = torch.zeros(32, 4, 16, 64, dtype=torch.float32)
    with pytest.raises(kvpull.Error) as ei:
        agent.register(0, f32)
    assert ei.value.why == "region 0: the tensor's elements are 4 bytes, " \
        "the layout's 2"
    # another number of heads (a TP 1 cache on a TP 2 rank's region)
    _m, kv8 = _hnd(heads=8)
    with pytest.raises(kvpull.Error) as ei:
        agent.register(0, kv8[0])
    assert ei.value.why.startswith("region 0: the tensor's dim 0 (32 x "
                                   "32768 bytes) is none of the layout's")
    assert fake.calls[before:] == []
    # a flat byte tensor is a plain buffer: the C call checks its size
    agent.register(2, torch.zeros(32 * 4 * 16 * 128 * 2, dtype=torch.uint8))
    assert fake.seen["register"][0] == 2
