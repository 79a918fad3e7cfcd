"""Handing the heap a pass freed back to the operating system (glibc's `malloc_trim`).

A CPU forward and backward pass allocates its activations through malloc and frees them when
the pass ends, but glibc keeps freed pages in its arenas: after one policy-gradient step on 8
of the triage agent's long rows the learner rested at 8.0 GiB, 1.0 GiB once trimmed
(`bench/bench_train_memory.py --ops pg-dpo --distinct`, docs: Figures), memory the policy
server and the agents beside it could not have. Trimming once a step returns those pages at no
measured cost in time (a step's own peak is unchanged); a no-op off glibc (macOS, musl).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return getattr(libc, "malloc_trim", None)  # glibc only


def trim_heap() -> bool:
    """Return freed heap pages to the operating system; whether any were returned."""
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False
