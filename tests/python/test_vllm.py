# SPDX-License-Identifier: MIT
"""kvpull.vllm: layouts from the KV tensors vLLM allocates (issue 36,
item 2).  Each backend's shape in each stride order builds, with the TP
rank's share of the heads, the very layout the library's own builder
makes for that engine (kvp_layout_build(), compared member by member,
compatibility hash included), and its regions register as they are; each
way of being wrong is refused with -EINVAL naming the mismatch: a slice,
the blocks not outermost, another stride order than the one asked for,
another element size, another head count, layers that differ."""
import errno

import numpy as np
import pytest

import kvpull
from kvpull.vllm import HND_STRIDE_ORDER, layout_from_kv_caches
from test_agent import fake  # noqa: F401 (the stand-in library)

import torch  # noqa: E402 (python3-torch, scripts/install-deps.sh)

NB, BS, DIM = 32, 16, 128
NHD = (0, 1, 2, 3, 4)


def alloc(shape, order, dtype=torch.bfloat16):
    """A tensor of logical ``shape`` allocated densely in vLLM's stride
    ``order`` (``torch.empty(shape permuted).permute(inverse)``)."""
    mem = torch.zeros([shape[i] for i in order], dtype=dtype)
    return mem.permute(*[order.index(i) for i in range(len(shape))])


def built(model, tp, rank, kv_layout=None, layers=2, engine_id=0):
    m = kvpull.Model.preset(model).replace(layers=layers)
    kw = dict(kv_layout=kv_layout) if kv_layout else {}
    return kvpull.Layout.build(m, tp_size=tp, tp_rank=rank, block_tokens=BS,
                               num_blocks=NB, engine_id=engine_id, **kw)


CASES = [  # backend, order, kvpull's kv_layout, page shape (heads)
    ("flash", HND_STRIDE_ORDER, "flash_hnd",
     lambda h: (2, NB, BS, h, DIM)),
    ("flash", NHD, "flash_nhd", lambda h: (2, NB, BS, h, DIM)),
    ("flashinfer", HND_STRIDE_ORDER, "flashinfer",
     lambda h: (NB, 2, BS, h, DIM)),
]


