# SPDX-License-Identifier: MIT
"""An owned C handle's lifetime, shared by Layout and Plan (internal)."""
from ctypes import c_void_p

__all__ = ["Handle"]


class Handle:
    """Owns one C object by address: :attr:`handle`, ctypes' conversion
    (``_as_parameter_``), :meth:`close` (idempotent; the subclass frees in
    :meth:`_free`), ``with`` blocks, and a close when garbage-collected.
    Subclasses set ``_what`` (the C type's name, for messages)."""

    __slots__ = ()
    _what = "object"

    @property
    def handle(self):
        """The C object's address as an int; :class:`ValueError` once
        closed."""
        h = self._handle
        if not h:
            raise ValueError("the %s is closed" % self._what)
        return h

    @property
    def _as_parameter_(self):
        return c_void_p(self.handle)

    @property
    def closed(self):
        """True once :meth:`close` ran."""
        return not self._handle

    def close(self):
        """Free the C object; idempotent."""
        h, self._handle = self._handle, None
        self._free(h)

    def _free(self, h):
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may be gone
            pass
