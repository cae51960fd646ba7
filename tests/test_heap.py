"""heap.py: the pages of freed heap blocks go back to the system (else a training run's heap keeps the pages of
every batch's differently sized tensors, and its memory grows without end)."""

import ctypes
import subprocess
import sys

import pytest

import blockdraft.train.trainer as trainer
from blockdraft import heap

from tiny_models import tiny_target
from train_fakes import config, write_data

# In a fresh interpreter: 256 blocks of 1 MiB from the heap (the mmap threshold raised above them, as glibc does
# itself once a large block is freed), written, then all but every 16th freed: holes between live blocks, which
# glibc cannot shrink the heap's top over. Prints the anonymous memory released by the optional trim, in MiB.
PROBE = """
import ctypes, sys
from blockdraft import heap
def anon():
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("RssAnon:")) / 1024
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
libc.mallopt(-3, 64 << 20)  # M_MMAP_THRESHOLD
blocks = [libc.malloc(1 << 20) for _ in range(256)]
for block in blocks:
    ctypes.memset(block, 1, 1 << 20)
for i, block in enumerate(blocks):
    if i % 16:
        libc.free(block)
before = anon()
if sys.argv[1] == "trim":
    assert heap.trim()
print(round(before - anon()))
"""

glibc = pytest.mark.skipif(not sys.platform.startswith("linux") or not hasattr(ctypes.CDLL(None), "malloc_trim"),
                           reason="glibc only (malloc_trim)")


def _released_mib(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


@glibc
def test_trim_gives_freed_heap_pages_back():
    # The probe itself: without a trim the holes keep their pages.
    assert _released_mib("keep") < 16, "freed heap blocks gave their pages back by themselves: the probe sees nothing"
    assert _released_mib("trim") > 160, "trim left the pages of 240 freed 1 MiB heap blocks in the process"


def test_elsewhere_nothing_is_done(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    assert heap.trim() is False


def test_the_heap_is_trimmed_every_few_steps(tmp_path, monkeypatch):
    # Untrimmed, a long run's heap keeps the pages of every batch's differently sized tensors (heap.py).
    calls = []
    monkeypatch.setattr(trainer.heap, "trim", lambda: calls.append(True))
    monkeypatch.setattr(trainer, "TRIM_EVERY", 2)
    write_data(tmp_path / "data", count=4)
    trainer.train(tiny_target("llama"), config(tmp_path, max_steps=5, batch_size=1))
    assert len(calls) == 2, f"steps 2 and 4 of 5 trim the heap, got {len(calls)} trims"
