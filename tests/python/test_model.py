# SPDX-License-Identifier: MIT
"""python/examples/model.py on the host, without RDMA: its transformer,
paged caches and the layouts kvpull.vllm builds from them, with the READs
of the decode engine's plan executed by numpy (the bytes a pull moves,
from the prefill ranks' registered tensors into the decode cache) -- then
every logit of every request (bulk, streamed and with a prefix-cache hit;
TP 2 -> 1 and TP 1 -> 1) must equal, bit for bit, the reference run of the
same prefills and decodes in one cache.  A prompt of 40 tokens: the last
block is partial.  What only the VM shows (the agents, the connector over
real READs, the figures) is tests/python_rdma/test_model.py's."""
import ctypes
import importlib.util
import os

import numpy as np
import pytest

from conftest import REPO

import kvpull
from kvpull.vllm import HND_STRIDE_ORDER, layout_from_kv_caches

import torch  # noqa: E402 (python3-torch, scripts/install-deps.sh)

PATH = os.path.join(REPO, "python", "examples", "model.py")
SIZES = dict(layers=2, d_model=64, heads=4, kv_heads=2, ffn=128, vocab=97,
             prompt=40, decode=4, hit_blocks=1, rounds=1)


@pytest.fixture(scope="module")
def M():
    spec = importlib.util.spec_from_file_location("model", PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch.set_num_threads(1)
    return mod


def _bytes(t):
    """The memory a registered tensor spans, as a uint8 array (no copy)."""
    n = t.numel() * t.element_size()
    return np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(
        t.data_ptr()))


def _pull(plan, ranks, local, ids):
    """The READs of one request, done by numpy."""
    em = plan.emit(ids)
    src = [[_bytes(t) for t in k.regions] for k in ranks]
    dst = [_bytes(t) for t in local.regions]
    for off, ln, region, s, first, nsge, _g in em.wrs.tolist():
        data = src[plan.sources[s]][region][off:off + ln]
        pos = 0
        for o, n, r in em.sges[first:first + nsge].tolist():
            dst[r][o:o + n] = data[pos:pos + n]
            pos += n
    return em.nbytes


@pytest.mark.parametrize("tp", [2, 1])
def test_decode_after_pull_is_bitwise(M, tp):
    cfg = M.Config(**SIZES)
    model = M.Model(cfg)
    full = M.kv_caches(cfg, cfg.kv_heads)
    rank_caches = [M.kv_caches(cfg, kvpull.shard_range(cfg.kv_heads, tp,
                                                       r)[1])
                   for r in range(tp)]
    ranks = [layout_from_kv_caches(c, num_kv_heads=cfg.kv_heads,
                                   tp_size=tp, tp_rank=r, engine_id=1,
                                   stride_order=HND_STRIDE_ORDER)
             for r, c in enumerate(rank_caches)]
    writes = [(c, k.heads[0], k.heads[1]) for c, k in zip(rank_caches,
                                                          ranks)]
    cache = M.kv_caches(cfg, cfg.kv_heads)
    local = layout_from_kv_caches(cache, engine_id=2,
                                  stride_order=HND_STRIDE_ORDER)
    plan = kvpull.Plan.compile(local.layout, ranks[0].layout,
                               max_sge=kvpull.DEFAULT_MAX_SGE)
    assert plan.sources == list(range(tp))
    pblocks, dblocks = M.Blocks(cfg, 3), M.Blocks(cfg, 11)
    got = {}
    for name, toks, _mode, prefix in M.requests(cfg, tp):
        T, hit = len(toks), prefix[1] if prefix else 0
        # prefill: the prefix cache's blocks, then new ones
        ptab = (pblocks.tables[prefix[0]][:hit] if prefix else []) + \
            pblocks.take(-(-T // cfg.block) - hit)
        pblocks.tables[name] = ptab
        kv = M.Paged(cfg, ptab, full, [(full, 0, cfg.kv_heads)] + writes)
        first = model.forward(toks[hit * cfg.block:], hit * cfg.block, kv)
        # decode: its own prefix blocks, the tail pulled
        tail = dblocks.take(-(-T // cfg.block) - hit)
        dtab = (dblocks.tables[prefix[0]][:hit] if prefix else []) + tail
        n = _pull(plan, ranks, local, [(np.array(tail, np.int32),
                                        np.array(ptab, np.int32), T)])
        assert n == len(tail) * 2 * cfg.layers * cfg.block * \
            cfg.kv_heads * cfg.head_dim * 4
        dtab += dblocks.take(-(-(T + cfg.decode) // cfg.block) - len(dtab))
        dblocks.tables[name] = dtab
        kv = M.Paged(cfg, dtab, cache, [(cache, 0, cfg.kv_heads)])
        got[name] = [first] + M.decode(model, kv, T, int(first.argmax()),
                                       cfg.decode)
    ref = M.reference(cfg, [tp])
    assert sorted(got) == sorted(ref)
    for name in got:
        assert len(got[name]) == cfg.decode + 1
        for step, (a, b) in enumerate(zip(got[name], ref[name])):
            assert a.numpy().tobytes() == b.numpy().tobytes(), (name, step)
    # and the check can fail: the exponent byte of one K element of a
    # pulled block changed
    a = "tp%d-A1" % tp
    _bytes(cache["model.layers.1.self_attn.attn"][0])[
        dblocks.tables[a][0] * cfg.block * cfg.kv_heads * cfg.head_dim * 4 +
        3] ^= 0x40
    kv = M.Paged(cfg, dblocks.tables[a], cache, [(cache, 0, cfg.kv_heads)])
    redo = model.forward([int(ref[a][1].argmax())], cfg.prompt + 1, kv)
    assert redo.numpy().tobytes() != ref[a][2].numpy().tobytes()
    plan.close()
    local.close()
    for k in ranks:
        k.close()
