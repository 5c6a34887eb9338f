"""Process-wide glibc malloc settings the recorder relies on (no-ops off glibc).

They are process-global by nature (one allocator per process), so they live here, are idempotent, and are
applied by whatever starts encoding: the CLI at start-up and every :class:`CameraEncoder`, in any process
(thread, process and Ray workers alike).
"""

from __future__ import annotations

import ctypes
import os

_M_PERTURB = -6
_M_ARENA_MAX = -8
#: Fill byte for fresh and freed heap blocks (glibc's ``MALLOC_PERTURB_``). Any non-zero value works.
PERTURB_BYTE = 0xA5
_done: set[str] = set()


def _mallopt(param: int, value: int) -> bool:
    try:
        return bool(ctypes.CDLL("libc.so.6").mallopt(param, value))
    except (OSError, AttributeError):
        return False


def make_uninitialized_reads_deterministic() -> None:
    """Fill every heap block glibc hands out with the same byte.

    The libx264 that PyAV bundles reads a few bytes of memory it never wrote (its SIMD kernels run past the
    visible picture), so the same frames encoded twice in one process gave different H.264 bytes: 7 distinct
    streams out of 30 for a 32x32 toy camera, which broke "a resumed job commits the same content hashes as
    a clean run". With a fixed fill those bytes are always the same and so is the output (1 stream of 30;
    measured with the test in tests/test_stages.py). Cost: a memset of each heap block below the mmap
    threshold when it is allocated and freed, small beside encoding it.
    """
    if "perturb" in _done or os.environ.get("MALLOC_PERTURB_"):
        return
    _mallopt(_M_PERTURB, PERTURB_BYTE)
    _done.add("perturb")


def limit_malloc_arenas(arenas: int = 2) -> None:
    """Cap glibc's malloc arenas. Every short-lived encoder thread (SVT-AV1 starts several per episode) can
    get an arena of its own; their free memory is never returned, so RSS crept up ~100 MB over a few hundred
    AV1 episodes before plateauing. Measured flat with the cap (see docs/performance.md)."""
    if "arenas" in _done or "MALLOC_ARENA_MAX" in os.environ:
        return
    _mallopt(_M_ARENA_MAX, arenas)
    _done.add("arenas")
