# SPDX-License-Identifier: MIT
"""Layouts from a serving engine's own KV tensors, as vLLM allocates them
(issue 36): no vLLM import, the tensors (torch or numpy) are read for their
shapes, strides and element sizes only.

vLLM hands a KV connector ``kv_caches``, one tensor per attention layer
(``register_kv_caches(kv_caches: dict[str, torch.Tensor])``), shaped by
the attention backend:

================  =============================================  ==========
backend           logical shape per layer                         regions
================  =============================================  ==========
``"flash"``       ``(2, num_blocks, block_size, kv_heads, dim)``  K and V
``"flashinfer"``  ``(num_blocks, 2, block_size, kv_heads, dim)``  the layer
``"mla"``         ``(num_blocks, block_size, latent)`` (576)      the layer
================  =============================================  ==========

and allocated in a *stride order*: for disaggregated serving vLLM uses HND
(``(0, 1, 3, 2, 4)`` for FlashAttention, ``(0, 1, 3, 2, 4)`` for
FlashInfer: heads outside tokens in each block), so the logical tensor is
a transposed view of dense memory.  :func:`layout_from_kv_caches` reads
each dim's stride and builds the kvpull layout of exactly that memory with
the layout builders (one group; per layer a view of each region; fields
whose dims are the page's dims outermost first), the heads' axis sharded
across the TP ranks.  Shapes, strides and element sizes are checked, and
any mismatch is named: a tensor that is not dense (a slice), the blocks
not outermost, another stride order than the one asked for, layers that
differ, another number of heads than this rank holds, another element
size than the one asked for.
"""
import errno
import re

from . import _torch
from .errors import Error
from .layout import Layout, shard_range

__all__ = ["KVCacheLayout", "layout_from_kv_caches", "BACKENDS",
           "HND_STRIDE_ORDER"]

#: The backends :func:`layout_from_kv_caches` knows: per backend, the
#: names of the logical dims.
BACKENDS = {
    "flash": ("kv", "block", "token", "head", "dim"),
    "flashinfer": ("block", "kv", "token", "head", "dim"),
    "mla": ("block", "token", "dim"),
}

#: vLLM's stride order for FlashAttention and FlashInfer in HND (the
#: order its NIXL connector asks for when TP sizes differ).
HND_STRIDE_ORDER = (0, 1, 3, 2, 4)

_F = "layout_from_kv_caches"


def _einval(why):
    return Error(-errno.EINVAL, _F, why)


