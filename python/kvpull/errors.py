# SPDX-License-Identifier: MIT
"""kvpull's exception, :class:`Error`, and the description of codes."""
import errno as _errno

from ._lib import lib
from .enums import Reason

__all__ = ["Error", "strerror", "reason_str", "check"]


def strerror(code):
    """The library's description of ``code`` (``kvp_strerror()``): a
    negative errno returned by a kvp_ call, or 0 (a positive errno is taken
    as its negative)."""
    code = int(code)
    if code > 0:
        code = -code
    if code < -(1 << 31):
        return "unknown error"
    return lib.kvp_strerror(code).decode()


def reason_str(reason):
    """The library's description of a :class:`Reason` (``kvp_reason_str()``;
    ``"unknown reason"`` past the list)."""
    reason = int(reason)
    if not 0 <= reason < 1 << 32:
        return "unknown reason"
    return lib.kvp_reason_str(reason).decode()


class Error(OSError):
    """A kvp_ call failed (or a Python argument is out of its C range).

    Attributes:

    ``code``
        the negative errno the C call returned (``-errno.EPROTO``);
    ``errno``
        its positive value (``errno.EPROTO``), as for every OSError;
    ``strerror``
        ``kvp_strerror(code)``;
    ``func``
        the C function that refused (``"kvp_plan_compile"``);
    ``why``
        the library's one-line reason where the C API gives one (spec
        parsing, layout building and plan compiling fill a message buffer);
        the binding's, naming the argument, when it refuses a value before
        the C call (one the C type cannot hold) or names what the C call
        does not (an unknown preset); else ``None``;
    ``reason``
        a :class:`Reason` where the C API gives a code (the transport);
        ``Reason.NONE`` otherwise.

    ``str(err)`` is ``"func: strerror: why"`` (``": why"`` only when there
    is one).
    """

    def __init__(self, code, func="", why=None, reason=0):
        """An error of C code ``code`` (negative errno; a positive one is
        negated) from ``func``, with the line ``why`` and ``reason``."""
        code = int(code)
        if code > 0:
            code = -code
        super().__init__(-code, strerror(code))
        self.code = code
        self.func = func
        self.why = why or None
        try:
            self.reason = Reason(int(reason))
        except ValueError:
            self.reason = int(reason)

    def __str__(self):
        text = self.strerror
        if self.why:
            text += ": " + self.why
        if self.func:
            text = self.func + ": " + text
        return text

    def __repr__(self):
        return "kvpull.Error(%s, %r, why=%r, reason=%s)" % (
            _errno.errorcode.get(-self.code, str(self.code)), self.func,
            self.why, getattr(self.reason, "name", self.reason))

    def __reduce__(self):
        return (type(self), (self.code, self.func, self.why,
                             int(self.reason)))


def check(ret, func, why=None):
    """Return ``ret`` when it is >= 0, else raise :class:`Error` with it."""
    if ret < 0:
        raise Error(ret, func, why)
    return ret

