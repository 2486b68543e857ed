"""actors.heap: free memory stranded in the middle of a fragmented heap goes back to the OS."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from horizonrl.actors.heap import can_trim

# In a fresh process: fill 256 MB of the heap with 4 KB blocks, free all but every 64th (the
# survivors pin the heap, so glibc cannot give the free space back on its own), then trim.
_FRAGMENT = """
import ctypes, json, psutil
from horizonrl.actors.heap import trim_heap
libc, me = ctypes.CDLL(None), psutil.Process()
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
blocks = [libc.malloc(4096) for _ in range(65536)]
for p in blocks:
    ctypes.memset(p, 1, 4096)
for i, p in enumerate(blocks):
    if i % 64:
        libc.free(p)
before = me.memory_info().rss
released = trim_heap()
print(json.dumps({"before": before, "after": me.memory_info().rss, "released": released}))
"""


@pytest.mark.skipif(not can_trim(), reason="the C library has no malloc_trim (not glibc)")
def test_trim_returns_fragmented_free_memory():
    out = subprocess.run([sys.executable, "-c", _FRAGMENT], capture_output=True, text=True,
                         timeout=60, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    freed_mb = (got["before"] - got["after"]) / 2**20
    print(f"\nRSS {got['before'] >> 20} MB -> {got['after'] >> 20} MB after trim")
    assert got["released"]
    assert freed_mb > 150  # of the ~252 MB freed; without the trim RSS would not move
