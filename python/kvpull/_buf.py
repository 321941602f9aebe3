# SPDX-License-Identifier: MIT
"""Buffers handed to C (internal): uint32 id and key arrays without copies."""
import errno

import numpy as np

from . import _torch
from .errors import Error

_U32 = np.dtype(np.uint32)
_I32 = np.dtype(np.int32)
_MAX_U32 = (1 << 32) - 1


def u32_array(obj, func, what):
    """Return ``obj`` as a C-contiguous native uint32 (or int32) numpy array.

    A numpy array of dtype uint32 or int32 (native byte order, contiguous),
    or any buffer of such items (``array.array('I')``, a memoryview), is
    used as it is: no copy, the C call reads the caller's memory.  Other
    integer arrays and sequences are converted (a copy), their values
    checked to fit in a uint32 (:class:`Error` -ERANGE when one does not).
    A CPU ``torch.Tensor`` is taken as the numpy array over its memory
    (int32: no copy; int64: converted once; :class:`Error` -EINVAL on
    another device).
    """
    if isinstance(obj, np.ndarray):
        a = obj
    elif _torch.is_tensor(obj):
        a = _torch.ids_array(obj, func, what)
    else:
        try:
            a = np.asarray(memoryview(obj))
        except TypeError:
            a = np.asarray(obj)
    if a.dtype != _U32 and a.dtype != _I32:
        if a.size == 0:
            return np.empty(0, _U32)
        if a.dtype.kind not in "iu":
            raise TypeError("%s: %s must hold integers, not %s"
                            % (func, what, a.dtype))
        lo, hi = int(a.min()), int(a.max())
        if lo < 0 or hi > _MAX_U32:
            bad = lo if lo < 0 else hi
            raise Error(-errno.ERANGE, func,
                        "%s: %d is not a uint32" % (what, bad))
        return np.ascontiguousarray(a, dtype=_U32).reshape(-1)
    if not a.dtype.isnative:
        return np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("=")) \
            .reshape(-1)
    if not a.flags.c_contiguous:
        a = np.ascontiguousarray(a)
    if a.ndim != 1:
        a = a.reshape(-1)
    return a


def byte_view(obj):
    """Return ``obj`` (bytes, bytearray, memoryview, numpy array...) as a
    contiguous uint8 numpy array, sharing its memory when it can (a
    ``torch.Tensor`` through ``Tensor.numpy()``)."""
    if _torch.is_tensor(obj):
        obj = _torch.byte_array(obj)
    if isinstance(obj, np.ndarray) and obj.flags.c_contiguous:
        return obj.reshape(-1).view(np.uint8)
    try:
        return np.frombuffer(obj, dtype=np.uint8)
    except (ValueError, TypeError):
        return np.frombuffer(bytes(memoryview(obj)), dtype=np.uint8)


def writable_records(arr, dtype, func, what):
    """Check that ``arr`` is a writable, C-contiguous 1-D numpy array of
    ``dtype`` (the C call writes into it) and return it."""
    if not isinstance(arr, np.ndarray) or arr.dtype != dtype:
        raise TypeError("%s: %s must be a numpy array of dtype %s"
                        % (func, what, dtype))
    if arr.ndim != 1 or not arr.flags.c_contiguous:
        raise ValueError("%s: %s must be 1-D and C-contiguous" % (func, what))
    if not arr.flags.writeable:
        raise ValueError("%s: %s is read-only" % (func, what))
    return arr


def check_u32(value, func, what):
    """Return ``value`` as an int in 0..2^32-1, or raise :class:`Error`
    -EINVAL naming it (ctypes would silently truncate)."""
    v = int(value)
    if not 0 <= v <= _MAX_U32:
        raise Error(-errno.EINVAL, func, "%s: %d is not a uint32" % (what, v))
    return v


def check_u64(value, func, what):
    """As :func:`check_u32`, for 64 bits."""
    v = int(value)
    if not 0 <= v < 1 << 64:
        raise Error(-errno.EINVAL, func, "%s: %d is not a uint64" % (what, v))
    return v
