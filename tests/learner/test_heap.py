"""Trimming the heap: pages glibc kept after a free go back to the operating system."""

from __future__ import annotations

import pytest

from learner.heap import _malloc_trim, trim_heap


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


@pytest.mark.skipif(_malloc_trim() is None, reason="not glibc: nothing to trim")
def test_freed_blocks_below_a_live_one_are_returned_only_by_the_trim():
    blocks = [bytearray(100_000) for _ in range(2000)]  # 200 MB of heap blocks (below mmap's size)
    pin = bytearray(100_000)  # above them: a free below it cannot shrink the heap's top
    held = _rss_mib()
    del blocks
    freed = _rss_mib()
    assert freed > held - 50  # glibc kept the freed pages: the precondition of the test
    assert trim_heap()
    assert _rss_mib() < freed - 150
    del pin
