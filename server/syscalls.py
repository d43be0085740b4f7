"""Raw Linux system calls the standard library does not wrap (openat2, Landlock, prctl).

Each returns the kernel's result, or minus the errno: callers decide what a failure means.
"""

from __future__ import annotations

import ctypes
from typing import Any


def _load_libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


_libc = _load_libc()
if _libc is not None:
    _libc.syscall.restype = ctypes.c_long
    _libc.prctl.restype = ctypes.c_int


def available() -> bool:
    return _libc is not None


def raw_syscall(number: int, *args: Any) -> int:
    """syscall(2), each argument already a C value: c_long for integers (the kernel reads longs),
    c_char_p, byref(...) or None for pointers.

    No conversion here: the call sits on the server's per-file path (openat2).
    """
    if _libc is None:
        return -38  # ENOSYS
    result = int(_libc.syscall(ctypes.c_long(number), *args))
    return result if result >= 0 else -ctypes.get_errno()


def prctl(option: int, value: int) -> int:
    if _libc is None:
        return -38
    result = int(
        _libc.prctl(
            ctypes.c_int(option),
            ctypes.c_ulong(value),
            ctypes.c_ulong(0),
            ctypes.c_ulong(0),
            ctypes.c_ulong(0),
        )
    )
    return result if result >= 0 else -ctypes.get_errno()