@pytest.mark.parametrize("backend,order,kv_layout,shape", CASES)
@pytest.mark.parametrize("tp,rank", [(1, 0), (2, 1), (4, 2), (16, 9)])
def test_attention_layouts_equal_the_builders(fake, backend, order,
                                              kv_layout, shape, tp, rank):
    heads = max(8 // tp, 1)            # llama-3.1-8b: 8 KV heads
    caches = {"model.layers.%d.self_attn.attn" % i:
              alloc(shape(heads), order) for i in (1, 0)}
    k = layout_from_kv_caches(caches, backend, num_kv_heads=8, tp_size=tp,
                              tp_rank=rank, engine_id=7,
                              stride_order=order, dtype_bytes=2)
    ref = built("llama-3.1-8b", tp, rank, kv_layout, engine_id=7)
    assert k.layout.to_dict() == ref.to_dict()
    assert k.layout.to_meta() == ref.to_meta()
    assert k.layer_names == ["model.layers.0.self_attn.attn",
                             "model.layers.1.self_attn.attn"]
    assert k.stride_order == order
    assert k.heads == kvpull.shard_range(8, tp, rank)
    assert (k.num_blocks, k.block_size, k.head_size) == (NB, BS, DIM)
    assert k.page_bytes == 2 * BS * heads * DIM * 2
    # the regions register as they are: their storage, checked against
    # the layout (shapes, strides, element size)
    kv0 = caches["model.layers.0.self_attn.attn"]
    with kvpull.Agent(k.layout, "consumer") as a:
        a.register_all(k.regions)
        regs = a.registered
        base = kv0.data_ptr()
        if backend == "flash":
            assert len(regs) == 4
            assert regs[0] == (base, NB * BS * heads * DIM * 2)
            assert regs[1][0] == kv0[1].data_ptr()
        else:
            assert len(regs) == 2
            assert regs[0] == (base, NB * 2 * BS * heads * DIM * 2)
    ref.close()
    k.close()


def test_mla_layout_equals_the_builder(fake):
    for tp, rank in ((1, 0), (2, 1)):
        caches = [torch.zeros(NB, BS, 576, dtype=torch.bfloat16)
                  for _ in range(2)]
        k = layout_from_kv_caches(caches, "mla", tp_size=tp, tp_rank=rank)
        ref = built("deepseek-v2-lite", tp, rank)
        assert k.layout.to_dict() == ref.to_dict()
        assert (k.heads, k.head_size) == ((0, 1), 576)
        with kvpull.Agent(k.layout, "producer") as a:
            a.register_all(k.regions)
        ref.close()
        k.close()


def test_numpy_arrays_too():
    mem = np.zeros((2, NB, 8, BS, DIM), np.uint16)
    k = layout_from_kv_caches([mem.transpose(0, 1, 3, 2, 4)], "flash",
                              stride_order=HND_STRIDE_ORDER)
    ref = built("llama-3.1-8b", 1, 0, "flash_hnd", layers=1)
    assert k.layout.to_dict() == ref.to_dict()
    assert k.regions[0].ctypes.data == mem.ctypes.data
    ref.close()
    k.close()


def _refused(caches, backend="flash", **kw):
    with pytest.raises(kvpull.Error) as ei:
        layout_from_kv_caches(caches, backend, **kw)
    assert ei.value.code == -errno.EINVAL
    assert ei.value.func == "layout_from_kv_caches"
    return ei.value.why


def test_mismatches_are_named():
    hnd = alloc((2, NB, BS, 8, DIM), HND_STRIDE_ORDER)
    # a slice of the heads: not one span
    assert _refused([hnd[:, :, :, :4]]) == (
        "layer 0: shape (2, 32, 16, 4, 128), strides (524288, 16384, 128, "
        "2048, 1): not dense: dim 1 (block) has stride 16384 where a tensor "
        "filling its memory has 8192 (a view of part of a larger tensor?)")
    # NHD memory where HND is asked for
    nhd = alloc((2, NB, BS, 8, DIM), NHD)
    assert _refused([nhd], stride_order=HND_STRIDE_ORDER) == (
        "layer 0: shape (2, 32, 16, 8, 128), strides (524288, 16384, 1024, "
        "128, 1): not in stride order (0, 1, 3, 2, 4) (strides (524288, "
        "16384, 128, 2048, 1)): dim 2 (token) has stride 1024, want 128")
    # the blocks inside the page: a stride order the connector cannot use
    inner = alloc((2, NB, BS, 8, DIM), (0, 3, 1, 2, 4))
    assert _refused([inner]) == (
        "layer 0: shape (2, 32, 16, 8, 128), strides (524288, 2048, 128, "
        "65536, 1): dim 1 (block) must be the next in memory; the strides "
        "put dim 3 (head) there")
    # four-byte elements where the model has two
    f32 = alloc((2, NB, BS, 8, DIM), HND_STRIDE_ORDER, torch.float32)
    assert _refused([f32], dtype_bytes=2) == (
        "layer 0: shape (2, 32, 16, 8, 128), strides (524288, 16384, 128, "
        "2048, 1): 4-byte elements, the model's are 2")
    # a TP 1 cache on rank 1 of 2
    assert _refused([hnd], num_kv_heads=8, tp_size=2, tp_rank=1) == (
        "layer 0: shape (2, 32, 16, 8, 128), strides (524288, 16384, 128, "
        "2048, 1): 8 KV heads, TP rank 1 of 2 holds 4 of the model's 8 "
        "(heads 4-7)")
    # layers that differ
    other = alloc((2, NB, BS, 8, DIM), NHD)
    assert _refused({"layers.0": hnd, "layers.1": other}) == (
        "layers.1: shape (2, 32, 16, 8, 128), strides (524288, 16384, 1024, "
        "128, 1), 2-byte elements: not as the first layer (layers.0: shape "
        "(2, 32, 16, 8, 128), strides (524288, 16384, 128, 2048, 1), 2-byte "
        "elements)")
    # FlashInfer's shape handed as FlashAttention's, an MLA cache of 4 dims
    fi = alloc((NB, 2, BS, 8, DIM), HND_STRIDE_ORDER)
    assert _refused([fi]) == (
        "layer 0: shape (32, 2, 16, 8, 128), strides (32768, 16384, 128, "
        "2048, 1): dim 0 (K and V) has 32 entries, not 2")
    assert _refused([hnd[0]], "mla") == (
        "layer 0: shape (32, 16, 8, 128), strides (16384, 128, 2048, 1): 4 "
        "dims, a mla KV cache has 3 (block, token, dim)")
    assert _refused([], "mla") == "no KV cache tensors"
    assert _refused([hnd], "paged") == (
        "unknown backend 'paged' (want one of flash, flashinfer, mla)")
    # 3 KV heads do not split over TP 2
    h3 = alloc((2, NB, BS, 3, DIM), HND_STRIDE_ORDER)
    assert _refused([h3], num_kv_heads=3, tp_size=2).startswith(
        "3 KV heads over TP 2, rank 0: ")
