"""heap.py: a block freed above glibc's mmap threshold must not raise it (else the next step's blocks of that
size come from the heap, which then grows without end in a training run)."""

import ctypes
import subprocess
import sys

import pytest

from blockdraft.heap import fix_mmap_threshold

# In a fresh interpreter: free a 4 MiB block (mmapped at glibc's start threshold of 128 KiB), then ask for 2 MiB and
# print whether it was mmapped too (mallinfo2's count of mmapped blocks rose) or came from the heap.
PROBE = """
import ctypes, sys
from blockdraft.heap import fix_mmap_threshold
class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
libc.mallinfo2.restype = Info
if sys.argv[1] == "fixed":
    assert fix_mmap_threshold()
libc.free(libc.malloc(4 << 20))
before = libc.mallinfo2().hblks
block = libc.malloc(2 << 20)
print("mmapped" if libc.mallinfo2().hblks == before + 1 else "heap")
libc.free(block)
"""


def _glibc_with_mallinfo2() -> bool:
    try:
        return sys.platform.startswith("linux") and hasattr(ctypes.CDLL(None), "mallinfo2")
    except OSError:
        return False


def _where(mode: str) -> str:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
    return out.stdout.strip()


@pytest.mark.skipif(not _glibc_with_mallinfo2(), reason="glibc >= 2.33 only (mallinfo2)")
def test_a_freed_large_block_no_longer_raises_the_threshold():
    # The probe itself: without the fix glibc raises its threshold and serves the 2 MiB block from the heap.
    assert _where("default") == "heap", "glibc no longer raises its mmap threshold: the probe sees nothing"
    assert _where("fixed") == "mmapped", "after fix_mmap_threshold a freed 4 MiB block still raised the threshold"


def test_elsewhere_nothing_is_done(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    assert fix_mmap_threshold() is False
