"""The allocator policy of the console script (allocator.py), observed through glibc itself."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from depthlens import allocator

# Allocates a 64 MiB block with malloc and prints by how much that raises the blocks glibc serves
# by mmap (mallinfo2().hblks) and the bytes it has mapped that way (hblkhd), before and after the
# policy.
_PROBE = r"""
import ctypes, sys
from depthlens.allocator import keep_freed_memory

class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
libc.mallinfo2.restype = Info

def mapped():
    start = libc.mallinfo2()
    block = libc.malloc(64 << 20)
    ctypes.memset(block, 1, 64 << 20)
    info = libc.mallinfo2()
    libc.free(block)
    return info.hblks - start.hblks, info.hblkhd - start.hblkhd

before = mapped()
applied = keep_freed_memory() if sys.argv[1] == "policy" else None
print(before, mapped(), applied)
"""


def _probe(arm: str) -> list:
    out = subprocess.run([sys.executable, "-c", _PROBE, arm], capture_output=True, text=True, check=True).stdout
    return [ast.literal_eval(word) for word in out.replace(", ", ",").split()]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is glibc's (Linux)")
def test_large_blocks_come_from_the_heap_under_the_policy() -> None:
    try:
        plain = _probe("plain")
    except subprocess.CalledProcessError as exc:  # musl and older glibc lack mallinfo2
        pytest.skip(f"this C library cannot be probed: {exc.stderr.strip().splitlines()[-1]}")
    # glibc's default: a 64 MiB block is a mapping of its own, before and after
    one_mapping = plain[0]
    assert one_mapping[0] == 1 and one_mapping[1] >= 64 << 20
    assert plain == [one_mapping, one_mapping, None]
    assert _probe("policy") == [one_mapping, (0, 0), True]


def test_elsewhere_nothing_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allocator.sys, "platform", "darwin")
    assert allocator.keep_freed_memory() is False
