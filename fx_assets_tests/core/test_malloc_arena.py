"""``malloc_arena.use_one_arena``: importing fx_assets makes worker threads allocate from glibc's
main arena, the one each run's heap release trims (core/malloc_arena.py says why).

Fresh interpreters: a thread keeps the arena it got first, so the limit only holds in a process
that set it before its threads allocated. The control sets ``MALLOC_ARENA_MAX`` (the user's
choice wins over ours) and must see the worker's own arena, so the check can fail.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

CHILD = r"""
import ctypes, json, re, tempfile, threading
import numpy as np
import fx_assets  # noqa: F401

def work():
    blocks = [np.ones(2**20 // 8) for _ in range(8)]  # from the thread's arena (below the mmap threshold once raised)
    small = [bytearray(200_000) for _ in range(8)]
    del blocks, small

big = np.ones(24 * 2**20 // 8)  # freeing it raises glibc's mmap threshold: 1 MiB blocks come from an arena
del big
t = threading.Thread(target=work)
t.start()
t.join()
libc = ctypes.CDLL(None)
libc.fopen.restype = ctypes.c_void_p
with tempfile.NamedTemporaryFile(suffix=".xml") as fh:
    fp = libc.fopen(fh.name.encode(), b"w")
    libc.malloc_info(0, ctypes.c_void_p(fp))
    libc.fclose(ctypes.c_void_p(fp))
    xml = open(fh.name).read()
print(json.dumps({"arenas": len(re.findall(r"<heap nr=", xml))}))
"""


def _arenas(env: dict[str, str]) -> int:
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True, env=env)
    return int(json.loads(out.stdout.strip().splitlines()[-1])["arenas"])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt(M_ARENA_MAX) is glibc's")
def test_worker_threads_allocate_from_the_main_arena() -> None:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    assert _arenas(env) == 1
    assert _arenas({**env, "MALLOC_ARENA_MAX": "8"}) >= 2  # the user's setting wins: the worker got its own
