"""Keep freed memory in the process instead of handing it back to the OS (glibc only; a no-op elsewhere).

Training steps and batched teacher passes allocate and free tensors of tens to hundreds of MB every step (logits
over the draft vocabulary of every window, and their gradients). glibc serves blocks that large with ``mmap`` and
returns them with ``munmap`` on free, so every step faults in and zeroes fresh pages: measured on a 2-core EPYC
(distillation step of the default recipe, one thread), 250 k page faults and ~45% of the step in the kernel. With
``mmap`` off for the heap and trimming off, freed blocks are reused: 27 k faults per step, 3.9 -> 2.1 s/step
(float32). The price: the process keeps its peak heap until it exits, which suits a training worker or a teacher
actor, not a long-lived server that sees rare peaks.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_done = False


def keep_freed_memory() -> bool:
    """Ask glibc to serve large blocks from the heap and never trim it. True if applied (idempotent)."""
    global _done
    if _done:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _done = bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))
    return _done