def _geometry(t):
    """``(shape, strides in elements, element size)`` of a torch tensor or
    a numpy array."""
    if _torch.is_tensor(t):
        return tuple(t.shape), tuple(t.stride()), t.element_size()
    item = t.itemsize
    if any(s % item for s in t.strides):
        raise _einval("strides %s are not multiples of the %d-byte "
                      "element" % (t.strides, item))
    return tuple(t.shape), tuple(s // item for s in t.strides), item


def _dense_strides(shape, order):
    """The strides of a tensor of logical ``shape`` allocated densely in
    ``order`` (vLLM's stride order: the memory's dims, outermost first,
    as logical dim indices)."""
    strides = [0] * len(shape)
    s = 1
    for i in reversed(order):
        strides[i] = s
        s *= shape[i]
    return tuple(strides)


def _layer_index(name, i):
    m = re.search(r"\d+", name) if isinstance(name, str) else None
    return (int(m.group()) if m else i, i)


class KVCacheLayout:
    """What :func:`layout_from_kv_caches` found: ``layout`` (the
    :class:`Layout`, owned: :meth:`close`), ``regions`` (region ``i``'s
    tensor, for :meth:`Agent.register_all <kvpull.Agent.register_all>`:
    each layer's K and V halves for FlashAttention, each layer's tensor
    otherwise), ``layer_names`` (in layer order), ``backend``,
    ``num_blocks``, ``block_size``, ``heads`` (``(start, count)`` of the
    global KV heads this rank holds; ``(0, 1)`` for MLA), ``num_kv_heads``,
    ``head_size`` (the latent's size for MLA), ``elem_size``,
    ``stride_order`` (the order found, vLLM's notation) and
    ``page_bytes`` (one block of one layer, K and V)."""

    def __init__(self, **kw):
        for k, v in kw.items():
            setattr(self, k, v)

    def close(self):
        """Free the layout."""
        self.layout.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return ("<kvpull.vllm.KVCacheLayout %s: %d layers, %d blocks of %d "
                "tokens, heads %d+%d of %d, stride order %s>" % (
                    self.backend, len(self.layer_names), self.num_blocks,
                    self.block_size, self.heads[0], self.heads[1],
                    self.num_kv_heads, self.stride_order))


def layout_from_kv_caches(kv_caches, backend="flash", *, num_kv_heads=None,
                          tp_size=1, tp_rank=0, engine_id=0,
                          stride_order=None, dtype_bytes=None):
    """The kvpull layout of one rank's KV caches as vLLM allocates them
    (see the module): a :class:`KVCacheLayout`.

    ``kv_caches`` is vLLM's ``dict`` of layer name to tensor (ordered by
    the layer index in the name, as vLLM's ``extract_layer_index``), or a
    list in layer order; torch tensors or numpy arrays.  ``backend`` is
    ``"flash"``, ``"flashinfer"`` or ``"mla"``.  ``num_kv_heads`` is the
    model's total (all ranks; default: this rank's heads times
    ``tp_size``); this rank must hold ``shard_range(num_kv_heads,
    tp_size, tp_rank)`` of them (with fewer heads than ranks, one head,
    replicated).  ``stride_order``, if given, is the order the tensors must
    have been allocated in (``HND_STRIDE_ORDER``; else any dense order
    with the blocks outermost); ``dtype_bytes``, if given, the element
    size they must have.  :class:`Error` -EINVAL naming the mismatch."""
    if backend not in BACKENDS:
        raise _einval("unknown backend %r (want one of %s)"
                      % (backend, ", ".join(BACKENDS)))
    names = BACKENDS[backend]
    if isinstance(kv_caches, dict):
        items = sorted(((_layer_index(n, i), n, t) for i, (n, t) in
                        enumerate(kv_caches.items())), key=lambda x: x[0])
        items = [(n, t) for _k, n, t in items]
    else:
        items = [("layer %d" % i, t) for i, t in enumerate(kv_caches)]
    if not items:
        raise _einval("no KV cache tensors")
    first = None
    for name, t in items:
        shape, strides, item = _geometry(t)
        where = "%s: shape %s, strides %s" % (name, shape, strides)
        if len(shape) != len(names):
            raise _einval("%s: %d dims, a %s KV cache has %d (%s)" % (
                where, len(shape), backend, len(names), ", ".join(names)))
        if first is None:
            first = (shape, strides, item, where)
        elif (shape, strides, item) != first[:3]:
            raise _einval("%s, %d-byte elements: not as the first layer "
                          "(%s, %d-byte elements)" % (where, item, first[3],
                                                      first[2]))
    shape, strides, item, where = first
    dims = dict(zip(names, range(len(names))))
    if "kv" in dims and shape[dims["kv"]] != 2:
        raise _einval("%s: dim %d (K and V) has %d entries, not 2"
                      % (where, dims["kv"], shape[dims["kv"]]))
    if dtype_bytes is not None and item != dtype_bytes:
        raise _einval("%s: %d-byte elements, the model's are %d"
                      % (where, item, dtype_bytes))
    order, bad, want = _torch.dense_order(shape, strides)
    if order is None:
        raise _einval("%s: not dense: dim %d (%s) has stride %d where a "
                      "tensor filling its memory has %d (a view of part "
                      "of a larger tensor?)" % (where, bad, names[bad],
                                                strides[bad], want))
    found = tuple(sorted(range(len(shape)),
                         key=lambda i: (-strides[i], -shape[i])))
    if stride_order is not None:
        so = tuple(stride_order)
        if sorted(so) != list(range(len(shape))):
            raise _einval("stride order %s is not a permutation of %d dims"
                          % (so, len(shape)))
        exp = _dense_strides(shape, so)
        for i in range(len(shape)):
            if shape[i] != 1 and strides[i] != exp[i]:
                raise _einval("%s: not in stride order %s (strides %s): dim "
                              "%d (%s) has stride %d, want %d" % (
                                  where, so, exp, i, names[i], strides[i],
                                  exp[i]))
    outer = ("kv", "block") if backend == "flash" else \
        ("block", "kv") if backend == "flashinfer" else ("block",)
    for k, name in enumerate(outer):
        d = dims[name]
        if shape[d] != 1 and found[k] != d:
            raise _einval("%s: dim %d (%s) must be the %s in memory; the "
                          "strides put dim %d (%s) there" % (
                              where, d, name, ("outermost", "next")[k],
                              found[k], names[found[k]]))
    nb = shape[dims["block"]]
    bs = shape[dims["token"]]
    if backend == "mla":
        heads, total, start = 1, 1, 0
    else:
        heads = shape[dims["head"]]
        total = heads * tp_size if num_kv_heads is None else num_kv_heads
        try:
            start, count = shard_range(total, tp_size, tp_rank)
        except Error as e:
            raise _einval("%d KV heads over TP %d, rank %d: %s" % (
                total, tp_size, tp_rank, e)) from None
        if heads != count:
            raise _einval("%s: %d KV heads, TP rank %d of %d holds %d of "
                          "the model's %d (heads %d-%d)" % (
                              where, heads, tp_rank, tp_size, count, total,
                              start, start + count - 1))
    # the page's dims, outermost first, with their byte strides
    axes = {"token": "token", "head": "head", "dim": "dim"}
    page = sorted((d for d in ("token", "head", "dim") if d in dims),
                  key=lambda d: (-strides[dims[d]], -shape[dims[d]]))
    fdims = [(axes[d], shape[dims[d]], strides[dims[d]] * item)
             for d in page]
    shard = page.index("head") if backend != "mla" else None
    bstride = strides[dims["block"]] * item
    lay = Layout.create(tp_size=tp_size, tp_rank=tp_rank,
                        engine_id=engine_id)
    try:
        g = lay.add_group("mla" if backend == "mla" else "full",
                          block_tokens=bs)
        regions = []
        for layer, (_name, t) in enumerate(items):
            if backend == "flash":
                halves = (("k", t[0]), ("v", t[1]))
                for kind, half in halves:
                    r = lay.add_region(nb * bstride)
                    v = lay.add_view(g, r, layer, nb, bstride)
                    lay.add_field(v, kind, item, fdims, shard_dim=shard,
                                  shard_total=total)
                    regions.append(half)
                continue
            r = lay.add_region(nb * bstride)
            v = lay.add_view(g, r, layer, nb, bstride)
            if backend == "mla":
                lay.add_field(v, "latent", item, fdims)
            else:
                kvs = strides[dims["kv"]] * item
                for j, kind in enumerate(("k", "v")):
                    lay.add_field(v, kind, item, fdims, offset=j * kvs,
                                  shard_dim=shard, shard_total=total)
            regions.append(t)
    except BaseException:
        lay.close()
        raise
    head_size = shape[dims["dim"]]
    return KVCacheLayout(
        layout=lay, regions=regions, layer_names=[n for n, _t in items],
        backend=backend, num_blocks=nb, block_size=bs,
        heads=(start, heads), num_kv_heads=total, head_size=head_size,
        elem_size=item, stride_order=found,
        page_bytes=(2 if backend != "mla" else 1) * bs * heads * head_size *
        item)
