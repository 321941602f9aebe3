# SPDX-License-Identifier: MIT
"""torch tensors where the binding takes numpy arrays (internal).

torch is never imported here: a tensor can only exist once its caller
imported torch, so :func:`is_tensor` looks ``torch`` up in ``sys.modules``
and answers False without it.  Block id tensors become numpy arrays over
the same memory (``Tensor.numpy()``: no copy for a CPU tensor); KV memory
is a tensor's storage, checked dense (its elements fill one span of
memory exactly, in any order of its dims) and, by :func:`check_region`,
against the layout region it is registered for.
"""
import errno
import sys

from .errors import Error

__all__ = ["is_tensor", "ids_array", "byte_array", "memory", "dense_order",
           "check_region"]


def is_tensor(x):
    """True when ``x`` is a ``torch.Tensor`` (without importing torch)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _cpu(t, func, what):
    if t.device.type != "cpu":
        raise Error(-errno.EINVAL, func, "%s: a tensor on %s; block ids "
                    "are read by the CPU: pass a CPU tensor" % (what,
                                                               t.device))


def ids_array(t, func, what):
    """A numpy array over a CPU tensor's elements (``Tensor.numpy()``, no
    copy; a tensor that requires grad is detached first).  int32 tensors
    then go to C where they are; int64 ones are converted once by the
    caller (C takes uint32 ids).  :class:`Error` -EINVAL for a tensor not
    on the CPU; :class:`TypeError` for a floating or bool one."""
    _cpu(t, func, what)
    if t.dtype.is_floating_point or t.dtype.is_complex or \
            str(t.dtype) == "torch.bool":
        raise TypeError("%s: %s must hold integers, not %s"
                        % (func, what, t.dtype))
    return t.detach().numpy()


def byte_array(t):
    """A contiguous tensor's bytes as a uint8 numpy array (no copy for a
    contiguous CPU tensor of any dtype, bf16 included)."""
    torch = sys.modules["torch"]
    t = t.detach().cpu().contiguous().reshape(-1)
    return t.view(torch.uint8).numpy() if t.numel() else \
        t.numpy().view("u1")


def dense_order(shape, strides):
    """The dims of a tensor of ``shape`` and ``strides`` (in elements)
    from the innermost out, if its elements fill ``prod(shape)``
    consecutive elements of memory (a dense tensor in some order of its
    dims, as vLLM's stride orders make them); else ``(None, dim, want)``:
    the first dim, innermost first, whose stride is not the one a dense
    tensor in that order has.  Dims of size 1 go anywhere."""
    dims = sorted((i for i in range(len(shape)) if shape[i] != 1),
                  key=lambda i: (strides[i], shape[i]))
    want = 1
    for i in dims:
        if strides[i] != want:
            return None, i, want
        want *= shape[i]
    return tuple(dims), None, None


def _describe(shape, strides):
    return "shape %s, strides %s" % (tuple(shape), tuple(strides))


def memory(t, func):
    """``(addr, nbytes, itemsize, shape, byte_strides)`` of the memory of
    tensor ``t``: its elements, which must fill one span (dense in some
    order of its dims).  :class:`Error` -EINVAL naming the dim whose stride
    breaks it: a view of part of a larger tensor (a slice of heads, of
    blocks) is not one span, and registering its storage would expose
    bytes it does not hold."""
    shape = tuple(t.shape)
    strides = tuple(t.stride())
    item = t.element_size()
    order, bad, want = dense_order(shape, strides)
    if order is None:
        raise Error(-errno.EINVAL, func, "the tensor (%s) is not dense: dim "
                    "%d has stride %d where a tensor filling its memory has "
                    "%d (a view of part of a larger tensor?); register the "
                    "whole tensor" % (_describe(shape, strides), bad,
                                      strides[bad], want))
    n = 1
    for s in shape:
        n *= s
    return (t.data_ptr(), n * item, item, shape,
            tuple(s * item for s in strides))


def region_dims(layout, region):
    """The ``(size, byte stride)`` pairs that describe layout region
    ``region``: each view's blocks, each field's dims, and the spacing of
    a view's fields when there are several (K and V in one page), and the
    fields' element sizes."""
    d = layout.to_dict()
    pairs, elem = set(), set()
    for vi, v in enumerate(d["views"]):
        if v["region"] != region:
            continue
        pairs.add((v["num_blocks"], v["stride"]))
        offs = sorted(f["offset"] for f in d["fields"] if f["view"] == vi)
        if len(offs) > 1:
            pairs.add((len(offs), offs[1] - offs[0]))
        for f in d["fields"]:
            if f["view"] != vi:
                continue
            elem.add(f["elem_size"])
            pairs.update((x["size"], x["stride"]) for x in f["dims"])
    return pairs, elem


def check_region(layout, region, item, shape, byte_strides, func):
    """Check that a tensor (element size ``item``, ``shape`` and
    ``byte_strides``) is what ``layout`` says region ``region`` holds:
    its element size is the fields', and each dim of more than one
    element is one of the region's dims (blocks, a field's axis, K/V
    spacing) with the same size and stride.  1-D tensors are plain
    buffers and are not checked.  :class:`Error` -EINVAL naming the
    mismatch."""
    if len(shape) < 2:
        return
    pairs, elem = region_dims(layout, region)
    if not pairs:
        return
    if elem and item not in elem:
        raise Error(-errno.EINVAL, func, "region %d: the tensor's elements "
                    "are %d bytes, the layout's %s" % (
                        region, item, "/".join(map(str, sorted(elem)))))
    for i, (n, s) in enumerate(zip(shape, byte_strides)):
        if n != 1 and (n, s) not in pairs:
            raise Error(-errno.EINVAL, func, "region %d: the tensor's dim %d "
                        "(%d x %d bytes) is none of the layout's (%s); "
                        "tensor %s" % (
                            region, i, n, s, ", ".join(
                                "%d x %d" % p for p in sorted(pairs)),
                            _describe(shape, byte_strides)))
